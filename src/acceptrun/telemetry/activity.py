"""When a workload was working, from its telemetry samples: the clock of a black box.

A script without the client API and without a progress source writes no step events, so
its record cannot say when training started or how long it ran. Its telemetry can: each
host sample holds the CPU use of the workload's process tree over the interval that ended
at it (``proc_cpu_pct``, % of one core), each GPU sample its utilization. An interval is
*active* when that figure is at or above ``telemetry.idle_threshold`` (GPU utilization
when GPU samples exist, else the process tree's CPU, as the idle detector decides).

:func:`activity` gives, for one stretch of time, when the first active interval began
and how many seconds were active. The time split (``telemetry/summary.py``) and the cost
ledger (``cost/ledger.py``) book a black box's active seconds as compute, its start-up
up to the first active interval as "before first step", and the rest as neither.

Standard library only: the cost ledger reads it, below the telemetry package.

>>> activity(samples, start=t0, end=t1, threshold=5.0)
Activity(first_active=t0 + 3.1, active_s=118.0, source='process')
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from acceptrun._util.units import finite_number as _num

__all__ = ["Activity", "activity"]


@dataclass(frozen=True, slots=True)
class Activity:
    """Activity inside one stretch of time (unix seconds)."""

    first_active: float | None  # start of the first active interval; None: never active
    active_s: float  # seconds of active intervals
    source: str  # "gpu" | "process"


def _series(samples: Iterable[dict[str, Any]]) -> tuple[list[tuple[float, float]], str] | None:
    """(t, activity %) in time order: GPU utilization (mean over GPUs per tick), else CPU."""
    gpu: dict[float, list[float]] = defaultdict(list)
    cpu: list[tuple[float, float]] = []
    for s in samples:
        t = _num(s.get("t"))
        if t is None:
            continue
        if s.get("kind") == "gpu" and (u := _num(s.get("util_pct"))) is not None:
            gpu[round(t, 1)].append(u)  # one tick's GPUs are sampled within milliseconds
        elif s.get("kind") == "host" and (c := _num(s.get("proc_cpu_pct"))) is not None:
            cpu.append((t, c))
    if gpu:
        return sorted((t, sum(us) / len(us)) for t, us in gpu.items()), "gpu"
    if cpu:
        return sorted(cpu), "process"
    return None


def activity(
    samples: Iterable[dict[str, Any]], *, start: float, end: float, threshold: float
) -> Activity | None:
    """Activity between ``start`` and ``end``; None when no sample falls in that stretch.

    Each sample covers the interval since the previous one (the first: since ``start``).
    """
    found = _series(samples)
    if found is None:
        return None
    series, source = found
    inside = [(t, v) for t, v in series if start < t <= end]
    if not inside:
        return None
    first: float | None = None
    active = 0.0
    prev = start
    for t, value in inside:
        if value >= threshold:
            first = prev if first is None else first
            active += t - prev
        prev = t
    if inside[-1][1] >= threshold:
        active += max(0.0, end - prev)  # working when last sampled: until the stretch ends
    return Activity(first, active, source)
