"""The figures over a run's steady steps: percentiles, drift, throughput, show's median.

:func:`figures` takes the :class:`~acceptrun.telemetry.steps.Steps` of one read of the
step log. Percentiles and the mean come from the order statistics of the steady step
times (telemetry/order.py); what a histogram of them cannot say (the drift's first and
last quarter in time order, rates of a constant amount) comes from a second read of the
steady steps (:func:`_refill`), so memory stays that of the histograms.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from acceptrun.record.steplog import StepLog
from acceptrun.telemetry.order import (
    ArrayOrder,
    Hist,
    HistOrder,
    Order,
    median,
    quantile,
    ranks,
    whole_us,
)
from acceptrun.telemetry.steps import UNITS, WARMUP_STEPS, Piece, Steps, Unit, col, fill, groups

__all__ = ["DRIFT_MIN_STEPS", "figures"]

DRIFT_MIN_STEPS = 8  # steady steps needed before first vs last quarter means anything


def _median(values: Any) -> float:
    """statistics.median of a float64 array (partitions a copy)."""
    n = int(values.size)
    m = n // 2
    if n % 2:
        return float(np.partition(values, m)[m])
    part = np.partition(values, [m - 1, m])
    return (float(part[m - 1]) + float(part[m])) / 2


def _kth_union(s: Any, extra: Any, r: int) -> float:
    """The r-th smallest (0-based) of ``s`` and ``extra`` together, ``extra`` small.

    The answer lies between the (r - m)-th and r-th smallest of ``s`` (m = len(extra)):
    those order statistics of ``s`` and ``extra``, sorted, hold it at rank r - lo. ``s`` is
    partitioned in place (its order is spent); ``s[lo:hi + 1]`` then holds exactly the
    order statistics lo..hi.
    """
    m = extra.size
    lo = max(0, r - m)
    hi = min(s.size - 1, r)
    if hi < lo:
        window = np.empty(0)
    else:
        s.partition([lo, hi])
        window = s[lo : hi + 1]
    both = np.sort(np.concatenate([window, extra]))
    return float(both[r - lo])


@dataclass
class _Steady:
    order: Order  # the steady step times' order statistics (telemetry/order.py)
    times: Any  # float64 seconds in reading order, or None (a histogram: see _refill)
    pieces: list[Piece]  # in the attempts' start order
    units: dict[str, Unit]
    fallback: bool  # every timed step (no steady one was left)


def _steady(steps: Steps, order: list[int]) -> _Steady:
    """Timed steps without each attempt's warm-up; all timed steps if that leaves none."""
    rank = {n: i for i, n in enumerate(order)}
    if steps.filled:
        ordered = sorted(steps.pieces, key=lambda p: (rank.get(p.attempt, len(rank)), p.offset))
        if steps.hist is not None:
            return _Steady(HistOrder(steps.hist), None, ordered, steps.units, False)
        return _Steady(ArrayOrder(steps.steady), steps.steady, ordered, steps.units, False)
    # No steady step: the warm-ups are all there is (at most WARMUP_STEPS per attempt).
    parts: list[tuple[int, tuple[Any, Any, Any, Any]]] = [
        (n, row)
        for n in sorted(steps.warmup, key=lambda n: rank.get(n, len(rank)))
        for row in steps.warmup[n]
    ]
    times = np.concatenate([row[0] for _n, row in parts]) if parts else np.empty(0)
    pieces: list[Piece] = []
    units: dict[str, Unit] = {}
    at = 0
    for n, (st, t, samples, tokens) in parts:
        pieces.append(
            Piece(n, at, st.size, float(t[0]), float(t[-1]), bool(np.all(t[1:] >= t[:-1])))
        )
        for (unit, _key), amt in zip(UNITS, (samples, tokens), strict=True):
            has = np.isfinite(amt)
            if has.any():
                u = units.setdefault(unit, Unit(rates=np.full(times.size, np.nan)))
                u.first.setdefault(n, at + int(np.argmax(has)))
                u.rates[at : at + st.size] = np.where(has, amt / st, np.nan)
        at += st.size
    return _Steady(ArrayOrder(times.copy()), times, pieces, units, True)


def _monotone(ps: list[Piece]) -> bool:
    """Whether the pieces, one after the other, are in the order of their t."""
    return all(p.t_sorted for p in ps) and all(
        a.t_last <= b.t_first for a, b in itertools.pairwise(ps)
    )


def _time_order_ends(sd: _Steady, steps: Steps, q: int) -> tuple[Any, Any]:
    """The first and the last ``q`` steady step times (float64 buffer) in the order of
    their t (stable: ties keep the attempts' order), for the drift.

    Steps are written in time order, so these are the first and the last ``q`` of the
    pieces one after the other; a clock that stepped back orders them all by their t.
    """
    ps = sd.pieces
    if _monotone(ps):
        return _gather(sd.times, ps, q), _gather(sd.times, ps[::-1], q, from_end=True)
    ordered = np.concatenate([sd.times[p.offset : p.offset + p.n] for p in ps])
    t = np.concatenate([_piece_t(sd, p, steps) for p in ps])
    ordered = ordered[np.argsort(t, kind="stable")]
    return ordered[:q], ordered[ordered.size - q :]


def _gather(times: Any, pieces: list[Piece], q: int, *, from_end: bool = False) -> Any:
    """The first ``q`` times of ``pieces`` read in order (the last ``q`` with ``from_end``,
    ``pieces`` then given last first), as one array in time order."""
    parts: list[Any] = []
    left = q
    for p in pieces:
        if left <= 0:
            break
        take = min(left, p.n)
        lo = p.offset + p.n - take if from_end else p.offset
        parts.append(times[lo : lo + take])
        left -= take
    if from_end:
        parts.reverse()
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0)


def _piece_t(sd: _Steady, p: Piece, steps: Steps) -> Any:
    """t of a piece's steps: its warm-up row (the fallback), else the buffer's second read."""
    if not sd.fallback:
        return steps.piece_t[p.offset]
    rows = steps.warmup.get(p.attempt, [])
    at = 0
    for q in sd.pieces:
        if q is p:
            break
        if q.attempt == p.attempt:
            at += 1
    return rows[at][1]


def _steady_again(log: StepLog, pieces: list[Piece]) -> Iterator[tuple[Piece, Any, Any]]:
    """A second read of the steady steps: (piece, its step times in seconds, their t) for
    each piece of the first read, found by (attempt, chunk). A live run's log may have
    grown since: a piece is cut to its first read's length, and new steps are skipped."""
    by_key = {(p.attempt, p.chunk): p for p in pieces}
    for number, chunks in groups(log):
        seen = 0
        for k, c in enumerate(chunks):
            if not len(c):
                continue
            st = col(c, "step_time")
            idx = np.flatnonzero(np.isfinite(st) & (st > 0))
            skip = max(0, min(WARMUP_STEPS - seen, idx.size))
            seen += idx.size
            p = by_key.get((number, k))
            if p is None:
                continue
            idx = idx[skip : skip + p.n]
            yield p, st[idx], c.t[idx]


def _refill(sd: _Steady, log: StepLog, steps: Steps, q: int) -> tuple[Any, Any] | None:
    """What a histogram of step times cannot say, from a second read of the steady steps:
    the rates still to fill (``steps.fills``), and, when ``q``, the first and the last
    ``q`` steady steps in time order as histograms (None when ``q`` is 0).

    Memory stays that of the histograms, unless a clock stepped back: then the steady
    step times are ordered by their t, all of them (a rare record, exact all the same).
    """
    ps = sd.pieces
    monotone = _monotone(ps)
    head, tail = Hist(), Hist()
    start: dict[int, int] = {}  # piece offset -> its first step's place in time order
    at = 0
    for p in ps:
        start[p.offset] = at
        at += p.n
    total = at
    rows: list[tuple[Any, Any]] = []
    for p, times, t in _steady_again(log, ps):
        for u, constant, lo, hi in steps.fills:
            a, b = max(lo, p.offset), min(hi, p.offset + times.size)
            if a < b:
                u.rates[a:b] = constant / times[a - p.offset : b - p.offset]
        if not q:
            continue
        if not monotone:
            rows.append((times, t))
            continue
        us = whole_us(times)
        s0 = start[p.offset]
        if s0 < q:
            head.add(us[: q - s0])
        cut = max(0, total - q - s0)
        if cut < us.size:
            tail.add(us[cut:])
    steps.fills = []
    if not q:
        return None
    if not monotone:
        times = np.concatenate([r[0] for r in rows]) if rows else np.empty(0)
        t = np.concatenate([r[1] for r in rows]) if rows else np.empty(0)
        ordered = times[np.argsort(t, kind="stable")]
        return ordered[:q], ordered[ordered.size - q :]
    return head, tail


def _throughput(sd: _Steady) -> dict[str, float]:
    """Median rate per unit over the steady steps, in the order each unit first appears."""
    order = sd.order
    n = order.n
    if not n:
        return {}
    m = n // 2

    def from_times(c: float) -> float:  # median of c / t, from the order statistics of t
        if n % 2:
            return c / order.kth(m)
        return (c / order.kth(m - 1) + c / order.kth(m)) / 2

    out: list[tuple[tuple[int, int, int], str, float]] = []
    first = sd.pieces[0] if sd.pieces else None
    rank = {p.attempt: i for i, p in reversed(list(enumerate(sd.pieces)))}
    for i, (unit, _key) in enumerate(UNITS):
        u = sd.units.get(unit)
        if u is None or not u.first:
            continue
        if u.rates is not None:
            finite = u.rates[np.isfinite(u.rates)]
            value = _median(finite) if finite.size else None
        elif u.since == 0 and u.constant is not None:
            value = u.constant  # resolved below, from the order statistics of the times
        else:
            value = None
        if value is None:
            continue
        where = min((rank.get(a, len(rank)), r) for a, r in u.first.items())
        out.append(((*where, i), unit, value))
    if first is not None:
        out.append(((rank.get(first.attempt, 0), 0, len(UNITS)), "steps/s", 1.0))
    out.sort(key=lambda x: x[0])
    result: dict[str, float] = {}
    for _k, unit, value in out:
        u = sd.units.get(unit)
        if unit == "steps/s":
            result[unit] = from_times(1.0)
        elif u is not None and u.rates is None:
            result[unit] = from_times(value)
        else:
            result[unit] = value
    return result


def figures(steps: Steps, order: list[int], log: StepLog) -> dict[str, Any]:
    """Percentiles, drift, throughput (over the steady steps) and show's step facts."""
    sd = _steady(steps, order)
    out: dict[str, Any] = {"step_time": None, "drift": None, "throughput": {}}
    n = sd.order.n
    # rates of a constant amount logged from a later steady step on: an array of their own
    for u in sd.units.values():
        if u.rates is None and u.constant is not None and u.since:
            u.rates = np.full(steps.capacity if sd.times is None else sd.times.size, np.nan)
            if sd.times is not None:
                u.rates[u.since :] = u.constant / sd.times[u.since : sd.times.size]
            else:
                fill(steps, u, u.constant, u.since, steps.filled)
    q = n // 4 if n >= DRIFT_MIN_STEPS else 0
    ends: tuple[Any, Any] | None = None
    if sd.times is None and (q or steps.fills):
        ends = _refill(sd, log, steps, q)
    elif q:
        if not sd.fallback and not _monotone(sd.pieces):
            steps.piece_t = _buffer_t(log, sd.pieces)
        ends = _time_order_ends(sd, steps, q)
    if ends is not None:
        out["drift"] = _drift(*ends)
    if n:
        if isinstance(sd.order, ArrayOrder):
            sd.order.prepare(ranks(n, (0.5, 0.9, 0.99)))
        out["step_time"] = {
            "p50": quantile(sd.order, 0.50),
            "p90": quantile(sd.order, 0.90),
            "p99": quantile(sd.order, 0.99),
            "mean": sd.order.mean(),
            "n": float(n),
        }
        out["throughput"] = _throughput(sd)
    out["median_all"] = _median_all(steps, sd)
    return out


def _buffer_t(log: StepLog, pieces: list[Piece]) -> dict[int, Any]:
    """t of each piece's steady steps (a second read), by the piece's offset."""
    return {p.offset: t for p, _times, t in _steady_again(log, pieces)}


def _drift(head: Any, tail: Any) -> dict[str, float] | None:
    """The median of the first and of the last quarter of steady steps, and the change."""
    if isinstance(head, Hist):
        first, last = median(HistOrder(head)), median(HistOrder(tail))
    else:
        first, last = _median(head), _median(tail)
    if first <= 0:
        return None
    return {"first_p50": first, "last_p50": last, "change": last / first - 1.0}


def _median_all(steps: Steps, sd: _Steady) -> float | None:
    """Median of every finite step time (``show``): steady, warm-up and non-positive ones."""
    extra_parts = [row[0] for rows in steps.warmup.values() for row in rows] + steps.other_times
    if sd.fallback:
        extra_parts = steps.other_times
    extra = np.sort(np.concatenate(extra_parts)) if extra_parts else np.empty(0)
    n = sd.order.n + extra.size
    if not n:
        return None
    if not extra.size:
        return median(sd.order)
    if isinstance(sd.order, HistOrder):
        extra_us = whole_us(extra)  # the same chunks' times: whole microseconds too
        if extra_us is not None:
            return median(HistOrder(sd.order.hist.with_values(extra_us)))
        h = sd.order.hist
        every = np.concatenate([np.repeat(h.values, h.counts) / 1e6, extra])
        return _median(every)
    assert isinstance(sd.order, ArrayOrder)
    s = sd.order.a
    if extra.size > 1 << 16:  # many non-positive times: one array of them all
        return _median(np.concatenate([s, extra]))
    m = n // 2
    if n % 2:
        return _kth_union(s, extra, m)
    return (_kth_union(s, extra, m - 1) + _kth_union(s, extra, m)) / 2
