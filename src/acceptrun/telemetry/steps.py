"""The steps of a run, read once: one streaming pass over the step log, in chunks of arrays.

:func:`read_steps` reads every step from the last attempt to the first (a step is redone
when a later attempt ran it again, so the later attempts' steps are known when an earlier
one is read) and returns the :class:`Steps` the summary needs: the steps' own share of the
time breakdown (compute, data wait, steps redone), the steady step times (each attempt's
first ``WARMUP_STEPS`` left out) as a histogram of whole microseconds, and the throughput
units' rates. Sums of seconds are exact (:class:`_Total`). The figures over the steady
steps are telemetry/figures.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from acceptrun._util.units import finite_number as num
from acceptrun.record.steplog import StepChunk, StepLog, StepRanges
from acceptrun.telemetry.order import Hist, whole_us

__all__ = [
    "UNITS",
    "WARMUP_STEPS",
    "Attempt",
    "NotWholeUs",
    "Piece",
    "Steps",
    "Unit",
    "col",
    "fill",
    "groups",
    "read_steps",
    "spans",
]

_PARTS = ("restarts", "data_wait", "compute")
WARMUP_STEPS = 3  # first steps of each attempt left out of percentiles (compile, caches, cuDNN)


@dataclass
class Attempt:
    """One attempt as summarize needs it: its span from the events, its steps' aggregates."""

    number: int
    start: float
    end: float | None = None
    outcome: str | None = None
    client: bool = False
    steps: int = 0  # step records
    first_t: float | None = None  # the first step's t (its end), unix s
    first_start: float | None = None  # the first step's start (t - step_time), unix s
    last_t: float | None = None  # the last step's t, unix s
    last_step: int | None = None
    resume_step: int | None = None  # the checkpoint's step it resumed from (attempt_start)
    loss_first: float | None = None
    loss_last: float | None = None


def spans(events: list[dict[str, Any]]) -> dict[int, Attempt]:
    """Attempts from attempt_start / workload_start / attempt_exit (steps add the others)."""
    by_number: dict[int, Attempt] = {}
    for ev in events:
        kind = ev.get("kind")
        number = ev.get("attempt")
        t = num(ev.get("t"))
        if kind == "step" or t is None or not isinstance(number, int) or isinstance(number, bool):
            continue
        a = by_number.get(number)
        if (kind == "attempt_start" or kind == "workload_start") and a is None:
            a = by_number[number] = Attempt(number, t)
        if a is None:
            continue
        resume = ev.get("resume_step")
        if kind == "attempt_start" and isinstance(resume, int) and not isinstance(resume, bool):
            a.resume_step = resume
        if kind == "attempt_exit":
            a.end, a.outcome = t, str(ev.get("outcome"))
        elif kind == "workload_start":
            a.client = True
    return by_number


@dataclass
class Piece:
    """Where one chunk's steady step times lie in the steady buffer, and their times t."""

    attempt: int
    offset: int
    n: int
    t_first: float
    t_last: float
    t_sorted: bool
    chunk: int = 0  # the chunk's place among its attempt's chunks (a second read finds it)


@dataclass
class Unit:
    """A throughput unit's amounts over the steady steps: one constant, or a rate array."""

    constant: float | None = None
    since: int = 0  # steady position of the first step that logged it (constant mode)
    rates: Any = None  # float64 array over the steady buffer (NaN: not logged)
    first: dict[int, int] = field(default_factory=dict)  # attempt -> rank of its first


@dataclass
class Steps:
    """What summarize needs from every step, computed in one pass (see :func:`read_steps`)."""

    count: int = 0
    t_min: float | None = None
    t_max: float | None = None
    # the steps' own seconds of the breakdown's parts (telemetry/summary.py BREAKDOWN_PARTS)
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_PARTS, 0.0))
    steps_redone: int = 0
    redone_by: dict[int, int] = field(default_factory=dict)
    timed_seconds: float = 0.0  # step time x span over timed steps
    timed_wait: float = 0.0  # data wait over timed steps
    wait_logged: bool = False  # a timed step logged data_wait
    hist: Hist | None = None  # the steady step times in whole microseconds (telemetry/order.py)
    steady: Any = None  # else float64 seconds of every steady step, in reading order
    capacity: int = 16  # the size of the rate arrays (u.rates), indexed by steady position
    fills: list[tuple[Unit, float, int, int]] = field(default_factory=list)  # see _refill
    piece_t: dict[int, Any] = field(default_factory=dict)  # float buffer, clock stepped back
    filled: int = 0
    pieces: list[Piece] = field(default_factory=list)
    warmup: dict[int, list[tuple[Any, Any, Any, Any]]] = field(default_factory=dict)
    other_times: list[Any] = field(default_factory=list)  # finite step times <= 0
    units: dict[str, Unit] = field(default_factory=dict)
    all_seconds: float = 0.0  # every finite step time (show's data wait share)
    all_wait: float = 0.0


UNITS = (("samples/s", "samples"), ("tokens/s", "tokens"))


def col(chunk: StepChunk, name: str) -> Any:
    v = chunk.values.get(name)
    return np.full(len(chunk), np.nan) if v is None else v


def _span_col(chunk: StepChunk) -> Any:
    """Steps each record stands for: ``span`` when a positive integer, else 1 (None: all 1)."""
    span = chunk.values.get("span")
    if span is None:
        return None
    ok = np.isfinite(span) & (span > 0) & (np.floor(span) == span)
    return np.where(ok, span, 1.0)


class _Total:
    """An exact sum of seconds, rounded once: whole microseconds (what the step log holds)
    summed as integers, anything else by ``math.fsum`` per array.

    ``math.fsum`` over every step was most of a long run's summary (4 of its 5 s at 10^7
    steps); an integer sum of the same values is exact and about 10 times faster.
    """

    __slots__ = ("rest", "us")

    def __init__(self) -> None:
        self.us = 0
        self.rest: list[float] = []

    def add(self, seconds: Any, us: Any) -> None:
        """Add an array of seconds; ``us`` is the same values in whole microseconds
        (int64), or None when they are not whole microseconds."""
        if us is not None:
            self.us += int(us.sum())
        elif seconds.size:
            self.rest.append(math.fsum(seconds))

    def value(self) -> float:
        exact = Fraction(self.us, 1_000_000)
        for r in self.rest:
            exact += Fraction(r)
        return float(exact)


class NotWholeUs(Exception):
    """A step time that is not whole microseconds: read again with a float64 buffer."""


def read_steps(
    log: StepLog, expected: int, attempts: dict[int, Attempt], *, whole: bool = True
) -> Steps:
    """Every step, read once, from the last attempt to the first: a step is redone when a
    later attempt ran it again, so the later attempts' steps are known when an earlier one
    is read. ``attempts`` gains the attempts with steps but no start event, and each
    attempt's step aggregates.

    ``whole``: the steady step times go to a histogram of whole microseconds (what the step
    log holds; memory that does not grow with steps), and a time that is not one raises
    NotWholeUs; else to a float64 array of them all."""
    cap = max(expected, 16)
    out = Steps(capacity=cap)
    if whole:
        out.hist = Hist()
    else:
        out.steady = np.empty(cap, dtype=np.float64)
    totals = {k: _Total() for k in ("restarts", "data_wait", "compute", "timed", "timed_wait", "all", "all_wait")}  # fmt: skip
    # Steps that the attempts read so far (the later ones) ran again: those a later attempt
    # that resumed from a checkpoint ran, every step from the checkpoint's on to its last
    # (``rerun``); for one whose resume step is not known, the steps it reported (``later``).
    later, rerun = StepRanges(), StepRanges()
    for number, chunks in groups(log):
        mine, redone, timed_seen, steady_rank = StepRanges(), 0, 0, 0
        a = attempts.get(number)
        for k, c in enumerate(chunks):
            if not len(c):
                continue
            if a is None:
                a = attempts[number] = Attempt(number, float(c.t[0]))
            x = _columns(c, whole)
            st, weighted, dw, w_us, sum_dw = x.st, x.weighted, x.dw, x.w_us, x.sum_dw
            _note(out, a, c, st)
            redone += _split_redone(c, x, later, rerun, totals)
            mine = mine.union(StepRanges.of(c.step))
            # the step time split, and the steady steps (each attempt's warm-up left out)
            timed = st > 0
            totals["timed"].add(weighted[timed], None if w_us is None else w_us[timed])
            totals["timed_wait"].add(dw[timed], None if sum_dw is None else sum_dw[timed])
            if not out.wait_logged and "data_wait" in c.present:
                out.wait_logged = bool((c.present["data_wait"] & timed).any())
            totals["all"].add(st, x.sum_st)  # st: the finite step times, 0 for the others
            totals["all_wait"].add(dw, sum_dw)
            if (others := x.st_raw[x.finite & (x.st_raw <= 0)]).size:
                out.other_times.append(others)
            idx = np.flatnonzero(timed)
            skip = max(0, min(WARMUP_STEPS - timed_seen, idx.size))
            timed_seen += idx.size
            if skip:
                w = idx[:skip]
                out.warmup.setdefault(number, []).append(
                    (st[w], c.t[w], col(c, "samples")[w], col(c, "tokens")[w])
                )
            idx = idx[skip:]
            if idx.size:
                _add_steady(out, c, (number, k), st, x.st_us, idx, steady_rank)
                steady_rank += idx.size
        if a is not None and a.steps:
            out.redone_by[number] = redone
            out.steps_redone += out.redone_by[number]
            if a.resume_step is not None and mine.lo.size and mine.hi[-1] > a.resume_step:
                ran = StepRanges(np.array([a.resume_step + 1]), mine.hi[-1:].copy())
                rerun = rerun.union(ran)
            else:
                later = later.union(mine)
    if out.steady is not None:
        out.steady = out.steady[: out.filled]
    for part in _PARTS:
        out.parts[part] = totals[part].value()
    out.timed_seconds, out.timed_wait = totals["timed"].value(), totals["timed_wait"].value()
    out.all_seconds, out.all_wait = totals["all"].value(), totals["all_wait"].value()
    return out


@dataclass(slots=True)
class _Columns:
    """One chunk's step times and data waits, as read_steps sums them."""

    st_raw: Any  # step_time as logged (NaN: not logged)
    finite: Any
    st: Any  # the finite step times, 0 for the others
    span: Any  # steps each record stands for (None: 1 each)
    weighted: Any  # st times span
    dw: Any  # the finite data waits, 0 for the others
    st_us: Any  # st in whole microseconds (int64), or None
    w_us: Any  # weighted in whole microseconds, or None
    sum_st: Any  # st_us where the chunk's sums can be exact integers, else None
    sum_dw: Any  # dw the same way


def _columns(c: StepChunk, whole: bool) -> _Columns:
    """The chunk's columns; with ``whole``, a step time that is not whole microseconds
    raises NotWholeUs (the caller reads again with a float64 buffer)."""
    st_raw = col(c, "step_time")
    finite = np.isfinite(st_raw)
    st = np.where(finite, st_raw, 0.0)
    span = _span_col(c)
    dw = col(c, "data_wait")
    dw = np.where(np.isfinite(dw), dw, 0.0)
    # the same in whole microseconds (int64) where they are: exact, fast sums
    st_us, dw_us = whole_us(st), whole_us(dw)
    if st_us is None and whole:
        raise NotWholeUs
    w_us = None
    if st_us is not None and dw_us is not None:
        w_us = st_us if span is None else st_us * span.astype(np.int64)
    sum_st, sum_dw = (st_us, dw_us) if w_us is not None else (None, None)
    weighted = st if span is None else st * span
    return _Columns(st_raw, finite, st, span, weighted, dw, st_us, w_us, sum_st, sum_dw)


def _note(out: Steps, a: Attempt, c: StepChunk, st: Any) -> None:
    """The attempt's step aggregates (first, last, loss) and the steps' count and span."""
    if a.steps == 0:
        a.first_t = float(c.t[0])
        a.first_start = float(c.t[0]) - float(st[0])
    a.steps += len(c)
    a.last_t, a.last_step = float(c.t[-1]), int(c.step[-1])
    loss = c.values.get("loss")
    if loss is not None and (ok := np.flatnonzero(np.isfinite(loss))).size:
        if a.loss_first is None:
            a.loss_first = float(loss[ok[0]])
        a.loss_last = float(loss[ok[-1]])
    out.count += len(c)
    lo_t, hi_t = float(c.t.min()), float(c.t.max())
    out.t_min = lo_t if out.t_min is None else min(out.t_min, lo_t)
    out.t_max = hi_t if out.t_max is None else max(out.t_max, hi_t)


def _split_redone(
    c: StepChunk, x: _Columns, later: StepRanges, rerun: StepRanges, totals: dict[str, _Total]
) -> int:
    """Add the chunk's step time to restarts (redone), data wait and compute (kept); returns
    the steps redone.

    Work thrown away: the steps that a later attempt ran again. Steps, not records: a log
    line every 10 steps stands for 10 (its span), and counts as many of them as a later
    attempt ran again (the line of step 50 when the next attempt resumed from step 50:
    none), as the verdict's lost steps count them.
    """
    st, dw, st_us, w_us, sum_dw = x.st, x.dw, x.st_us, x.w_us, x.sum_dw
    n_of = np.ones(len(c), np.int64) if x.span is None else x.span.astype(np.int64)
    again = np.where(later.contains(c.step), n_of, 0)
    if rerun.lo.size:
        again = np.maximum(again, rerun.count_within(c.step - n_of + 1, c.step))
    redone = 0
    if again.any():
        redone = int(again.sum())
        totals["restarts"].add(st * again, None if w_us is None else st_us * again)
        kept = n_of - again
        w_keep, d_keep = st * kept, np.where(kept > 0, dw, 0.0)
        wk_us: Any = None if w_us is None else st_us * kept
        dk_us: Any = None if sum_dw is None else np.where(kept > 0, sum_dw, 0)
    else:
        w_keep, d_keep, wk_us, dk_us = x.weighted, dw, w_us, sum_dw
    d_keep = np.minimum(d_keep, w_keep)
    if wk_us is not None:
        dk_us = np.minimum(dk_us, wk_us)
    totals["data_wait"].add(d_keep, dk_us)
    totals["compute"].add(w_keep - d_keep, None if wk_us is None else wk_us - dk_us)
    return redone


def groups(log: StepLog) -> Iterable[tuple[int, Iterable[StepChunk]]]:
    """(attempt, its chunks) from the last attempt to the first."""
    if log.segments:
        numbers = sorted(set(log.attempts()) | _json_attempts(log), reverse=True)
        return ((n, log.chunks(attempt=n)) for n in numbers)
    # format 1: the steps are events in memory already; group their chunks
    by: dict[int, list[StepChunk]] = defaultdict(list)
    for c in log.chunks():
        by[c.attempt].append(c)
    return sorted(by.items(), key=lambda kv: kv[0], reverse=True)


def _json_attempts(log: StepLog) -> set[int]:
    """Attempts of the step events kept as JSON in a format-2 record (a few, if any)."""
    found: set[int] = set()
    for ev in log._json_steps():  # the step log's own filter of JSON step events
        a = ev.get("attempt")
        found.add(a if isinstance(a, int) else 0)
    return found


def _add_steady(
    out: Steps, c: StepChunk, key: tuple[int, int], st: Any, st_us: Any, idx: Any, rank: int
) -> None:
    """Add one chunk's steady steps: to the histogram of microseconds (or the float64
    buffer), and to the rates of the throughput units."""
    number = key[0]
    n, at = idx.size, out.filled
    times = st[idx]
    if out.hist is not None:
        out.hist.add(st_us[idx])
    if at + n > out.capacity:  # more steps than counted before reading (a live run)
        out.capacity = max(2 * out.capacity, at + n)
        if out.steady is not None:
            grown = np.empty(out.capacity, dtype=np.float64)
            grown[:at] = out.steady[:at]
            out.steady = grown
        for grow in out.units.values():
            if grow.rates is not None:
                rates = np.full(out.capacity, np.nan)
                rates[:at] = grow.rates[:at]
                grow.rates = rates
    if out.steady is not None:
        out.steady[at : at + n] = times
    t = c.t[idx]
    out.pieces.append(
        Piece(number, at, n, float(t[0]), float(t[-1]), bool(np.all(t[1:] >= t[:-1])), key[1])
    )
    for unit, ukey in UNITS:
        col = c.values.get(ukey)
        amt = np.full(n, np.nan) if col is None else col[idx]
        has = np.isfinite(amt)
        logged = bool(has.any())
        u = out.units.get(unit)
        if u is None:
            if not logged:
                continue
            u = out.units[unit] = Unit()
        if logged and number not in u.first:
            u.first[number] = rank + int(np.argmax(has))
        if u.rates is None:
            first = float(amt[0])
            if bool(has.all()) and bool(np.all(amt == first)) and u.constant in (None, first):
                if u.constant is None:
                    u.constant, u.since = first, at
                continue
            u.rates = np.full(out.capacity, np.nan)
            if u.constant is not None:  # the steps before: that constant over their times
                fill(out, u, u.constant, u.since, at)
        u.rates[at : at + n] = np.where(has, amt / times, np.nan)
    out.filled = at + n


def fill(out: Steps, u: Unit, constant: float, lo: int, hi: int) -> None:
    """Rates ``constant / t`` at steady positions lo..hi: now from the float64 buffer, or
    from the second read (:func:`_refill`) when the times are a histogram."""
    if hi <= lo:
        return
    if out.steady is not None:
        u.rates[lo:hi] = constant / out.steady[lo:hi]
    else:
        out.fills.append((u, constant, lo, hi))
