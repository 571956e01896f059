"""Which queued jobs start now, on which devices, and which running jobs make room.

A pure function of the queue and the clock (:func:`plan`), so it is tested and
benchmarked without processes. The rules, in order:

1. **Order**: highest priority first, FIFO (submission time) within a priority. A
   preempted job keeps its place: it was submitted when it was submitted.
2. **Start what fits**: walking that order, each job that fits in the free devices starts.
3. **Backfill, then reserve** (EASY backfill): the first job that does not fit blocks
   nothing at first: smaller jobs behind it start in the free devices. Once it has
   waited ``reserve_after`` seconds it gets a *reservation*: the time (the *shadow*)
   at which enough devices free up for it, from the running jobs' expected ends
   (``started + limits.expected_runtime`` max; unknown: never). From then on a job
   behind it starts only if it is expected to end before the shadow, or if it fits in
   the devices the reserved job will not need at the shadow (the *extra*). A job of
   unknown runtime therefore only takes extra devices: it can never delay the
   reserved job.
4. **Preempt**: a job that has waited ``preempt_after`` seconds and still does not fit
   may stop running jobs of *lower* priority (lowest priority first, then the most
   recently started: the least work lost), only as many as it needs and only when
   that makes it fit. It holds a reservation while they checkpoint and exit, so
   backfill cannot take the devices they free.

Expected runtimes are a promise the spec makes; a job running past its expected end is
treated as ending now (the shadow is "now" while it runs), which only makes backfill
more careful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = ["Active", "Pending", "Plan", "Policy", "plan"]


@dataclass(frozen=True, slots=True)
class Pending:
    """A queued job, as the scheduler sees it."""

    id: int
    priority: int
    slots: int
    submitted_at: float  # unix seconds: FIFO order
    queued_at: float  # unix seconds: when it last entered the queue (waits count from it)
    expected_s: float | None = None  # limits.expected_runtime max; None: unknown


@dataclass(frozen=True, slots=True)
class Active:
    """A job running on (some of) the devices."""

    id: int
    priority: int
    devices: tuple[int, ...]
    started_at: float  # unix seconds
    expected_s: float | None = None
    stopping: bool = False  # a preemption or cancel is on its way: it frees its devices soon

    @property
    def slots(self) -> int:
        return len(self.devices)

    def expected_end(self, now: float) -> float:
        if self.stopping:
            return now
        if self.expected_s is None:
            return math.inf
        return max(now, self.started_at + self.expected_s)


@dataclass(frozen=True, slots=True)
class Policy:
    """When a blocked job reserves devices and when it preempts lower-priority work."""

    reserve_after: float = 60.0  # seconds a blocked job waits before backfill must not delay it
    preempt_after: float | None = None  # seconds before it may preempt; None: never


@dataclass(slots=True)
class Plan:
    """What to do now."""

    start: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (job, devices)
    preempt: list[tuple[int, int]] = field(default_factory=list)  # (victim, for job)
    reserved: int | None = None  # the job holding the reservation, if any
    shadow: float | None = None  # when it is expected to fit (unix s; inf: unknown)


def plan(
    pending: Sequence[Pending],
    active: Sequence[Active],
    devices: Sequence[int],
    now: float,
    policy: Policy | None = None,
) -> Plan:
    """Decide starts and preemptions for one worker's ``devices``.

    >>> plan([Pending(1, 0, 2, 0.0, 0.0)], [], [0, 1, 2, 3], now=5.0).start
    [(1, (0, 1))]
    """
    policy = policy or Policy()
    used = {d for a in active for d in a.devices}
    free = [d for d in sorted(devices) if d not in used]
    running = list(active)
    out = Plan()
    shadow = extra = 0.0
    order = sorted(pending, key=lambda p: (-p.priority, p.submitted_at, p.id))
    for job in order:
        if job.slots > len(devices):
            continue  # never fits on this worker: another (larger) one must take it
        if out.reserved is None:
            if job.slots <= len(free):
                out.start.append((job.id, _take(free, job.slots)))
                running.append(Active(job.id, job.priority, out.start[-1][1], now, job.expected_s))
                continue
            waited = now - job.queued_at
            preempting = False
            if policy.preempt_after is not None and waited >= policy.preempt_after:
                victims = _victims(job, running, len(free))
                out.preempt.extend((v, job.id) for v in victims)
                running = [replace(a, stopping=True) if a.id in victims else a for a in running]
                preempting = any(a.stopping and a.priority < job.priority for a in running)
            if waited >= policy.reserve_after or preempting:
                out.reserved = job.id
                shadow, extra = _shadow(job.slots, running, len(free), now)
                out.shadow = shadow
            continue
        # Backfill behind the reservation.
        if job.slots > len(free):
            continue
        ends = now + job.expected_s if job.expected_s is not None else math.inf
        if ends <= shadow:
            pass
        elif job.slots <= extra:
            extra -= job.slots
        else:
            continue
        out.start.append((job.id, _take(free, job.slots)))
    return out


def _take(free: list[int], n: int) -> tuple[int, ...]:
    """The ``n`` lowest free devices (removed from ``free``)."""
    taken = tuple(free[:n])
    del free[:n]
    return taken


def _victims(job: Pending, running: Sequence[Active], free: int) -> list[int]:
    """Running jobs of lower priority to stop so that ``job`` fits; [] when it cannot."""
    coming = free + sum(a.slots for a in running if a.stopping)
    if coming >= job.slots:
        return []  # enough is already on its way
    candidates = sorted(
        (a for a in running if not a.stopping and a.priority < job.priority),
        key=lambda a: (a.priority, -a.started_at, a.id),
    )
    chosen: list[int] = []
    for a in candidates:
        if coming >= job.slots:
            break
        chosen.append(a.id)
        coming += a.slots
    return chosen if coming >= job.slots else []


def _shadow(slots: int, running: Sequence[Active], free: int, now: float) -> tuple[float, float]:
    """When ``slots`` devices are expected free, and how many more than that are free then."""
    avail = free
    for end, n in sorted((a.expected_end(now), a.slots) for a in running):
        avail += n
        if avail >= slots:
            return end, float(avail - slots)
    return math.inf, 0.0  # unreachable when slots <= the worker's devices
