"""Idle detection: a run that holds a machine and does nothing with it.

Activity is the mean GPU utilization (%) over the workload's GPUs when GPU samples
exist, else the CPU use of the workload's process tree (% of one core). When activity
stays below ``telemetry.idle_threshold`` for ``limits.idle_window``, the detector writes
one ``idle`` event; with ``telemetry.idle_action = "stop"`` it also answers
:meth:`IdleDetector.stop_reason`, which the supervisor polls to start its graceful stop
(SIGTERM, checkpoint, grace, kill), exactly as ``acceptrun stop`` would.

Idle before the first step counts too: a run stuck in its start-up burns money as well.
The detector only sees samples: it costs nothing between ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from acceptrun.spec.model import format_duration

__all__ = ["Activity", "IdleDetector", "activity_of", "describe"]


@dataclass(frozen=True, slots=True)
class Activity:
    """What the workload did during one sample interval."""

    value: float  # % (GPU utilization, or process-tree CPU in % of one core)
    source: str  # "gpu" | "process"


def activity_of(
    host: Mapping[str, Any] | None, gpus: Sequence[Mapping[str, Any]], pids: set[int]
) -> Activity | None:
    """The activity of one tick: GPUs first, the process tree without them; None if unknown.

    The workload's GPUs are those where one of its processes holds memory; when NVML
    lists no process of ours (a container with its own pid namespace), every sampled GPU
    counts.
    """
    with_util = [g for g in gpus if isinstance(g.get("util_pct"), int | float)]
    if with_util:
        ours = [g for g in with_util if pids & {int(p) for p in (g.get("procs") or {})}]
        chosen = ours or with_util
        return Activity(sum(float(g["util_pct"]) for g in chosen) / len(chosen), "gpu")
    if host is not None and isinstance(host.get("proc_cpu_pct"), int | float):
        return Activity(float(host["proc_cpu_pct"]), "process")
    return None


class IdleDetector:
    """Tracks one attempt's idle streak; see the module docstring.

    >>> d = IdleDetector(threshold=5, window=120, action="stop", attempt=1, on_event=print)
    >>> d.observe(100.0, Activity(0.3, "process"))   # the streak starts
    """

    def __init__(
        self,
        *,
        threshold: float,
        window: float | None,
        action: str,
        attempt: int,
        on_event: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self.threshold = threshold
        self.window = window  # seconds; None: track idle time, never fire
        self.action = action  # "stop" | "event"
        self.attempt = attempt
        self.on_event = on_event
        self.since: float | None = None  # unix s when the current streak began
        self.idle_total_s = 0.0  # idle seconds in this attempt, all streaks together
        self.fired: dict[str, Any] | None = None  # the idle event of the current streak
        self._values: list[float] = []
        self._source = "process"
        self._last_t: float | None = None
        self._stop: str | None = None

    @property
    def idle_seconds(self) -> float:
        """Length of the current streak in seconds (0 when active)."""
        if self.since is None or self._last_t is None:
            return 0.0
        return max(0.0, self._last_t - self.since)

    def stop_reason(self) -> str | None:
        """Why the run must stop for idleness, once it must (action "stop"); else None."""
        return self._stop

    def observe(self, t: float, activity: Activity | None) -> None:
        """Feed one tick's activity (None: nothing measurable, the streak is unchanged)."""
        prev_t, self._last_t = self._last_t, t
        if activity is None:
            return
        if activity.value >= self.threshold:
            if self.since is not None and prev_t is not None:
                self.idle_total_s += max(0.0, prev_t - self.since)
            self.since, self.fired, self._values = None, None, []
            return
        if self.since is None:
            # A sample averages the interval before it: the streak began at the last tick.
            self.since = prev_t if prev_t is not None else t
            self._source = activity.source
        self._values.append(activity.value)
        seconds = t - self.since
        if self.window is None or self.fired is not None or seconds < self.window:
            return
        mean = sum(self._values) / len(self._values)
        self.fired = {
            "attempt": self.attempt,
            "since": round(self.since, 3),
            "seconds": round(seconds, 3),
            "activity": round(mean, 2),
            "threshold": self.threshold,
            "source": self._source,
        }
        self.on_event("idle", dict(self.fired))
        if self.action == "stop":
            self._stop = describe(self.fired)

    def total_idle_s(self) -> float:
        """Idle seconds so far in this attempt, the current streak included."""
        return self.idle_total_s + self.idle_seconds


def describe(idle: Mapping[str, Any]) -> str:
    """``idle for 2m (process CPU 0.3% < 5%)`` from an ``idle`` event's fields."""
    what = "GPU util" if idle.get("source") == "gpu" else "process CPU"
    return (
        f"idle for {format_duration(float(idle['seconds']))} "
        f"({what} {float(idle['activity']):.1f}% < {float(idle['threshold']):g}%)"
    )
