"""Whether a failed attempt is worth a restart, and from which checkpoint.

Transient classes restart from the newest verified checkpoint (supervisor/core.py sets the
backoff and counts ``limits.max_restarts``); a class that would fail the same way is not
retried; the same traceback at the same step twice in a row is a user error
(classify.repeated_failure); a class that recurs from the same checkpoint is retried only
as often as classify.retry_allowed says (OOMs once). A divergence stops the run, or with
``limits.on_divergence = "rollback"`` quarantines the newest checkpoint so that the
restart resumes from the one before.
"""

from __future__ import annotations

from collections.abc import Callable

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord, now_iso
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.classify import (
    Classification,
    FailedAttempt,
    repeated_failure,
    retry_allowed,
    stderr_tail,
)
from acceptrun.supervisor.outcome import AttemptResult

__all__ = ["NO_BACKOFF", "RestartPolicy", "Reverify"]

Reverify = Callable[[int], Classification | None]
"""Before attempt N (N > 1): None, or why it must not start (capture/reverify.py: the data
or the packages preflight verified changed since). Handed down by the launcher, since the
supervisor sits below capture."""

# Failure classes restarted without the backoff: the machine is sound, nothing to wait out
# (a preemption's machine came back; a hang was the workload's). "killed" keeps it: the
# class also holds SIGSEGV, SIGBUS and SIGABRT, where a driver or a device may need time.
NO_BACKOFF = frozenset({"preempted", "hang"})


class RestartPolicy:
    """The restart decisions of one supervisor; ``open_store(attempt)`` opens the run's store
    with that attempt's events."""

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        open_store: Callable[[int], CheckpointStore],
        reverify: Reverify | None = None,
    ) -> None:
        self.record = record
        self.spec = spec
        self.open_store = open_store
        self.reverify = reverify

    def refused(self, attempt: int) -> AttemptResult | None:
        """Before a restarted or resumed attempt: its exit, recorded, when what preflight
        verified changed since (the attempt is then not started and the run stops: a restart
        would train on other data or code than the record says); else None."""
        if self.reverify is None or attempt < 2:
            return None
        try:
            why = self.reverify(attempt)
        except Exception as exc:  # recorded: a check that broke is named, never a change
            self.record.event("best_effort_failed", sync=True, component="reverify",
                              attempt=attempt, error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            return None
        if why is None:
            return None
        stamp = now_iso()
        res = AttemptResult(attempt, "not_started", None, None, stamp, stamp, 0.0,
                            f"not started: {why.reason}", failure=why)  # fmt: skip
        res.decision = "stop: not restarted, what preflight verified changed since"
        self.record.write_json(f"attempts/{attempt}/exit.json", res.to_dict())
        self.record.event("attempt_exit", sync=True, **res.to_dict())
        self.record.event("give_up", sync=True, attempt=attempt, reason=res.reason)
        return res

    def why_not(self, res: AttemptResult, attempts: list[AttemptResult]) -> str | None:
        """None when the failure is worth a restart; else the reason to stop (for the report)."""
        failure = res.failure
        if failure is None:
            return None
        if failure.name == "diverged":
            if self.spec.limits.on_divergence != "rollback":
                return f'diverged ({failure.reason}); not retried: limits.on_divergence = "stop"'
            return self._rollback(res)
        if not failure.retry:
            return f"{failure.name} ({failure.reason}); not retried: it would fail the same way"
        if (repeated := self._repeated(res, attempts)) is not None:
            res.failure = repeated  # exit.json says user_error, with both tracebacks
            return f"user_error ({repeated.reason}); not retried"
        same = sum(1 for a in attempts[:-1] if a.failure_class == failure.name)
        if not retry_allowed(failure.name, same):
            return f"{failure.name} again after {same} retry; not retried: it recurs from the same checkpoint"
        return None

    def backoff(self, res: AttemptResult, restarts: int, most: float) -> float:
        """Seconds to wait before the restart after ``res`` (``restarts`` before it).

        ``limits.restart_backoff``, doubled per restart up to ``most``, for the classes
        where waiting can help: a failure of the machine, the network, a peer or memory
        that another process may give back, a signal that may be a driver's or a
        device's. A preempted or hung attempt has nothing to wait for: the next attempt
        starts at once.
        """
        if res.failure_class in NO_BACKOFF:
            return 0.0
        return float(min(self.spec.limits.restart_backoff * 2**restarts, most))

    def _repeated(self, res: AttemptResult, attempts: list[AttemptResult]) -> Classification | None:
        """A user error when ``res`` failed as the attempt just before it did."""
        if len(attempts) < 2 or res.failure_class != "failed":
            return None
        before = attempts[-2]
        if before.failure_class != "failed" or before.attempt != res.attempt - 1:
            return None
        return repeated_failure(self._failed(before), self._failed(res))

    def _failed(self, a: AttemptResult) -> FailedAttempt:
        last, resumed = a.work.get("last_step"), a.work.get("resumed_from")
        done = last if last is not None else resumed
        return FailedAttempt(
            attempt=a.attempt,
            stderr_tail=stderr_tail(self.record.attempt_dir(a.attempt) / "stderr.log"),
            step=0 if done is None else int(done) + 1,
            stepped=last is not None,
        )

    def _rollback(self, res: AttemptResult) -> str | None:
        """Quarantine the newest checkpoint so the restart resumes from the one before."""
        store = self.open_store(res.attempt)
        latest = store.latest()
        if latest is None or len(store.list()) < 2:
            return "diverged, and there is no earlier checkpoint to roll back to"
        store.quarantine(latest.path, f"rollback after divergence in attempt {res.attempt}")
        self.record.event("rollback", sync=True, attempt=res.attempt, quarantined_step=latest.step)
        return None
