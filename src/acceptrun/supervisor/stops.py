"""Why the supervisor ends an attempt it did not see end by itself: one object per cause.

Each poll of a running attempt (every :data:`~acceptrun.supervisor.core.POLL_S` seconds)
asks the attempt's causes in order, first to last; the first that answers with a
:class:`Stop` decides how the attempt ends, and the later ones are not asked again
(except those with ``after_stop``, such as injected time faults, which are outside
events rather than reasons to stop). A graceful stop sends SIGTERM ("checkpoint now,
then exit") and SIGKILLs after ``limits.grace_period``; a stop that is not graceful (a
hang: a stuck main thread never runs a signal handler) collects stacks and SIGKILLs.

The causes, in the order the supervisor asks them:

=================  ==============  =========  =================================================
cause              outcome         graceful   when
=================  ==============  =========  =================================================
:class:`ServingDone` ``serving``   yes        a serving run's load finished (spec.serving)
:class:`UserStop`  ``stopped``     yes        a signal to the supervisor, ``acceptrun stop``
:class:`Notice`    ``stopped``     yes        the cloud's preemption notice (supervisor/notice.py)
:class:`Budget`    ``budget``      yes        the bill at the end of the grace period would pass ``limits.budget_usd``
:class:`WallTime`  ``wall_time``   yes        ``limits.wall_time`` since the launch
:class:`Idle`      ``idle``        yes        the devices sat idle (``telemetry.idle_*``)
:class:`TimedFaults` (none)        (none)     an injected ``kill@time=30s`` is due (never a stop)
:class:`Hang`      ``hang`` /      no         no progress for ``limits.hang_window``, or the
                   ``data_stall``             process outlived its ``workload_end`` by ``limits.grace_period``
=================  ==============  =========  =================================================

To add a cause: write a class with ``name``, ``outcome``, ``graceful``, ``after_stop`` and
``check(now, state)``, and add it where :meth:`~acceptrun.supervisor.core.Supervisor._stop_causes`
builds the list (docs/architecture.md, "How to add a stop cause").

>>> cause = WallTime(deadline=100.0, wall_time=3600.0)
>>> cause.check(99.0, PollState(attempt=1, elapsed=99.0)) is None
True
>>> stop = cause.check(100.0, PollState(attempt=1, elapsed=100.0))
>>> stop.cause, stop.outcome, stop.graceful, stop.reason
('wall_time', 'wall_time', True, 'wall time 1h00m reached')
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from acceptrun.spec.model import format_duration

if TYPE_CHECKING:
    from acceptrun.supervisor.watch import AttemptWatch
    from acceptrun.telemetry.idle import IdleDetector

__all__ = [
    "Budget",
    "Hang",
    "Idle",
    "Notice",
    "PollState",
    "ServingDone",
    "Stop",
    "StopCause",
    "TimedFaults",
    "UserStop",
    "WallTime",
]


@dataclass(slots=True)
class PollState:
    """What a cause may look at in one poll of a running attempt."""

    attempt: int
    """The attempt's number (1 for the first launch)."""
    elapsed: float
    """Seconds since the attempt's process started."""
    stop: Stop | None = None
    """The stop already taken in this attempt, if any."""
    injected: str | None = None
    """The injected time fault fired in this attempt, e.g. ``kill@time=3s``."""


@dataclass(slots=True, frozen=True)
class Stop:
    """A cause's decision to end the attempt."""

    cause: str
    """What the supervisor records as the stop cause (exit.json, classify's evidence)."""
    outcome: str
    """The attempt's outcome in exit.json (``stopped``, ``wall_time``, ``hang`` ...)."""
    summary: str
    """The attempt's reason in exit.json ("stopped at the wall-time limit (1h00m)")."""
    graceful: bool = True
    """SIGTERM, then SIGKILL after the grace period; False: stacks, then SIGKILL now."""
    reason: str | None = None
    """The supervisor's stop reason (stop_sent event, messages); None keeps the current one."""
    evidence: str | None = None
    """A line put first in the failure's evidence (what a hang detector saw)."""
    event: tuple[str, dict[str, Any]] | None = None
    """An event to record when the stop is taken: (kind, fields)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """What the cause measured, for the accounting (an idle stop's streak: ``since``)."""


class StopCause(Protocol):
    """One reason to end a running attempt; asked once per poll."""

    name: ClassVar[str]
    """The cause's name: ``user``, ``wall_time``, ``hang`` ..."""
    outcome: ClassVar[str | None]
    """The attempt outcome its stop produces (None: it never stops the attempt)."""
    graceful: ClassVar[bool]
    """Whether its stop asks the workload to checkpoint and exit (SIGTERM)."""
    after_stop: ClassVar[bool]
    """Still asked once another cause stopped the attempt (outside events, not stops)."""

    def check(self, now: float, state: PollState) -> Stop | None:
        """A :class:`Stop` when the attempt must end now (``now``: monotonic seconds)."""
        ...


class ServingDone:
    """A serving run's load is done (or could not run): stop the server."""

    name: ClassVar[str] = "serving"
    outcome: ClassVar[str | None] = "serving"  # ServingDriver.settle names the final one
    graceful: ClassVar[bool] = True
    after_stop: ClassVar[bool] = False

    def __init__(self, finished: threading.Event, reason: Callable[[], str]) -> None:
        # serving.driver.ServingDriver's: set when the load is done; what it served
        self.finished = finished
        self.reason = reason

    def check(self, now: float, state: PollState) -> Stop | None:
        if not self.finished.is_set():
            return None
        reason = self.reason()
        return Stop(self.name, "serving", f"stopped after the load ({reason})", reason=reason)


class UserStop:
    """A stop request: a signal to the supervisor, ``acceptrun stop|kill``, Slurm's notice."""

    name: ClassVar[str] = "user"
    outcome: ClassVar[str | None] = "stopped"
    graceful: ClassVar[bool] = True
    after_stop: ClassVar[bool] = False

    def __init__(self, requested: Callable[[], str | None]) -> None:
        self.requested = requested  # the supervisor's stop reason, None until asked

    def check(self, now: float, state: PollState) -> Stop | None:
        reason = self.requested()
        if reason is None:
            return None
        return Stop(self.name, "stopped", f"stopped on request ({reason})")


class Notice:
    """``limits.preemption_notice``: the machine is being taken back; save and stop now.

    No restart follows on this machine (class ``preempted``, supervision ends): the run is
    continued elsewhere by ``acceptrun resume``, from the mirror.
    """

    name: ClassVar[str] = "notice"
    outcome: ClassVar[str | None] = "stopped"
    graceful: ClassVar[bool] = True
    after_stop: ClassVar[bool] = False

    def __init__(self, notice: Callable[[], Any]) -> None:
        self.notice = notice  # NoticeWatch.notice: None until the notice came

    def check(self, now: float, state: PollState) -> Stop | None:
        notice = self.notice()
        if notice is None:
            return None
        reason = f"preemption notice from {notice.provider} ({notice.action})"
        return Stop(self.name, "stopped", f"stopped on the {reason}", reason=reason)


class Budget:
    """``limits.budget_usd``: stop while the checkpoint-then-exit still fits in the budget."""

    name: ClassVar[str] = "budget"
    outcome: ClassVar[str | None] = "budget"
    graceful: ClassVar[bool] = True
    after_stop: ClassVar[bool] = False

    def __init__(self, exhausted: Callable[[int], str | None]) -> None:
        # Supervisor._budget_exhausted: the reason when the stop must start now (it
        # records budget_warning and budget_stop itself), else None.
        self.exhausted = exhausted

    def check(self, now: float, state: PollState) -> Stop | None:
        reason = self.exhausted(state.attempt)
        if reason is None:
            return None
        return Stop(self.name, "budget", f"stopped before the budget ran out ({reason})")


class WallTime:
    """``limits.wall_time``: the time since the launch (all attempts) has run out."""

    name: ClassVar[str] = "wall_time"
    outcome: ClassVar[str | None] = "wall_time"
    graceful: ClassVar[bool] = True
    after_stop: ClassVar[bool] = False

    def __init__(self, deadline: float | None, wall_time: float | None) -> None:
        self.deadline = deadline  # monotonic seconds; None: no limit
        self.wall_time = wall_time  # seconds, the spec's limit (for the messages)

    def check(self, now: float, state: PollState) -> Stop | None:
        if self.deadline is None or now < self.deadline:
            return None
        limit = format_duration(self.wall_time)
        return Stop(
            self.name, "wall_time", f"stopped at the wall-time limit ({limit})",
            reason=f"wall time {limit} reached",
        )  # fmt: skip


class Idle:
    """The devices sat idle for ``telemetry.idle_after`` (acceptrun.telemetry.idle)."""

    name: ClassVar[str] = "idle"
    outcome: ClassVar[str | None] = "idle"
    graceful: ClassVar[bool] = True
    after_stop: ClassVar[bool] = False

    def __init__(self, detector: IdleDetector) -> None:
        self.detector = detector  # the attempt's, fed by the telemetry sampler's thread

    def check(self, now: float, state: PollState) -> Stop | None:
        idle = self.detector.stop_reason()  # e.g. "idle for 2m00s (process CPU 0.3% < 5%)"
        if idle is None:
            return None
        streak = dict(self.detector.fired or {})
        return Stop(
            self.name, "idle", f"stopped: {idle}", reason=idle,
            event=("idle_stop", {**streak, "reason": idle}), detail=streak,
        )  # fmt: skip


class TimedFaults:
    """Injected faults with a time (``kill@time=30s``), fired by the supervisor itself.

    An outside event, not a stop request: it never stops the attempt itself, and it is
    asked even after another cause did.
    """

    name: ClassVar[str] = "timed_fault"
    outcome: ClassVar[str | None] = None
    graceful: ClassVar[bool] = False
    after_stop: ClassVar[bool] = True

    def __init__(self, faults: list[Any], fire: Callable[[Any], None]) -> None:
        self.faults = list(faults)  # workload.inject.Fault with after_s, action, attempt
        self.fire = fire  # records fault_injected and sends the fault's signal

    def check(self, now: float, state: PollState) -> Stop | None:
        for fault in [f for f in self.faults if state.elapsed >= f.after_s]:
            self.faults.remove(fault)
            state.injected = str(fault).removesuffix(f":attempt={fault.attempt}")
            self.fire(fault)
        return None


class Hang:
    """No progress for ``limits.hang_window``: a hang, or a data stall (the loader's wait).

    Once the workload said it ended (rank 0's ``workload_end``), no step is due: the hang
    clock stops and the process gets ``limits.grace_period`` to exit (the interpreter's
    teardown; torch's takes seconds on a busy machine). A process still there after that
    is stuck in its exit (a non-daemon thread, an atexit handler): a hang, said so.

    >>> from pathlib import Path
    >>> from acceptrun.supervisor.watch import AttemptWatch
    >>> watch = AttemptWatch(Path("events.jsonl"), 1, (), pid=0, client=True, ended_t=10.0)
    >>> watch.end_status = "ok"
    >>> cause = Hang(watch, window=2.0, grace=30.0)
    >>> cause.check(39.0, PollState(attempt=1, elapsed=39.0)) is None
    True
    >>> cause.check(40.0, PollState(attempt=1, elapsed=40.0)).evidence
    'the workload ended (workload_end, status ok) 30s ago; its process did not exit within limits.grace_period (30s)'
    """

    name: ClassVar[str] = "hang"
    outcome: ClassVar[str | None] = "hang"  # or data_stall, as the watch tells them apart
    graceful: ClassVar[bool] = False
    after_stop: ClassVar[bool] = False

    def __init__(self, watch: AttemptWatch, window: float, grace: float) -> None:
        self.watch = watch
        self.window = window  # seconds without progress: limits.hang_window
        self.grace = grace  # seconds to exit after workload_end: limits.grace_period

    def check(self, now: float, state: PollState) -> Stop | None:
        if self.watch.ended_t is not None:
            return self._exit_overdue(now, self.watch.ended_t)
        stall = self.watch.stalled(self.window)
        if not stall:
            return None
        summary = f"killed after no progress for {format_duration(self.window)}"
        return Stop(
            stall.kind, stall.kind, f"{summary} ({stall.kind.replace('_', ' ')})",
            graceful=False, evidence=stall.evidence,
        )  # fmt: skip

    def _exit_overdue(self, now: float, ended_t: float) -> Stop | None:
        """The workload ended ``now - ended_t`` seconds ago: a Stop once its exit is overdue."""
        waited = now - ended_t
        if waited < self.grace:
            return None
        grace = format_duration(self.grace)
        evidence = (
            f"the workload ended (workload_end, status {self.watch.end_status}) {waited:.0f}s"
            f" ago; its process did not exit within limits.grace_period ({grace})"
        )
        summary = f"killed: its process did not exit within {grace} after the workload ended"
        return Stop(self.name, "hang", f"{summary} (hang)", graceful=False, evidence=evidence)
