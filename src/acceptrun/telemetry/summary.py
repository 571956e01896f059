"""What a run's time went to, read back from its record: breakdown, percentiles, hints.

:func:`summarize` reads only the record (the step log, ``events.jsonl``,
``telemetry.jsonl``, ``attempts/*/exit.json``, ``run.json``, ``spec.toml``,
``provenance.json``) and never raises on a missing, partial or torn file: what cannot be
computed is None. Steps are read in chunks of arrays (record/steplog.py), never as one
object per step. A closed run stores the summary in ``summary.json``
(:func:`write_summary`); ``acceptrun show`` and the report read it through
:func:`load_summary`, the verdict computes it.

The time breakdown splits the run's wall time (``run_start`` to the last event) into
parts that sum to it:

- ``compute``: step time, less the data wait and the checkpoint stall inside it;
- ``data_wait``: time the loop spent in ``run.data_wait()``;
- ``checkpoint_stall``: the training thread blocked by checkpoint staging
  (``stall_s`` of the ``checkpoint_stage`` events);
- ``before_first_step``: launch (preflight, start-up, imports, restore) to the first
  step of each attempt;
- ``restarts``: the backoff between attempts, the steps a later attempt ran again, and
  the time a failed attempt ran after its last step (hang windows included);
- ``other``: the rest (time between steps outside the loop body, closing).

A step event read from a script's log (``source: "log"``) may stand for several steps
(``span``, a line every N steps): its step time is per step, so it counts ``span`` times.
A black box without step events (the ``usage`` event says the script does not use the
client, and no progress source matched) is timed by its activity in telemetry.jsonl
(:mod:`acceptrun.telemetry.activity`): before its first active sample is "before first step", its
active samples are compute, its inactive ones "other"; never all of it "before first step".

>>> s = summarize(Path(".acceptrun/runs/20261130-015953-sumx-0b29"))
>>> s.breakdown["data_wait"], s.step_time["p50"], s.hints
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from acceptrun._util.durable import read_json, read_jsonl, write_json_atomic
from acceptrun._version import __version__
from acceptrun.record.steplog import StepChunk, StepLog, StepRanges
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.telemetry.hints import Evidence, make_hints
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
from acceptrun.telemetry.peaks import peak_tflops

__all__ = [
    "BREAKDOWN_PARTS",
    "CHART_POINTS",
    "DRIFT_MIN_STEPS",
    "SUMMARY_FILE",
    "WARMUP_STEPS",
    "Stored",
    "Summary",
    "load_summary",
    "summarize",
    "timelines",
    "write_summary",
]

BREAKDOWN_PARTS = (
    "compute",
    "data_wait",
    "checkpoint_stall",
    "before_first_step",
    "restarts",
    "other",
)
WARMUP_STEPS = 3  # first steps of each attempt left out of percentiles (compile, caches, cuDNN)
DRIFT_MIN_STEPS = 8  # steady steps needed before first vs last quarter means anything
# NVML clock event names (sw_power_cap, hw_slowdown, hw_thermal_slowdown, ...): which
# count as power-capped and which as thermal or hardware throttling.
POWER_CAP_MARK = "power_cap"
CHART_POINTS = 2000  # per chart series at most: min and max of 1000 buckets of steps
SUMMARY_FILE = "summary.json"
SUMMARY_FORMAT = 1
LIVE_STATUSES = frozenset({"created", "preflight", "running", "closing"})
THROTTLE_MARKS = ("thermal", "hw_")


@dataclass
class Summary:
    """A run's telemetry in figures. Every field is None (or empty) when not recorded."""

    steps: int
    """Step events counted, all attempts together."""
    first_step_s: float | None
    """Seconds from the run_start event to the first step event."""
    wall_s: float | None
    """Seconds from run_start to the end of the run (or its last event)."""
    breakdown: dict[str, float]
    """Seconds per part (see BREAKDOWN_PARTS); sums to about wall_s."""
    step_time: dict[str, float] | None
    """Seconds per step over steady steps: p50, p90, p99, mean, n."""
    drift: dict[str, float] | None
    """Median step time of the first and last quarter of steady steps, and the change."""
    throughput: dict[str, float]
    """Median per unit: samples/s, tokens/s (when logged), steps/s."""
    mfu: float | None
    """Model FLOPs utilization, 0..1, when FLOPs per sample/token and a peak are known."""
    data_wait_share: float | None
    """Data wait over step time, summed over steps; None when the loop never timed it."""
    idle_share: float | None
    """Share of the samples (GPU, else workload CPU) below telemetry.idle_threshold."""
    gpus: list[dict[str, Any]] = field(default_factory=list)
    """Per GPU: index, name, util_mean, mem_peak, mem_total, power_capped_share,
    throttled_share, temp_max, ecc_uncorrected (and power_mean, sm_active_mean, samples)."""
    host: dict[str, Any] | None = None
    """cpu_mean, proc_cpu_mean, proc_rss_peak, mem_peak, mem_total, free_min, samples."""
    hints: list[str] = field(default_factory=list)
    """Plain-language hints, one sentence each, with the figure and the fix."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (``show --json``, the report, exports)."""
        return dataclasses.asdict(self)


# ---- reading the record ---------------------------------------------------------------------


@dataclass
class _Record:
    events: list[dict[str, Any]]  # events.jsonl (with the steps of a format-1 record)
    samples: list[dict[str, Any]]
    spec: RunSpec  # the frozen spec; a default one when it is missing or damaged
    provenance: dict[str, Any]
    log: StepLog


def _load(run_dir: Path) -> _Record:
    """Everything summarize reads; a missing or damaged file reads as empty."""
    events = _timed(read_jsonl(run_dir / "events.jsonl"))
    samples = _timed(read_jsonl(run_dir / "telemetry.jsonl"))
    spec = RunSpec(name="-", command=["-"])  # every section at its defaults
    with contextlib.suppress(Exception):  # a damaged spec: defaults, never an exception
        spec = load_spec(run_dir / "spec.toml")
    provenance: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        found = read_json(run_dir / "provenance.json", root=run_dir)
        provenance = found if isinstance(found, dict) else {}
    return _Record(events, samples, spec, provenance, StepLog(run_dir, events=events))


def _timed(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines with a numeric ``t``, in file order (a line without one is ignored)."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        out = [ev for ev in lines if _num(ev.get("t")) is not None]
    return out


def _num(value: Any) -> float | None:
    """A finite float, or None (bools, strings, NaN and missing values are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _json_step_count(events: list[dict[str, Any]]) -> int:
    return sum(
        1
        for ev in events
        if ev.get("kind") == "step"
        and isinstance(ev.get("step"), int)
        and not isinstance(ev.get("step"), bool)
    )


def _black_box(events: list[dict[str, Any]]) -> bool:
    """True when the launch recorded a command that does not use the client API."""
    usage = next((ev for ev in events if ev.get("kind") == "usage"), None)
    return usage is not None and usage.get("usage") != "client"


# ---- the steps: one streaming pass over the step log ------------------------------------------


@dataclass
class _Attempt:
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


def _spans(events: list[dict[str, Any]]) -> dict[int, _Attempt]:
    """Attempts from attempt_start / workload_start / attempt_exit (steps add the others)."""
    by_number: dict[int, _Attempt] = {}
    for ev in events:
        kind = ev.get("kind")
        number = ev.get("attempt")
        t = _num(ev.get("t"))
        if kind == "step" or t is None or not isinstance(number, int) or isinstance(number, bool):
            continue
        a = by_number.get(number)
        if (kind == "attempt_start" or kind == "workload_start") and a is None:
            a = by_number[number] = _Attempt(number, t)
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
class _Piece:
    """Where one chunk's steady step times lie in the steady buffer, and their times t."""

    attempt: int
    offset: int
    n: int
    t_first: float
    t_last: float
    t_sorted: bool
    chunk: int = 0  # the chunk's place among its attempt's chunks (a second read finds it)


@dataclass
class _Unit:
    """A throughput unit's amounts over the steady steps: one constant, or a rate array."""

    constant: float | None = None
    since: int = 0  # steady position of the first step that logged it (constant mode)
    rates: Any = None  # float64 array over the steady buffer (NaN: not logged)
    first: dict[int, int] = field(default_factory=dict)  # attempt -> rank of its first


@dataclass
class _Steps:
    """What summarize needs from every step, computed in one pass (see :func:`_read_steps`)."""

    count: int = 0
    t_min: float | None = None
    t_max: float | None = None
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BREAKDOWN_PARTS, 0.0))
    steps_redone: int = 0
    redone_by: dict[int, int] = field(default_factory=dict)
    timed_seconds: float = 0.0  # step time x span over timed steps
    timed_wait: float = 0.0  # data wait over timed steps
    wait_logged: bool = False  # a timed step logged data_wait
    hist: Hist | None = None  # the steady step times in whole microseconds (telemetry/order.py)
    steady: Any = None  # else float64 seconds of every steady step, in reading order
    capacity: int = 16  # the size of the rate arrays (u.rates), indexed by steady position
    fills: list[tuple[_Unit, float, int, int]] = field(default_factory=list)  # see _refill
    piece_t: dict[int, Any] = field(default_factory=dict)  # float buffer, clock stepped back
    filled: int = 0
    pieces: list[_Piece] = field(default_factory=list)
    warmup: dict[int, list[tuple[Any, Any, Any, Any]]] = field(default_factory=dict)
    other_times: list[Any] = field(default_factory=list)  # finite step times <= 0
    units: dict[str, _Unit] = field(default_factory=dict)
    all_seconds: float = 0.0  # every finite step time (show's data wait share)
    all_wait: float = 0.0


_UNITS = (("samples/s", "samples"), ("tokens/s", "tokens"))


def _col(chunk: StepChunk, name: str) -> Any:
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


class _NotWholeUs(Exception):
    """A step time that is not whole microseconds: read again with a float64 buffer."""


def _read_steps(
    log: StepLog, expected: int, attempts: dict[int, _Attempt], *, whole: bool = True
) -> _Steps:
    """Every step, read once, from the last attempt to the first: a step is redone when a
    later attempt ran it again, so the later attempts' steps are known when an earlier one
    is read. ``attempts`` gains the attempts with steps but no start event, and each
    attempt's step aggregates.

    ``whole``: the steady step times go to a histogram of whole microseconds (what the step
    log holds; memory that does not grow with steps), and a time that is not one raises
    _NotWholeUs; else to a float64 array of them all."""
    cap = max(expected, 16)
    out = _Steps(capacity=cap)
    if whole:
        out.hist = Hist()
    else:
        out.steady = np.empty(cap, dtype=np.float64)
    totals = {k: _Total() for k in ("restarts", "data_wait", "compute", "timed", "timed_wait", "all", "all_wait")}  # fmt: skip
    # Steps that the attempts read so far (the later ones) ran again: those a later attempt
    # that resumed from a checkpoint ran, every step from the checkpoint's on to its last
    # (``rerun``); for one whose resume step is not known, the steps it reported (``later``).
    later, rerun = StepRanges(), StepRanges()
    for number, chunks in _groups(log):
        mine, redone, timed_seen, steady_rank = StepRanges(), 0, 0, 0
        a = attempts.get(number)
        for k, c in enumerate(chunks):
            if not len(c):
                continue
            if a is None:
                a = attempts[number] = _Attempt(number, float(c.t[0]))
            st_raw = _col(c, "step_time")
            finite = np.isfinite(st_raw)
            st = np.where(finite, st_raw, 0.0)
            span = _span_col(c)
            weighted = st if span is None else st * span
            dw = _col(c, "data_wait")
            dw = np.where(np.isfinite(dw), dw, 0.0)
            # the same in whole microseconds (int64) where they are: exact, fast sums
            st_us, dw_us = whole_us(st), whole_us(dw)
            if st_us is None and whole:
                raise _NotWholeUs
            w_us = None
            if st_us is not None and dw_us is not None:
                w_us = st_us if span is None else st_us * span.astype(np.int64)
            sum_st, sum_dw = (st_us, dw_us) if w_us is not None else (None, None)
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
            # work thrown away: the steps that a later attempt ran again. Steps, not
            # records: a log line every 10 steps stands for 10 (its span), and counts as
            # many of them as a later attempt ran again (the line of step 50 when the next
            # attempt resumed from step 50: none), as the verdict's lost steps count them.
            n_of = np.ones(len(c), np.int64) if span is None else span.astype(np.int64)
            again = np.where(later.contains(c.step), n_of, 0)
            if rerun.lo.size:
                again = np.maximum(again, rerun.count_within(c.step - n_of + 1, c.step))
            if again.any():
                redone += int(again.sum())
                totals["restarts"].add(st * again, None if w_us is None else st_us * again)
                kept = n_of - again
                w_keep, d_keep = st * kept, np.where(kept > 0, dw, 0.0)
                wk_us: Any = None if w_us is None else st_us * kept
                dk_us: Any = None if sum_dw is None else np.where(kept > 0, sum_dw, 0)
            else:
                w_keep, d_keep, wk_us, dk_us = weighted, dw, w_us, sum_dw
            d_keep = np.minimum(d_keep, w_keep)
            if wk_us is not None:
                dk_us = np.minimum(dk_us, wk_us)
            totals["data_wait"].add(d_keep, dk_us)
            totals["compute"].add(w_keep - d_keep, None if wk_us is None else wk_us - dk_us)
            mine = mine.union(StepRanges.of(c.step))
            # the step time split, and the steady steps (each attempt's warm-up left out)
            timed = st > 0
            totals["timed"].add(weighted[timed], None if w_us is None else w_us[timed])
            totals["timed_wait"].add(dw[timed], None if sum_dw is None else sum_dw[timed])
            if not out.wait_logged and "data_wait" in c.present:
                out.wait_logged = bool((c.present["data_wait"] & timed).any())
            totals["all"].add(st, sum_st)  # st: the finite step times, 0 for the others
            totals["all_wait"].add(dw, sum_dw)
            if (others := st_raw[finite & (st_raw <= 0)]).size:
                out.other_times.append(others)
            idx = np.flatnonzero(timed)
            skip = max(0, min(WARMUP_STEPS - timed_seen, idx.size))
            timed_seen += idx.size
            if skip:
                w = idx[:skip]
                out.warmup.setdefault(number, []).append(
                    (st[w], c.t[w], _col(c, "samples")[w], _col(c, "tokens")[w])
                )
            idx = idx[skip:]
            if idx.size:
                _add_steady(out, c, (number, k), st, st_us, idx, steady_rank)
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
    for part in ("restarts", "data_wait", "compute"):
        out.parts[part] = totals[part].value()
    out.timed_seconds, out.timed_wait = totals["timed"].value(), totals["timed_wait"].value()
    out.all_seconds, out.all_wait = totals["all"].value(), totals["all_wait"].value()
    return out


def _groups(log: StepLog) -> Iterable[tuple[int, Iterable[StepChunk]]]:
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
    out: _Steps, c: StepChunk, key: tuple[int, int], st: Any, st_us: Any, idx: Any, rank: int
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
        _Piece(number, at, n, float(t[0]), float(t[-1]), bool(np.all(t[1:] >= t[:-1])), key[1])
    )
    for unit, ukey in _UNITS:
        col = c.values.get(ukey)
        amt = np.full(n, np.nan) if col is None else col[idx]
        has = np.isfinite(amt)
        logged = bool(has.any())
        u = out.units.get(unit)
        if u is None:
            if not logged:
                continue
            u = out.units[unit] = _Unit()
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
                _fill(out, u, u.constant, u.since, at)
        u.rates[at : at + n] = np.where(has, amt / times, np.nan)
    out.filled = at + n


def _fill(out: _Steps, u: _Unit, constant: float, lo: int, hi: int) -> None:
    """Rates ``constant / t`` at steady positions lo..hi: now from the float64 buffer, or
    from the second read (:func:`_refill`) when the times are a histogram."""
    if hi <= lo:
        return
    if out.steady is not None:
        u.rates[lo:hi] = constant / out.steady[lo:hi]
    else:
        out.fills.append((u, constant, lo, hi))


# ---- figures --------------------------------------------------------------------------------


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
    pieces: list[_Piece]  # in the attempts' start order
    units: dict[str, _Unit]
    fallback: bool  # every timed step (no steady one was left)


def _steady(steps: _Steps, order: list[int]) -> _Steady:
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
    pieces: list[_Piece] = []
    units: dict[str, _Unit] = {}
    at = 0
    for n, (st, t, samples, tokens) in parts:
        pieces.append(
            _Piece(n, at, st.size, float(t[0]), float(t[-1]), bool(np.all(t[1:] >= t[:-1])))
        )
        for (unit, _key), amt in zip(_UNITS, (samples, tokens), strict=True):
            has = np.isfinite(amt)
            if has.any():
                u = units.setdefault(unit, _Unit(rates=np.full(times.size, np.nan)))
                u.first.setdefault(n, at + int(np.argmax(has)))
                u.rates[at : at + st.size] = np.where(has, amt / st, np.nan)
        at += st.size
    return _Steady(ArrayOrder(times.copy()), times, pieces, units, True)


def _monotone(ps: list[_Piece]) -> bool:
    """Whether the pieces, one after the other, are in the order of their t."""
    return all(p.t_sorted for p in ps) and all(
        a.t_last <= b.t_first for a, b in itertools.pairwise(ps)
    )


def _time_order_ends(sd: _Steady, steps: _Steps, q: int) -> tuple[Any, Any]:
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


def _gather(times: Any, pieces: list[_Piece], q: int, *, from_end: bool = False) -> Any:
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


def _piece_t(sd: _Steady, p: _Piece, steps: _Steps) -> Any:
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


def _steady_again(log: StepLog, pieces: list[_Piece]) -> Iterator[tuple[_Piece, Any, Any]]:
    """A second read of the steady steps: (piece, its step times in seconds, their t) for
    each piece of the first read, found by (attempt, chunk). A live run's log may have
    grown since: a piece is cut to its first read's length, and new steps are skipped."""
    by_key = {(p.attempt, p.chunk): p for p in pieces}
    for number, chunks in _groups(log):
        seen = 0
        for k, c in enumerate(chunks):
            if not len(c):
                continue
            st = _col(c, "step_time")
            idx = np.flatnonzero(np.isfinite(st) & (st > 0))
            skip = max(0, min(WARMUP_STEPS - seen, idx.size))
            seen += idx.size
            p = by_key.get((number, k))
            if p is None:
                continue
            idx = idx[skip : skip + p.n]
            yield p, st[idx], c.t[idx]


def _refill(sd: _Steady, log: StepLog, steps: _Steps, q: int) -> tuple[Any, Any] | None:
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
    for i, (unit, _key) in enumerate(_UNITS):
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
        out.append(((rank.get(first.attempt, 0), 0, len(_UNITS)), "steps/s", 1.0))
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


def _figures(steps: _Steps, order: list[int], log: StepLog) -> dict[str, Any]:
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
                _fill(steps, u, u.constant, u.since, steps.filled)
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


def _buffer_t(log: StepLog, pieces: list[_Piece]) -> dict[int, Any]:
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


def _median_all(steps: _Steps, sd: _Steady) -> float | None:
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


def _mfu(throughput: dict[str, float], rec: _Record, gpu_name: str | None) -> float | None:
    tel, res = rec.spec.telemetry, rec.spec.resources
    per_token, per_sample = tel.flops_per_token, tel.flops_per_sample
    if per_token is not None and "tokens/s" in throughput:
        flops = throughput["tokens/s"] * per_token
    elif per_sample is not None and "samples/s" in throughput:
        flops = throughput["samples/s"] * per_sample
    else:
        return None
    peak = tel.peak_tflops or peak_tflops(gpu_name)
    if peak is None:
        return None
    devices = max(res.gpus, 1) * res.nodes
    return flops / (peak * 1e12 * devices)


def _gpu_name(rec: _Record) -> str | None:
    gpus = rec.provenance.get("gpus")
    devices = gpus.get("devices") if isinstance(gpus, dict) else None
    if isinstance(devices, list) and devices and isinstance(devices[0], dict):
        name = devices[0].get("name")
        if isinstance(name, str):
            return name
    for s in rec.samples:
        if s.get("kind") == "gpu" and isinstance(s.get("name"), str):
            return str(s["name"])
    return None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _values(samples: list[dict[str, Any]], key: str) -> list[float]:
    return [v for v in (_num(s.get(key)) for s in samples) if v is not None]


def _share(samples: list[dict[str, Any]], test: Any) -> float | None:
    return sum(1 for s in samples if test(s)) / len(samples) if samples else None


def _clock_events(sample: dict[str, Any]) -> list[str]:
    events = sample.get("clock_events")
    return [str(e).lower() for e in events] if isinstance(events, list) else []


def _gpu_summaries(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_index: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        if s.get("kind") == "gpu" and isinstance(s.get("index"), int):
            by_index[int(s["index"])].append(s)
    out = []
    for index, group in sorted(by_index.items()):
        ecc = _values(group, "ecc_uncorrected")
        temps, mem, totals = _values(group, "temp_c"), _values(group, "mem_used"), _values(group, "mem_total")  # fmt: skip
        out.append(
            {
                "index": index,
                "name": next((s["name"] for s in group if isinstance(s.get("name"), str)), None),
                "samples": len(group),
                "util_mean": _mean(_values(group, "util_pct")),
                "sm_active_mean": _mean(_values(group, "sm_active_pct")),
                "mem_peak": max(mem) if mem else None,
                "mem_total": max(totals) if totals else None,
                "power_mean": _mean(_values(group, "power_w")),
                "power_capped_share": _share(
                    group, lambda s: any(POWER_CAP_MARK in e for e in _clock_events(s))
                ),
                "throttled_share": _share(
                    group,
                    lambda s: any(m in e for e in _clock_events(s) for m in THROTTLE_MARKS),
                ),
                "temp_max": max(temps) if temps else None,
                "ecc_uncorrected": max(ecc) if ecc else None,
            }
        )
    return out


def _host_summary(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    host = [s for s in samples if s.get("kind") == "host"]
    if not host:
        return None
    rss, mem = _values(host, "proc_rss"), _values(host, "mem_used")
    free = _values(host, "free_run_dir") + _values(host, "free_ckpt_dir")
    totals = _values(host, "mem_total")
    return {
        "samples": len(host),
        "cpu_mean": _mean(_values(host, "cpu_pct")),
        "proc_cpu_mean": _mean(_values(host, "proc_cpu_pct")),
        "proc_rss_peak": max(rss) if rss else None,
        "mem_peak": max(mem) if mem else None,
        "mem_total": max(totals) if totals else None,
        "free_min": min(free) if free else None,
    }


def _idle(samples: list[dict[str, Any]], threshold: float) -> tuple[float | None, str | None]:
    """Idle share and its source: mean over GPUs of each one's share of samples below
    the threshold; without GPU utilization, the workload's CPU (% of one core)."""
    by_index: dict[Any, list[float]] = defaultdict(list)
    for s in samples:
        util = _num(s.get("util_pct"))
        if s.get("kind") == "gpu" and util is not None:
            by_index[s.get("index")].append(util)
    if by_index:
        shares = [sum(1 for u in us if u < threshold) / len(us) for us in by_index.values()]
        return statistics.fmean(shares), "gpu"
    cpu = [
        v for v in (_num(s.get("proc_cpu_pct")) for s in samples if s.get("kind") == "host") if v is not None
    ]  # fmt: skip
    if cpu:
        return sum(1 for v in cpu if v < threshold) / len(cpu), "process"
    return None, None


# ---- the breakdown ----------------------------------------------------------------------------


@dataclass
class _Breakdown:
    parts: dict[str, float]
    restarts: int
    steps_redone: int
    first_attempt_wait: float | None  # before the first step of the first attempt, seconds


def _breakdown(
    events: list[dict[str, Any]],
    attempts: list[_Attempt],
    steps: _Steps,
    start: float,
    end: float,
    samples: list[dict[str, Any]] | None,
    threshold: float,  # telemetry.idle_threshold of the spec
) -> _Breakdown:
    parts = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
    black_box = samples is not None and _black_box(events)
    restart_into = {ev.get("attempt") for ev in events if ev.get("kind") == "restart"}
    first_wait: float | None = None
    for i, a in enumerate(attempts):
        origin = start if i == 0 else a.start
        a_end = (
            a.end if a.end is not None else (a.last_t if a.steps and a.last_t is not None else end)
        )
        followed = i + 1 < len(attempts) and attempts[i + 1].number in restart_into
        if i > 0:
            prev = attempts[i - 1]
            prev_end = prev.end if prev.end is not None else a.start
            gap = max(0.0, a.start - prev_end)
            parts["restarts" if a.number in restart_into else "other"] += gap
        if not a.steps and black_box and not a.client:
            from acceptrun.telemetry.activity import activity

            act = activity(samples or [], start=a.start, end=a_end, threshold=threshold)
            if act is not None and act.first_active is not None:
                wait = max(0.0, act.first_active - origin)
                parts["before_first_step"] += wait
                parts["restarts" if followed else "compute"] += act.active_s
                if i == 0:
                    first_wait = wait
                continue
        if not a.steps:
            wait = max(0.0, a_end - origin)
            if followed:  # failed before its first step, then restarted: thrown away
                parts["before_first_step"] += max(0.0, min(a.start, a_end) - origin)
                parts["restarts"] += max(0.0, a_end - max(a.start, origin))
            else:
                parts["before_first_step"] += wait
            if i == 0:
                first_wait = wait
            continue
        wait = max(0.0, (a.first_start or 0.0) - origin)
        parts["before_first_step"] += wait
        if i == 0:
            first_wait = wait
        if followed and a.last_t is not None:  # a failed attempt's time after its last step
            parts["restarts"] += max(0.0, a_end - a.last_t)
    for k in ("compute", "data_wait", "restarts"):  # the steps' own time (see _read_steps)
        parts[k] += steps.parts[k]
    stall = sum(
        _num(ev.get("stall_s")) or 0.0 for ev in events if ev.get("kind") == "checkpoint_stage"
    )
    parts["checkpoint_stall"] = stall
    # The stall happens inside the loop body (maybe_checkpoint), so inside step time.
    parts["compute"] = max(0.0, parts["compute"] - stall)
    accounted = sum(v for k, v in parts.items() if k != "other")
    parts["other"] = max(0.0, (end - start) - accounted)
    return _Breakdown(
        parts={k: round(float(v), 6) for k, v in parts.items()},
        restarts=len(restart_into & {a.number for a in attempts}),
        steps_redone=steps.steps_redone,
        first_attempt_wait=first_wait,
    )


# ---- the API ---------------------------------------------------------------------------------


def summarize(run_dir: Path) -> Summary:
    """Summarize one run record; fields it cannot compute are None, never an exception.

    Steps are read once from the step log (record/steplog.py), in chunks of arrays: the
    cost is one array of the steady step times, whatever the run's length.

    >>> summarize(record.path).breakdown
    {'compute': 41.2, 'data_wait': 3.1, 'checkpoint_stall': 0.4, ...}
    """
    return _summarize(_load(Path(run_dir)))[0]


def _summarize(rec: _Record, *, whole: bool = True) -> tuple[Summary, dict[str, Any]]:
    """The summary, and the step facts ``show`` prints (count, last step, median, loss).

    ``whole=False`` holds every steady step time in float64 even when they are whole
    microseconds (the tests prove the two give the same figures)."""
    events = [ev for ev in rec.events if ev.get("kind") != "step"]
    log = rec.log
    expected = log.count() + _json_step_count(rec.events)
    by_number = _spans(events)
    fresh = copy.deepcopy(by_number)
    try:
        if not whole:
            raise _NotWholeUs
        steps = _read_steps(log, expected, by_number)
    except _NotWholeUs:  # a record written by hand: every steady time in float64
        by_number = fresh
        steps = _read_steps(log, expected, by_number, whole=False)
    attempts = sorted(by_number.values(), key=lambda a: a.start)
    run_start = next((float(ev["t"]) for ev in events if ev.get("kind") == "run_start"), None)
    firsts = [float(events[0]["t"])] if events else []
    if steps.t_min is not None:
        firsts.append(steps.t_min)
    start = run_start if run_start is not None else (min(firsts) if firsts else None)
    ends = [float(ev["t"]) for ev in events]
    end = max([*ends, *([steps.t_max] if steps.t_max is not None else [])], default=None)
    wall = None if start is None or end is None else max(0.0, end - start)
    with_steps = sorted((a for a in by_number.values() if a.steps), key=lambda a: a.number)
    first_t = with_steps[0].first_t if with_steps else None
    first_step_s = (
        max(0.0, first_t - run_start) if first_t is not None and run_start is not None else None
    )
    threshold = rec.spec.telemetry.idle_threshold
    if start is not None and end is not None:
        bd = _breakdown(events, attempts, steps, start, end, rec.samples, threshold)
    else:
        bd = _Breakdown(dict.fromkeys(BREAKDOWN_PARTS, 0.0), 0, 0, None)
    figures = _figures(steps, [a.number for a in attempts], log)
    throughput = figures["throughput"]
    total_step = steps.timed_seconds
    data_wait_share = None
    if total_step > 0 and steps.wait_logged:
        data_wait_share = steps.timed_wait / total_step
    idle_share, idle_source = _idle(rec.samples, threshold)
    gpu_name = _gpu_name(rec)
    summary = Summary(
        steps=steps.count,
        first_step_s=first_step_s,
        wall_s=wall,
        breakdown=bd.parts,
        step_time=figures["step_time"],
        drift=figures["drift"],
        throughput=throughput,
        mfu=_mfu(throughput, rec, gpu_name),
        data_wait_share=data_wait_share,
        idle_share=idle_share,
        gpus=_gpu_summaries(rec.samples),
        host=_host_summary(rec.samples),
    )
    summary.hints = make_hints(
        summary,
        Evidence(
            restarts=bd.restarts,
            steps_redone=bd.steps_redone,
            # A resume from a watched checkpoint whose step is an estimate (never later
            # than the state it holds): the steps after it that were run again are at most
            # that many.
            redone_at_most=any(
                e.get("kind") == "restored" and e.get("step_estimate") for e in rec.events
            ),
            first_attempt_wait=bd.first_attempt_wait,
            step_seconds=total_step,
            idle_threshold=threshold,
            idle_source=idle_source,
            xids=[s for s in rec.samples if s.get("kind") == "xid"],
            black_box=_black_box(rec.events),
        ),
    )
    losses = [a for a in with_steps if a.loss_first is not None]
    facts = {
        "steps": steps.count,
        "steps_redone": bd.steps_redone,
        "last_step": with_steps[-1].last_step if with_steps else None,
        "median_step_time": figures["median_all"],
        "step_time_s": steps.all_seconds,
        "data_wait_s": steps.all_wait,
        "loss_first": losses[0].loss_first if losses else None,
        "loss_last": losses[-1].loss_last if losses else None,
    }
    return summary, facts


def timelines(run_dir: Path) -> dict[str, Any]:
    """Series for charts: steps, host and GPU samples, and marks (restarts, checkpoints...).

    Each step carries ``throughput`` in the spec's ``acceptance.throughput_unit`` when
    the step logged that quantity, else in steps/s. A run of more than ``CHART_POINTS``
    steps is downsampled (see :func:`_step_series`) and says so in ``steps_downsampled``.
    """
    return _timelines(_load(Path(run_dir)))


def _timelines(rec: _Record) -> dict[str, Any]:
    unit = rec.spec.acceptance.throughput_unit
    key = {"samples/s": "samples", "tokens/s": "tokens"}.get(unit)
    marks: list[dict[str, Any]] = []
    for ev in rec.events:
        kind = ev.get("kind")
        if kind in ("restart", "attempt_start", "attempt_exit", "idle"):
            marks.append({"t": ev["t"], "kind": kind, "label": _mark_label(ev)})
        elif kind == "checkpoint_commit":
            marks.append({"t": ev["t"], "kind": "checkpoint", "label": f"step {ev.get('step')}"})
    n = rec.log.count() + _json_step_count(rec.events)
    steps, bucket = _step_series(rec.log, key, n)
    out: dict[str, Any] = {
        "steps": steps,
        "host": [s for s in rec.samples if s.get("kind") == "host"],
        "gpu": [s for s in rec.samples if s.get("kind") == "gpu"],
        "marks": marks,
    }
    if bucket > 1:
        out["steps_downsampled"] = {"of": n, "bucket": bucket}
    return out


_SERIES = ("step_time", "loss", "throughput")


def _rows(c: StepChunk, cols: dict[str, Any], idx: Any) -> list[dict[str, Any]]:
    t, step = c.t[idx].tolist(), c.step[idx].tolist()
    vals = {k: [None if v != v else v for v in cols[k][idx].tolist()] for k in _SERIES}
    return [
        {"t": t[i], "step": step[i], "attempt": c.attempt,
         **{k: vals[k][i] for k in _SERIES}}
        for i in range(len(t))
    ]  # fmt: skip


def _step_series(log: StepLog, key: str | None, n: int) -> tuple[list[dict[str, Any]], int]:
    """The chart rows of the steps, and the bucket (records per bucket; 1: every step).

    With more than ``CHART_POINTS`` steps, the steps are cut into buckets of ``B``
    consecutive records (B the least power of two leaving at most CHART_POINTS / 2
    buckets), and each bucket keeps, for each series, the step of its minimum and of its
    maximum (the first one on a tie), plus each attempt's first and last step: a spike or a
    stall stays visible, and the result depends on the steps only.
    """
    bucket = 1
    if n > CHART_POINTS:
        while -(-n // bucket) * 2 > CHART_POINTS:
            bucket *= 2
    rows: list[dict[str, Any]] = []
    best: dict[tuple[str, int, int], tuple[float, int]] = {}  # (series, kind, bucket) -> pick
    picked: dict[int, dict[str, Any]] = {}
    ends: dict[int, tuple[int, int]] = {}  # attempt -> (first, last) record index
    g = 0
    for c in log.chunks():
        m = len(c)
        if not m:
            continue
        st = _col(c, "step_time")
        st = np.where(np.isfinite(st), st, np.nan)
        loss = _col(c, "loss")
        loss = np.where(np.isfinite(loss), loss, np.nan)
        amount = _col(c, key) if key else np.full(m, np.nan)
        per = np.where(np.isfinite(amount), amount, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(np.isfinite(st) & (st != 0), per / np.where(st != 0, st, 1.0), np.nan)
        cols = {"step_time": st, "loss": loss, "throughput": rate}
        if bucket == 1:
            rows.extend(_rows(c, cols, np.arange(m)))
            g += m
            continue
        gi = g + np.arange(m)
        b = gi // bucket
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, m]))
        want: set[int] = set()
        for name in _SERIES:
            v = cols[name]
            if not np.isfinite(v).any():
                continue
            for kind, reduce in ((0, np.fmin), (1, np.fmax)):
                agg = reduce.reduceat(v, starts)
                idx = np.flatnonzero(v == agg[seg])
                _u, first = np.unique(seg[idx], return_index=True)
                for i in idx[first].tolist():
                    k = (name, kind, int(b[i]))
                    value, at = float(v[i]), g + i
                    old = best.get(k)
                    if old is None or (value < old[0] if kind == 0 else value > old[0]):
                        best[k] = (value, at)
                        want.add(i)
        first_last = ends.get(c.attempt)
        ends[c.attempt] = (g if first_last is None else first_last[0], g + m - 1)
        want |= {0, m - 1}
        idx = np.array(sorted(want), dtype=np.int64)
        for i, row in zip(idx.tolist(), _rows(c, cols, idx), strict=True):
            picked[g + i] = row
        g += m
    if bucket == 1:
        return rows, 1
    keep = {at for _value, at in best.values()}
    keep |= {i for pair in ends.values() for i in pair}
    return [picked[i] for i in sorted(keep) if i in picked], bucket


# ---- the stored summary ---------------------------------------------------------------------


@dataclass
class Stored:
    """A run's summary, its chart series and the step facts ``show`` prints."""

    summary: Summary
    timelines: dict[str, Any] | None
    steps: dict[str, Any]
    stored: bool  # read from summary.json (else computed now)


def _computed_from(run_dir: Path) -> dict[str, int]:
    """What a stored summary was computed from: it is current while these are unchanged."""

    def size(name: str) -> int:
        try:
            return (run_dir / name).stat().st_size
        except OSError:
            return -1

    return {
        "step_records": StepLog(run_dir).count(),
        "events_bytes": size("events.jsonl"),
        "telemetry_bytes": size("telemetry.jsonl"),
    }


def write_summary(record_path: Path) -> Path:
    """Compute the summary and the chart series once and store them as ``summary.json``.

    Called when the run closes; readers take it through :func:`load_summary`.
    """
    run_dir = Path(record_path)
    source = _computed_from(run_dir)  # before reading: a later change makes it stale
    rec = _load(run_dir)
    summary, facts = _summarize(rec)
    data = {
        "format": SUMMARY_FORMAT,
        "acceptrun_version": __version__,  # which acceptrun computed these figures
        "computed_from": source,
        "summary": summary.to_dict(),
        "step_facts": facts,
        "timelines": _timelines(rec),
    }
    target = run_dir / SUMMARY_FILE
    write_json_atomic(target, data)
    return target


def load_summary(run_dir: Path, *, with_timelines: bool = True) -> Stored:
    """The stored summary of a closed run when it is current, else one computed now.

    A run still going (status created, preflight, running or closing), a summary.json
    missing, damaged, of another format or computed from other steps or events: computed.
    """
    run_dir = Path(run_dir)
    stored = _read_stored(run_dir)
    if stored is not None:
        return stored
    rec = _load(run_dir)
    summary, facts = _summarize(rec)
    return Stored(summary, _timelines(rec) if with_timelines else None, facts, False)


def _read_stored(run_dir: Path) -> Stored | None:
    try:
        state = read_json(run_dir / "run.json", root=run_dir)
        if not isinstance(state, dict) or state.get("status") in LIVE_STATUSES:
            return None
        data = read_json(run_dir / SUMMARY_FILE, root=run_dir)
        if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
            return None
        if data.get("computed_from") != _computed_from(run_dir):
            return None
        summary = Summary(**data["summary"])
        timelines_ = data["timelines"]
        facts = data["step_facts"]
        if not isinstance(timelines_, dict) or not isinstance(facts, dict):
            return None
    except Exception:  # missing, damaged or of another layout: computed instead
        return None
    return Stored(summary, timelines_, facts, True)


def _mark_label(ev: dict[str, Any]) -> str:
    kind, n = ev.get("kind"), ev.get("attempt")
    if kind == "restart":
        return f"restart as attempt {n} after {ev.get('after')} (backoff {ev.get('backoff_s')} s)"
    if kind == "attempt_start":
        resume = ev.get("resume_step")
        return f"attempt {n} started" + (
            "" if resume is None else f", resuming after step {resume}"
        )
    if kind == "attempt_exit":
        return f"attempt {n}: {ev.get('class') or ev.get('outcome')} ({ev.get('reason')})"
    seconds = _num(ev.get("seconds"))
    return f"idle {seconds or 0:.0f} s ({ev.get('source')} below {ev.get('threshold')})"
