"""The workload's side of "the supervisor can die": stop training when it is gone.

The supervisor passes its identity in the environment (:data:`ENV_SUPERVISOR_PID`,
:data:`ENV_SUPERVISOR_STARTED`: pid and process start time). At each step boundary
:func:`check_supervisor` asks whether that process still lives; once it is gone the run
records ``supervisor_lost`` and takes the stop path of a SIGTERM: the step in flight
completes, the state is checkpointed, the process exits 143. Nobody would be left to
watch its limits, restart it or write its verdict: ``acceptrun resume`` continues it.

Cost per step: one ``getppid()`` when the supervisor is the parent (a single-process
attempt); otherwise (torchrun's ranks, whose parent is the agent) one look at the
supervisor's ``/proc`` entry at most every :data:`CHECK_EVERY_S` seconds.

The kernel's death signal (supervisor/lease.py) usually arrives first; this check is
what a rank, or a process that lost the signal (it re-parented before prctl), relies on.
"""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = [
    "CHECK_EVERY_S",
    "ENV_SUPERVISOR_PID",
    "ENV_SUPERVISOR_STARTED",
    "SupervisorCheck",
    "check_supervisor",
    "supervisor_env",
]

ENV_SUPERVISOR_PID = "ACCEPTRUN_SUPERVISOR_PID"
ENV_SUPERVISOR_STARTED = "ACCEPTRUN_SUPERVISOR_STARTED"  # psutil create_time, unix seconds
CHECK_EVERY_S = 1.0  # seconds between looks at another process's /proc entry
_START_SLACK_S = 1.0  # create_time rests on the boot time, known to the second


def supervisor_env(pid: int, started: float) -> dict[str, str]:
    """The variables that name the supervisor to its workload."""
    return {ENV_SUPERVISOR_PID: str(pid), ENV_SUPERVISOR_STARTED: f"{started:.3f}"}


class SupervisorCheck:
    """Whether the supervisor named in the environment still runs."""

    def __init__(self, pid: int, started: float | None) -> None:
        self.pid = pid
        self.started = started
        self.parent = os.getppid() == pid  # then a changed parent pid says it all
        self._next = 0.0
        self.lost_at: float | None = None

    @classmethod
    def from_env(cls, environ: Any = None) -> SupervisorCheck | None:
        env = os.environ if environ is None else environ
        try:
            pid = int(env.get(ENV_SUPERVISOR_PID) or "")
        except ValueError:
            return None  # not under a supervisor that names itself: nothing to check
        try:
            started: float | None = float(env.get(ENV_SUPERVISOR_STARTED) or "")
        except ValueError:
            started = None
        return cls(pid, started)

    def gone(self) -> bool:
        """True once the supervisor has died (then always True)."""
        if self.lost_at is not None:
            return True
        if self.parent:
            lost = os.getppid() != self.pid  # re-parented at once, even while it is a zombie
        else:
            now = time.monotonic()
            if now < self._next:
                return False
            self._next = now + CHECK_EVERY_S
            lost = not _same_process(self.pid, self.started)
        if lost:
            self.lost_at = time.time()
        return lost


def _same_process(pid: int, started: float | None) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            created = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's process cannot be ours; assume alive rather than stop
    return started is None or abs(created - started) <= _START_SLACK_S


def check_supervisor(run: Any) -> bool:
    """At a step boundary: True when the supervisor is gone (the run then stops).

    The first time, records ``supervisor_lost`` and raises the run's stop flags, so the
    loop checkpoints and exits as for SIGTERM (in a run of several processes, the ranks
    agree on the step as for any stop).
    """
    if not run.supervised or run.drill:
        return False
    if not hasattr(run, "_supervisor_check"):
        run._supervisor_check = SupervisorCheck.from_env()
    check: SupervisorCheck | None = run._supervisor_check
    if check is None or check.lost_at is not None or not check.gone():
        return check is not None and check.lost_at is not None
    run.record.event(
        "supervisor_lost",
        sync=True,
        attempt=run.attempt,
        by="workload",
        supervisor_pid=check.pid,
        **({"rank": run.rank} if getattr(run.ranks, "distributed", False) else {}),
    )
    run._stop_signal = True
    if not run.ranks.distributed:
        run._stop_requested = True  # one process: no one to agree with
    return True
