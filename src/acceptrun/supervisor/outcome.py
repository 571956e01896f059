"""How an attempt ended: its exit.json record, its mechanical outcome, the work it lost.

:func:`attempt_result` says how the process ended (exit status, signal, or the stop cause
that ended it, :mod:`acceptrun.supervisor.stops`); the failure class is classify()'s.
:func:`attempt_work` counts the work done and lost, what the cost ledger and the report
read.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.record.models import stamp
from acceptrun.record.workspace import now_iso
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.classify import Classification
from acceptrun.supervisor.process import ChildProcess
from acceptrun.supervisor.stops import Stop
from acceptrun.supervisor.watch import AttemptWatch

__all__ = ["AttemptResult", "SupervisorResult", "attempt_result", "attempt_work", "signal_name"]


@dataclass(slots=True)
class AttemptResult:
    """How one attempt ended (the contents of its exit.json)."""

    attempt: int
    outcome: str  # success | failed | signaled | stopped | wall_time | not_started
    returncode: int | None
    signal: str | None
    started_at: str
    ended_at: str
    duration_s: float
    reason: str
    failure: Classification | None = None
    work: dict[str, Any] = field(default_factory=dict)
    decision: str | None = None

    @property
    def failure_class(self) -> str:
        return self.failure.name if self.failure else self.outcome

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **stamp(),
            "attempt": self.attempt,
            "outcome": self.outcome,
            "returncode": self.returncode,
            "signal": self.signal,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_s": round(self.duration_s, 3),
            "reason": self.reason,
            "work": self.work,
            "decision": self.decision,
        }
        if self.failure is not None:
            out["class"] = self.failure.name
            out["class_reason"] = self.failure.reason
            out["evidence"] = self.failure.evidence
        return out


@dataclass(slots=True)
class SupervisorResult:
    """All attempts and why supervision ended."""

    attempts: list[AttemptResult] = field(default_factory=list)
    stop_reason: str | None = None

    @property
    def last(self) -> AttemptResult | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def succeeded(self) -> bool:
        return self.last is not None and self.last.outcome == "success"


def attempt_result(
    attempt: int,
    child: ChildProcess,
    rc: int,
    stop: Stop | None,
    *,
    injected: str | None = None,
) -> AttemptResult:
    """How the attempt ended mechanically (the failure class comes from classify())."""
    sig = signal_name(-rc) if rc < 0 else None
    if stop is not None:
        outcome, reason = stop.outcome, stop.summary
    elif rc == 0:
        outcome, reason = "success", "exited 0"
    elif sig is not None:
        outcome, reason = "signaled", f"killed by {sig}"
    else:
        outcome, reason = "failed", f"exited {rc}"
    if injected is not None and stop is None and rc != 0:
        verb = "killed" if injected.startswith("kill") else "stopped"
        reason = f"{verb} by an injected fault {injected} ({reason})"
    return AttemptResult(
        attempt=attempt,
        outcome=outcome,
        returncode=rc if rc >= 0 else None,
        signal=sig,
        started_at=now_iso(child.started_at),
        ended_at=now_iso(),
        duration_s=child.duration,
        reason=reason,
    )


def attempt_work(
    spec: RunSpec,
    checkpoint_dir: Path,
    watch: AttemptWatch,
    child: ChildProcess,
    resume_step: int | None,
    res: AttemptResult,
    stop: Stop | None = None,
    unknown_after: int | None = None,
) -> dict[str, Any]:
    """Work done and lost by an attempt: what the cost ledger and the report count.

    Lost = the steps after the newest checkpoint at the time it ended (a restart redoes
    them) and the wall time since that checkpoint's step; device-seconds are that
    time the run's GPUs (or one CPU device per node) sat on work thrown away, and
    node-seconds that time times the run's nodes. Counted from a watched checkpoint whose
    step is an estimate (never later than the state it holds: supervisor/external.py),
    the lost steps are at most that many (``lost_at_most``). ``steps_lost_range`` is
    the range record/lost.py prints: exact, bounded, or unknown, never an unknown as zero.
    ``unknown_after``: the step after which the script's progress could not be read (its
    step lines could not be ordered: supervisor/counter.py); the steps lost have no upper
    bound then, and the work says from which step (``steps_unknown_after``).
    """
    store = CheckpointStore(checkpoint_dir)
    latest = store.latest()
    kept = latest.step if latest is not None else None
    last = watch.last_step
    ended = time.time()
    work: dict[str, Any] = {
        "resumed_from": resume_step,
        "steps_done": watch.steps,
        "first_step": watch.first_step,
        "last_step": last,
        "checkpoint_after": kept,
        "startup_s": None,
    }
    first_t = watch.first_step_t
    if first_t is not None:
        work["startup_s"] = round(first_t - child.started_at, 3)
    failed = res.outcome != "success"
    lost_steps, lost_s = 0, 0.0
    if failed:
        lost_steps, lost_s = _lost_since_checkpoint(work, watch, child, latest, ended)
    # The range of steps lost (record/lost.py): the counted figure, plus the
    # steps that may have run unseen after the last one logged (progress seen every N
    # steps: up to N - 1); unknown when nothing said where a script without the client
    # was; from 0 when the checkpoint's step is an estimate.
    high: int | None = lost_steps
    if failed and last is not None:
        high = lost_steps + _stride(watch.events_path.parent, watch.attempt) - 1
    elif failed and not watch.client:
        high = None
    low = 0 if work.get("lost_at_most") else lost_steps
    if unknown_after is not None:
        work["steps_unknown_after"] = unknown_after
        high = None if failed else high
    if spec.inference.enabled and res.outcome != "success":
        # A batch inference run keeps every committed shard (its step events are
        # shards): only the shards in flight, the time since the last commit, are lost.
        commits = [e.get("t") for e in watch.events if e.get("kind") == "shard_commit"]
        since = commits[-1] if commits else None
        lost_steps = low = high = 0
        lost_s = ended - (since if isinstance(since, int | float) else child.started_at)
    idle_since = None if stop is None else stop.detail.get("since")
    if res.outcome == "idle" and idle_since is not None:
        # The idle streak at the end is idle time (the ledger's), not work thrown away.
        lost_s = max(0.0, lost_s - (ended - float(idle_since)))
    # Every node of a multi-node run sat on the lost work: node-seconds, and device-seconds
    # for all of its GPUs (or one CPU device per node).
    nodes = max(spec.resources.nodes, 1)
    devices = max(spec.resources.gpus, 1) * nodes
    work.update(
        steps_lost=lost_steps,
        steps_lost_range=[low, high],
        seconds_lost=round(lost_s, 3),
        device_seconds_lost=round(lost_s * devices, 3),
        node_seconds_lost=round(lost_s * nodes, 3),
    )
    return work


def _lost_since_checkpoint(
    work: dict[str, Any],
    watch: AttemptWatch,
    child: ChildProcess,
    latest: CheckpointInfo | None,
    ended: float,
) -> tuple[int, float]:
    """A failed attempt's steps and seconds lost after its newest checkpoint (``latest``);
    marks ``work`` where either is only an upper bound."""
    last, kept = watch.last_step, None if latest is None else latest.step
    if last is None:
        return 0, ended - child.started_at  # died before its first step: all of it
    if kept is None or kept < (watch.first_step or 0):
        # Every step since the attempt began is redone: those its lines count, and at
        # least those up to its last step from where it started (a line every N steps
        # counts its first line as one step, though N ran before it).
        return max(watch.steps, last - (work["resumed_from"] or 0)), ended - child.started_at
    lost_steps = max(0, last - kept)
    dated = latest.meta.get("dated") if latest is not None else None
    if lost_steps and isinstance(dated, dict) and dated.get("estimate"):
        work["lost_at_most"] = True
    t_kept = watch.step_t(kept)  # read back from the step log: no step is kept
    if not isinstance(t_kept, int | float):
        # The checkpoint's step is not one this attempt logged (a counter that went back,
        # progress seen every N steps): timed from the attempt's start, an upper bound,
        # and said to be one.
        t_kept = child.started_at
        work["seconds_lost_at_most"] = True
    return lost_steps, ended - t_kept


def _stride(run_dir: Path, attempt: int) -> int:
    """The widest gap between two steps this attempt logged one after the other (1: it
    logged every step; 500: a progress line or a scalar every 500). A counter that went
    back (a restart the step axis did not explain) is no gap."""
    import numpy as np

    from acceptrun.record.steplog import StepLog

    widest, prev = 1, None
    for chunk in StepLog(run_dir).chunks(1 << 16, attempt=attempt):
        steps = chunk.step.astype(np.int64)
        if prev is not None:
            steps = np.concatenate(([prev], steps))
        if steps.size > 1:
            widest = max(widest, int(np.diff(steps).max()))
        prev = int(steps[-1]) if steps.size else prev
    return widest


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; real-time signals (``SIGRTMIN+1``) have no Signals member."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
