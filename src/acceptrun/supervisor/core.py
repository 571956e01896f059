"""The local supervisor: attempts of the workload, restarts, stop requests, wall time.

For each attempt it starts the workload as a :class:`ChildProcess` with the contract's
environment variables, waits for it while watching for stop requests (SIGTERM, SIGINT,
SIGUSR1 to the supervisor) and the wall-time limit, writes ``attempts/<n>/exit.json``,
and restarts a failed attempt with exponential backoff until ``limits.max_restarts``.

A stop request becomes SIGTERM to the workload's process group ("checkpoint now, then
exit"); after ``limits.grace_period`` the group is SIGKILLed. A second Ctrl-C kills at
once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.client import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    ENV_SPEC,
)
from acceptrun.spec import RunSpec, format_duration
from acceptrun.supervisor.process import ChildProcess
from acceptrun.workspace import RunRecord, now_iso, user_at_host

__all__ = ["AttemptResult", "Supervisor", "SupervisorResult"]

POLL_S = 0.1  # seconds between checks of the child; ~0.1% of a core while waiting
MAX_BACKOFF_S = 300.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "outcome": self.outcome,
            "returncode": self.returncode,
            "signal": self.signal,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_s": round(self.duration_s, 3),
            "reason": self.reason,
        }


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


class Supervisor:
    """Runs a spec's command as attempts 1..N under the spec's limits."""

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        *,
        echo: bool = True,
        say: Callable[[str], None] = lambda _msg: None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.record = record
        self.spec = spec
        self.echo = echo
        self.say = say
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._stop_reason: str | None = None
        self._kill_now = False
        self._wake = threading.Event()

    # ---- signals ------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the workload to stop gracefully (safe to call from a signal handler)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        elif reason.startswith("signal SIGINT"):
            self._kill_now = True  # a second Ctrl-C: the user means it
        self._wake.set()

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        self.request_stop(f"signal {signal.Signals(signum).name} to the supervisor")

    # ---- the attempts loop --------------------------------------------------------------------

    def run(self) -> SupervisorResult:
        result = SupervisorResult()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            # A signal the caller ignores stays ignored: `nohup acceptrun run` (SIGHUP) and
            # `acceptrun run &` from a script (SIGINT) must not stop the run.
            previous = {
                s: signal.signal(s, self._on_signal)
                for s in STOP_SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN
            }
        start = time.monotonic()
        limits = self.spec.limits
        try:
            attempt = 0
            while True:
                attempt += 1
                deadline = None if limits.wall_time is None else start + limits.wall_time
                res = self._run_attempt(attempt, deadline)
                result.attempts.append(res)
                if res.outcome in ("success", "stopped", "wall_time", "not_started"):
                    result.stop_reason = res.reason
                    break
                if self._stop_reason is not None:
                    # The stop came as the attempt ended on its own: honour it, no restart.
                    result.stop_reason = f"stopped on request ({self._stop_reason})"
                    break
                restarts = attempt - 1
                if restarts >= limits.max_restarts:
                    result.stop_reason = f"gave up after {attempt} attempt(s): limits.max_restarts = {limits.max_restarts}"
                    self.record.event(
                        "give_up", sync=True, attempt=attempt, reason=result.stop_reason
                    )
                    break
                delay = min(limits.restart_backoff * 2**restarts, MAX_BACKOFF_S)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    result.stop_reason = "wall time would pass during the restart backoff"
                    break
                self.say(f"attempt {attempt} {res.reason}; restarting in {format_duration(delay)}")
                self.record.event(
                    "restart", sync=True, attempt=attempt + 1, after=res.outcome, backoff_s=delay
                )
                # _wake is only ever set together with _stop_reason: never clear it, or a
                # stop that arrived since the attempt ended would be lost for the backoff.
                if self._wake.wait(delay):
                    result.stop_reason = f"stopped during restart backoff ({self._stop_reason})"
                    break
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return result

    @property
    def checkpoint_dir(self) -> Path:
        ck = self.spec.checkpoint.dir
        return Path(self.spec.resolve_path(ck)) if ck else self.record.checkpoints_dir

    def _resume_point(self, attempt: int) -> tuple[str, int | None]:
        """The newest checkpoint that verifies (bad ones are quarantined), or none.

        Verification re-reads every file: the cost of one read of the checkpoint per
        restart, paid before the workload starts rather than by a failed restore.
        """
        store = CheckpointStore(
            self.checkpoint_dir,
            on_event=lambda kind, fields: self._event(kind, attempt, fields),
        )
        store.remove_stale_staging()
        info = store.latest_verified()
        return ("", None) if info is None else (str(info.path), info.step)

    def _event(self, kind: str, attempt: int, fields: dict[str, Any]) -> None:
        self.record.event(kind, sync=True, attempt=attempt, **fields)

    def _env(self, attempt: int, resume_from: str = "") -> dict[str, str]:
        env = dict(self.base_env)
        env.update(self.spec.env)
        # Python buffers stdout into a pipe in 8 KiB blocks; unbuffered keeps logs live.
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[ENV_RUN_DIR] = str(self.record.path)
        env[ENV_RUN_ID] = self.record.run_id
        env[ENV_ATTEMPT] = str(attempt)
        env[ENV_RESUME_FROM] = resume_from
        env[ENV_CHECKPOINT_DIR] = str(self.checkpoint_dir)
        env[ENV_SPEC] = str(self.record.spec_path)
        return env

    def _run_attempt(self, attempt: int, deadline: float | None) -> AttemptResult:
        adir = self.record.attempt_dir(attempt)
        adir.mkdir(parents=True, exist_ok=True)
        resume_from, resume_step = self._resume_point(attempt)
        child = ChildProcess(
            self.spec.command,
            cwd=self.spec.workdir_path,
            env=self._env(attempt, resume_from),
            stdout_path=adir / "stdout.log",
            stderr_path=adir / "stderr.log",
            echo=self.echo,
        )
        self.record.update_state(
            status="running",
            attempts=attempt,
            supervisor=user_at_host(),
            supervisor_pid=os.getpid(),
        )
        try:
            child.start()
        except OSError as exc:
            reason = f"could not start {self.spec.command[0]!r}: {exc.strerror or exc}"
            stamp = now_iso()
            res = AttemptResult(attempt, "not_started", None, None, stamp, stamp, 0.0, reason)
            self._record_exit(adir, res)
            return res
        self.record.event(
            "attempt_start",
            sync=True,
            attempt=attempt,
            pid=child.pid,
            command=self.spec.command,
            resume_step=resume_step,
        )
        resumed = "" if resume_step is None else f", resuming after step {resume_step}"
        self.say(f"attempt {attempt} started (pid {child.pid}{resumed})")
        stop_sent_at: float | None = None
        cause: str | None = None
        returncode: int | None = None
        while returncode is None:
            returncode = child.wait(POLL_S)
            if returncode is not None:
                break
            now = time.monotonic()
            if cause is None and self._stop_reason is not None:
                cause = "stopped"
            if cause is None and deadline is not None and now >= deadline:
                cause = "wall_time"
                self._stop_reason = (
                    f"wall time {format_duration(self.spec.limits.wall_time)} reached"
                )
            if cause is not None and stop_sent_at is None:
                stop_sent_at = now
                self.record.event(
                    "stop_sent",
                    sync=True,
                    attempt=attempt,
                    signal="SIGTERM",
                    reason=self._stop_reason,
                )
                self.say(
                    f"{self._stop_reason}: asking the workload to stop (grace {format_duration(self.spec.limits.grace_period)})"
                )
                child.signal_group(signal.SIGTERM)
            if stop_sent_at is not None and (
                self._kill_now or now - stop_sent_at >= self.spec.limits.grace_period
            ):
                self.record.event(
                    "kill_sent",
                    sync=True,
                    attempt=attempt,
                    signal="SIGKILL",
                    after_s=round(now - stop_sent_at, 3),
                )
                child.signal_group(signal.SIGKILL)
                self._kill_now = False
                stop_sent_at = float("inf")  # killed: wait for the exit only
        child.finish()
        res = self._classify(attempt, child, returncode, cause)
        self._record_exit(adir, res)
        return res

    def _classify(
        self, attempt: int, child: ChildProcess, rc: int, cause: str | None
    ) -> AttemptResult:
        sig = _signal_name(-rc) if rc < 0 else None
        if cause == "wall_time":
            outcome, reason = (
                "wall_time",
                f"stopped at the wall-time limit ({format_duration(self.spec.limits.wall_time)})",
            )
        elif cause == "stopped":
            outcome, reason = "stopped", f"stopped on request ({self._stop_reason})"
        elif rc == 0:
            outcome, reason = "success", "exited 0"
        elif sig is not None:
            outcome, reason = "signaled", f"killed by {sig}"
        else:
            outcome, reason = "failed", f"exited {rc}"
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

    def _record_exit(self, adir: Any, res: AttemptResult) -> None:
        self.record.write_json(f"attempts/{res.attempt}/exit.json", res.to_dict())
        self.record.event("attempt_exit", sync=True, **res.to_dict())


def _signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; real-time signals (``SIGRTMIN+1``) have no Signals member."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
