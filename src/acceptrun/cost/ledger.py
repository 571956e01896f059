"""The cost ledger of one run: what it cost, and where the money went.

Built from the run record alone (frozen spec, events.jsonl, the step log read in chunks,
run.json, cost.jsonl) and
written to ``ledger.json``, so it can be rebuilt at any time with the same answer.

Billed compute runs from ``run_start`` (or an ``acceptrun resume``) to the last
``attempt_exit``; when no attempt ran, to the ``preflight_failed`` or
``stopped_before_launch`` event (the ``verdict`` event in records without them), so the
ledger built for the verdict and the one rebuilt after it agree. A resume starts a new
billing segment: the time between segments is not billed (the machine may have been
released). Each segment is rounded up to the price's increments on its own.

The billed seconds are split four ways, and the parts always sum to the billed total:

- productive: step time of steps that were kept (not redone by a later attempt), less
  the checkpoint stall inside them;
- wasted: work lost and redone after a failure (the attempts' ``work.seconds_lost``),
  and a failed attempt's time before its first step. A run refused at preflight ran no
  workload and is billed no compute: its checks' wall time is ``preflight_refused_s``;
- idle: launch and preflight, each attempt's start-up before its first step (restore
  included), the restart backoff between attempts, the tail after the last step, the
  idle stretch that ended an attempt stopped for idleness (``limits.idle_window``), the
  machine left up after the run when its stop time is recorded (``idle.after_run``,
  see :func:`after_run`), and the rounding up to billing increments;
- checkpoint_stall: the training loop blocked on checkpoint staging (``stall_s``).

A black box without step events (the ``usage`` event says the command does not use the
client) is split by its activity in telemetry.jsonl (:mod:`acceptrun.telemetry.activity`): its
active seconds are productive (lost work when the attempt failed), the start-up before
its first active sample idle (wasted when it failed), the rest idle. A step event that
stands for several steps (``span``, a log line every N steps) counts its step time
``span`` times.

Storage counts checkpoints (``total_bytes`` from commit to delete, or to the end) and
outputs (size from registration to the end) in GiB-hours, at the price's storage rate,
and what the run leaves on disk with its monthly cost. The checkpoint mirror is counted
apart (``storage.mirror``): each step's uploaded bytes from ``mirror_ok`` to
``mirror_delete`` (retention applied remotely) or the end, at ``cost.mirror_per_gib_month``
(0 USD when unset, the GiB-hours still counted), and what stays in the mirror. People's time and switching
costs come from ``cost.jsonl`` (see :func:`add_costs`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from acceptrun._util.durable import append_jsonl, read_jsonl
from acceptrun.cost.billing import billed_seconds, compute_cost
from acceptrun.cost.catalog import Catalog, Price, load_catalog, price_for
from acceptrun.cost.storage import storage_of
from acceptrun.errors import UserError
from acceptrun.record.liveness import dead_periods
from acceptrun.record.lost import lost_work
from acceptrun.record.models import stamp
from acceptrun.record.status import RESPONSIBILITY, FailureClass, Responsibility
from acceptrun.record.steplog import StepLog, StepRanges
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord, now_iso, user_at_host
from acceptrun.spec.model import RunSpec, load_spec

__all__ = [
    "LEDGER_FILE",
    "RESPONSIBLE",
    "SCHEMA",
    "add_costs",
    "build_ledger",
    "ledger_inputs",
    "price_of_run",
]

SCHEMA = 2
LEDGER_FILE = "ledger.json"
COST_FILE = "cost.jsonl"

# Detail keys of the split; the first word is the part they belong to.
DETAIL_KEYS = (
    "wasted.lost_work",
    "wasted.failed_startup",
    "wasted.failed_preflight",
    "idle.startup",
    "idle.backoff",
    "idle.after_last_step",
    "idle.idle_stop",
    "idle.after_run",
    "idle.rounding",
)
PARTS = ("productive", "wasted", "idle", "checkpoint_stall")
# Who a wasted span is owed to (record.status.RESPONSIBILITY), in the order shown.
RESPONSIBLE = ("provider", "workload", "unknown", "drill")


def price_of_run(
    record: RunRecord, catalog: Catalog | None = None
) -> tuple[Price | None, str | None, RunSpec]:
    """The run's price from its frozen ``[cost]``: (price or None, why not priced, spec)."""
    spec = load_spec(record.spec_path)
    try:
        cat = catalog if catalog is not None else load_catalog(record.path.parent.parent)
        price = price_for(spec.cost, cat)
    except UserError as exc:  # a catalog entry gone since: the ledger says so, no crash
        return None, str(exc), spec
    if price is None:
        return None, "the spec has no [cost] (set cost.price_per_hour or provider/instance)", spec
    return price, None, spec


def ledger_inputs(record: RunRecord) -> dict[str, list[int]]:
    """Size and mtime (ns) of the files a ledger is built from: a changed one makes it stale."""
    found = {}
    for name in ("run.json", "spec.toml", "events.jsonl", COST_FILE):
        try:
            st = (record.path / name).stat()
        except FileNotFoundError:
            continue
        found[name] = [st.st_size, st.st_mtime_ns]
    return found


def _price_dict(price: Price) -> dict[str, Any]:
    return {
        "label": price.label,
        "provider": price.provider,
        "instance": price.instance,
        "gpus": price.gpus,
        "gpu": price.gpu,
        "price_per_hour": price.price_per_hour,
        "increment_s": price.increment_s,
        "minimum_s": price.minimum_s,
        "storage_per_gib_month": price.storage_per_gib_month,
        "source": price.source,
        "date": price.date,
    }


# ---- people and switching (cost.jsonl) --------------------------------------------------------


def _positive(name: str, value: float, example: str) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{name} must be a positive number, got {value!r}; e.g. {example}")
    return float(value)


def add_costs(
    record: RunRecord,
    *,
    human_minutes: float | None = None,
    rate_per_hour: float | None = None,
    switching_usd: float | None = None,
    machine_stopped_at: float | None = None,
    note: str | None = None,
) -> list[dict[str, Any]]:
    """Append people's time and/or a switching cost to the run's ``cost.jsonl``.

    Everything is checked before anything is written, so a rejected call leaves the
    file as it was. ``machine_stopped_at`` (unix seconds) records when the run's machine
    was known to stop (``sky status``, the provider's console): the ledger then books the
    time from the run's end to it as idle (``idle.after_run``).
    Example: ``add_costs(rec, human_minutes=30, rate_per_hour=120)``.
    """
    if human_minutes is None and switching_usd is None and machine_stopped_at is None:
        raise UserError(
            "nothing to add; give --human-minutes 30 --rate 120, --switching-usd 40, "
            "or --machine-stopped-at 2026-12-04T23:10Z"
        )
    if (human_minutes is None) != (rate_per_hour is None):
        raise UserError(
            "--human-minutes and --rate (USD per hour) go together, "
            "e.g. --human-minutes 30 --rate 120"
        )
    entries: list[dict[str, Any]] = []
    stamp = {"note": note or "", "by": user_at_host(), "t": round(time.time(), 6)}
    if human_minutes is not None and rate_per_hour is not None:
        entries.append({
            "kind": "human",
            "minutes": _positive("--human-minutes", human_minutes, "--human-minutes 30"),
            "rate_per_hour": _positive("--rate (USD per hour)", rate_per_hour, "--rate 120"),
            **stamp,
        })  # fmt: skip
    if switching_usd is not None:
        entries.append({
            "kind": "switching",
            "usd": _positive("--switching-usd", switching_usd, "--switching-usd 40"),
            **stamp,
        })  # fmt: skip
    if machine_stopped_at is not None:
        entries.append({
            "kind": "machine_stop",
            "at": _positive("--machine-stopped-at", machine_stopped_at, "--machine-stopped-at 2026-12-04T23:10Z"),
            **stamp,
        })  # fmt: skip
    for entry in entries:
        append_jsonl(record.file(COST_FILE), entry, sync=True)
    return entries


# ---- the timeline -----------------------------------------------------------------------------


@dataclass
class _Attempt:
    attempt: int
    start: float
    end: float | None = None
    outcome: str = "running"
    klass: str | None = None
    exit: dict[str, Any] = field(default_factory=dict)  # its attempt_exit event
    seconds_lost: float = 0.0
    idle_since: float | None = None  # start of the idle stretch that stopped the attempt
    client: bool = False  # a workload_start event: the client API ran in this attempt
    # Its steps, from the step log (first pass, see _StepIndex): times and step numbers.
    first_t: float | None = None
    last_t: float | None = None
    numbers: StepRanges | None = None  # its step numbers, None without steps


@dataclass
class _Segment:
    start: float
    end: float | None = None
    attempts: list[_Attempt] = field(default_factory=list)


def _segments(events: list[dict[str, Any]], steps: _StepIndex) -> list[_Segment]:
    """Billing segments: run_start or a resume opens one; its last exit or verdict ends it.

    ``events`` are every event but the steps; a segment with no end event ends at its
    last event or its attempts' last step, whichever is later.
    """
    segments: list[_Segment] = []
    current: _Segment | None = None
    last_t: float | None = None
    by_number: dict[int, _Attempt] = {}
    for ev in events:
        t = ev.get("t")
        if not isinstance(t, int | float):
            continue
        kind = ev.get("kind")
        opens = kind == "run_start" or (kind == "audit" and ev.get("action") == "resume")
        if opens or current is None:
            if current is not None:
                current.end = current.end if current.end is not None else last_t
                segments.append(current)
            current = _Segment(start=float(t))
        if kind == "attempt_start":
            a = _Attempt(int(ev.get("attempt", 0)), float(t))
            steps.describe(a)
            by_number[a.attempt] = a
            current.attempts.append(a)
        elif kind == "attempt_exit":
            a = by_number.get(int(ev.get("attempt", 0)))  # type: ignore[assignment]
            if a is not None:
                a.end = float(t)
                a.outcome = str(ev.get("outcome", "failed"))
                a.klass = ev.get("class")
                a.exit = ev
                lost = (ev.get("work") or {}).get("seconds_lost")
                a.seconds_lost = float(lost) if isinstance(lost, int | float) else 0.0
            current.end = float(t)
        elif kind in ("preflight_failed", "stopped_before_launch"):
            if not current.attempts:  # the moment the run was known not to launch
                current.end = float(t)
        elif kind == "verdict":
            if not current.attempts and current.end is None:  # records older than those events
                current.end = float(t)
        elif kind == "workload_start":
            a = by_number.get(int(ev.get("attempt", 0)))  # type: ignore[assignment]
            if a is not None:
                a.client = True
        elif kind == "idle_stop" or (kind == "idle" and isinstance(ev.get("since"), int | float)):
            a = by_number.get(int(ev.get("attempt", 0)))  # type: ignore[assignment]
            since = ev.get("since")
            if a is not None and isinstance(since, int | float):
                a.idle_since = float(since) if a.idle_since is None else a.idle_since
        last_t = float(t)
        if current.end is None:  # its attempts' steps so far count as its last events
            last_t = max([last_t, *(a.last_t for a in current.attempts if a.last_t is not None)])
    if current is not None:
        current.end = current.end if current.end is not None else last_t
        segments.append(current)
    return segments


class _StepIndex:
    """The run's steps for the ledger, read from the step log in chunks, never as dicts.

    A first pass keeps, per attempt, its first and last step time and its step numbers
    as ranges (:class:`StepRanges`: a few integers for a loop's consecutive steps);
    :meth:`seconds` sums an attempt's step time over a window in a second pass, telling
    the steps a later attempt redid from the kept ones.
    """

    def __init__(self, log: StepLog) -> None:
        self._log = log
        self._numbers: dict[int, StepRanges] = {}
        self._t: dict[int, tuple[float, float]] = {}
        for c in log.chunks():
            if not len(c):
                continue
            mine = self._numbers.get(c.attempt, StepRanges())
            self._numbers[c.attempt] = mine.union(StepRanges.of(c.step))
            lo, hi = float(c.t.min()), float(c.t.max())
            old = self._t.get(c.attempt)
            self._t[c.attempt] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        self._later: dict[int, StepRanges] = {}  # per attempt: steps a later attempt logged

    def describe(self, a: _Attempt) -> None:
        if a.attempt in self._t:
            a.first_t, a.last_t = self._t[a.attempt]
            a.numbers = self._numbers[a.attempt]

    def mark_redone(self, attempts: list[_Attempt]) -> None:
        """Which steps of each attempt a later attempt (by number) logged again."""
        later = StepRanges()
        for a in sorted(attempts, key=lambda x: x.attempt, reverse=True):
            self._later[a.attempt] = later
            if a.numbers is not None:
                later = later.union(a.numbers)

    def seconds(self, a: _Attempt, lo: float, hi: float) -> tuple[float, float]:
        """(kept, redone) step seconds of ``a``'s steps timed ``lo <= t <= hi``."""
        import numpy as np

        later = self._later.get(a.attempt)
        kept = redone = 0.0
        for c in self._log.chunks(attempt=a.attempt):
            st = c.values.get("step_time")
            if st is None or not len(c):
                continue
            span = c.values.get("span")
            if span is not None:
                whole = np.isfinite(span) & (span > 0) & (span == np.floor(span))
                st = st * np.where(whole, span, 1.0)
            use = np.isfinite(st) & (c.t >= lo) & (c.t <= hi)
            if later is None or not later.size():
                kept += math.fsum(st[use])
            else:
                again = later.contains(c.step)
                kept += math.fsum(st[use & ~again])
                redone += math.fsum(st[use & again])
        return kept, redone


def _split_attempt(
    a: _Attempt,
    steps: _StepIndex,
    stalls: list[tuple[float, float]],
    activity_of: Any = None,
) -> dict[str, float]:
    """One attempt's wall time, partitioned (seconds): see the module docstring."""
    end = a.end if a.end is not None else (a.last_t if a.last_t is not None else a.start)
    out = dict.fromkeys(("productive", "checkpoint_stall", *DETAIL_KEYS), 0.0)
    if a.outcome == "idle" and a.idle_since is not None:
        # Stopped for idleness: the idle stretch is idle time; what came before is split
        # as for any stopped attempt (a step that straddles it is not counted as kept).
        idle_from = min(max(a.idle_since, a.start), end)
        out["idle.idle_stop"] = end - idle_from
        end = idle_from
    dur = max(0.0, end - a.start)
    failed = a.outcome not in ("success", "running", "idle")
    first_t = a.first_t
    act = None
    if first_t is None and activity_of is not None and not a.client:
        act = activity_of(a.start, end)  # a black box: timed by its samples
    if first_t is None and act is not None and act.first_active is not None:
        startup = min(max(0.0, act.first_active - a.start), dur)
        active = min(act.active_s, dur - startup)
        if failed:
            out["wasted.failed_startup"] = startup
            out["wasted.lost_work"] = dur - startup
        else:
            out["idle.startup"] = startup
            out["productive"] = active
            out["idle.after_last_step"] = dur - startup - active
        return out
    if first_t is None:
        out["wasted.failed_startup" if failed else "idle.startup"] = dur
        return out
    first_t = min(max(first_t, a.start), end)
    if failed:
        out["wasted.failed_startup"] = first_t - a.start
        lost_from = max(first_t, end - min(max(a.seconds_lost, 0.0), dur))
        out["wasted.lost_work"] = end - lost_from
    else:
        out["idle.startup"] = first_t - a.start
        lost_from = end
    # Steps between the first one and the lost window: kept, unless a later attempt redid them.
    stall = sum(s for t, s in stalls if first_t <= t <= lost_from)
    kept, redone_s = steps.seconds(a, first_t, lost_from)
    window = lost_from - first_t
    stall = min(stall, window)
    redone_s = min(redone_s, window - stall)
    productive = min(max(kept - stall, 0.0), window - stall - redone_s)
    out["checkpoint_stall"] = stall
    out["wasted.lost_work"] += redone_s
    out["productive"] = productive
    out["idle.after_last_step"] = window - stall - redone_s - productive
    return out


def _black_box_activity(record: RunRecord, spec: RunSpec, events: list[dict[str, Any]]) -> Any:
    """For a black box: a function (start, end) -> its Activity from telemetry; else None."""
    usage = next((e for e in events if e.get("kind") == "usage"), None)
    if usage is None or usage.get("usage") == "client":
        return None
    from acceptrun.telemetry.activity import activity

    samples = list(read_jsonl(record.telemetry_path)) if record.telemetry_path.exists() else []
    threshold = spec.telemetry.idle_threshold
    return lambda start, end: activity(samples, start=start, end=end, threshold=threshold)


# ---- the ledger -------------------------------------------------------------------------------


@dataclass
class _Compute:
    """The compute time of a run's segments, attempt by attempt (see :func:`_compute`)."""

    detail: dict[str, float]  # seconds per DETAIL_KEYS part (and productive, stalls)
    attempts: list[dict[str, Any]]  # the ledger's rows, one per attempt
    segments: list[dict[str, Any]]  # the ledger's rows, one per supervised segment
    wall: float = 0.0  # seconds
    billed: float = 0.0  # seconds, rounded up to the billing increments per segment
    preflight_s: float = 0.0  # a refused run's checks, not billed as compute


def _compute(
    segments: list[_Segment],
    steps: _StepIndex,
    events: list[dict[str, Any]],
    activity_of: Any,
    price: Price | None,
    failed_preflight: bool,
) -> _Compute:
    """Split each segment's billed time into its attempts' parts and the gaps between."""
    stalls = [
        (float(e["t"]), float(e.get("stall_s") or 0.0))
        for e in events
        if e.get("kind") == "checkpoint_stage"
    ]
    out = _Compute(dict.fromkeys(("productive", "checkpoint_stall", *DETAIL_KEYS), 0.0), [], [])
    detail = out.detail
    for seg in segments:
        seg_end = seg.end if seg.end is not None else seg.start
        seg_wall = max(0.0, seg_end - seg.start)
        seg_billed = billed_seconds(seg.start, seg_end, price) if price else seg_wall
        refused = failed_preflight and not seg.attempts
        if refused:  # no workload ran: not compute; its preflight time is on its own line
            seg_billed = 0.0
            out.preflight_s += seg_wall
        out.segments.append(
            {
                "start": seg.start,
                "end": seg_end,
                "wall_s": round(seg_wall, 3),
                "billed_s": round(seg_billed, 3),
            }
        )
        out.wall += seg_wall
        out.billed += seg_billed
        if refused:
            continue
        cursor, first = seg.start, True
        for a in seg.attempts:
            gap = max(0.0, a.start - cursor)
            detail["idle.startup" if first else "idle.backoff"] += gap
            first = False
            part = _split_attempt(a, steps, stalls, activity_of)
            for k, v in part.items():
                detail[k] += v
            a_end = a.end if a.end is not None else a.start + sum(part.values())
            cursor = max(cursor, a_end)
            out.attempts.append(_attempt_row(a, a_end, part, price))
        tail = max(0.0, seg_end - cursor)
        detail["idle.startup" if first else "idle.after_last_step"] += tail
    return out


def _attempt_row(
    a: _Attempt, end: float, part: dict[str, float], price: Price | None
) -> dict[str, Any]:
    """The ledger's row of one attempt: its billed seconds, their split and whose waste."""
    a_s = sum(part.values())
    who, why = responsibility_of(a)
    return {
        "attempt": a.attempt,
        "outcome": a.outcome,
        "class": a.klass,
        "start": a.start,
        "end": end,
        "billed_s": round(a_s, 3),
        "usd": round(compute_cost(a_s, price), 6) if price else 0.0,
        "split_s": {p: round(v, 3) for p, v in _parts(part).items()},
        "responsibility": who,
        "evidence": why,
    }


def _close_split(
    c: _Compute, after: dict[str, Any], failed_preflight: bool
) -> tuple[dict[str, float], dict[str, float]]:
    """The detail and the split of the billed total, summing to it exactly."""
    detail = c.detail
    if after["counted"]:  # the machine stayed up after the run, and its stop is recorded
        detail["idle.after_run"] += after["seconds"]
        c.billed += after["seconds"]
    # Whatever the attempts and gaps leave of the billed total (the rounding up to billing
    # increments, and clock jitter between events) is idle, so the parts sum exactly.
    accounted = sum(v for k, v in detail.items() if k != "idle.rounding")
    detail["idle.rounding"] = c.billed - accounted
    if failed_preflight:  # nothing of a run that never launched was of use, rounding included
        detail["wasted.failed_preflight"] += detail["idle.rounding"]
        detail["idle.rounding"] = 0.0
    detail = {k: round(v, 6) for k, v in detail.items()}
    split_s = _parts(detail)
    split_s["idle"] = round(c.billed - split_s["productive"] - split_s["wasted"]
                            - split_s["checkpoint_stall"], 6)  # fmt: skip
    return detail, split_s


def _compute_section(
    c: _Compute,
    detail: dict[str, float],
    split_s: dict[str, float],
    price: Price | None,
    nodes: int,
    failed_preflight: bool,
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ledger's ``compute``: its USD, the split in seconds and USD, the attempts, waste.

    A multi-node run holds resources.nodes machines at the price of one each: the split
    stays in wall seconds, its USD (and node-/device-seconds) count every node.
    """
    usd = compute_cost(c.billed, price) * nodes if price else 0.0
    per_s = usd / c.billed if c.billed > 0 else 0.0
    return {
        "usd": round(usd, 6),
        "split_s": split_s,
        "split_usd": {k: round(v * per_s, 6) for k, v in split_s.items()},
        "detail_s": detail,
        "attempts": c.attempts,
        "waste": _waste_by_responsibility(
            c.attempts, split_s, detail, per_s, failed_preflight, events
        ),
        "note": "billed_s is rounded up to billing increments per segment; the "
        "rounding is counted as idle (detail idle.rounding)",
    }


def build_ledger(record: RunRecord, catalog: Catalog | None = None) -> dict[str, Any]:
    """Build the run's cost ledger from its record and write it to ``ledger.json``.

    Example: ``build_ledger(ws.get_run("latest"))["total_usd"]``.
    """
    state = record.state
    inputs = ledger_inputs(record)  # before reading: a write during the build makes it stale
    price, unpriced_why, spec = price_of_run(record, catalog)
    view = RecordView(record)
    events = [e for e in view.log_events if e.get("kind") != "step"]  # steps: the step log
    steps = _StepIndex(view.step_log)
    segments = _segments(events, steps)
    steps.mark_redone([a for seg in segments for a in seg.attempts])
    # From the event too: the ledger the verdict reads is built while the status is "closing".
    failed_preflight = state.get("status") == "failed_preflight" or any(
        e.get("kind") == "preflight_failed" for e in events
    )
    activity_of = _black_box_activity(record, spec, events)
    c = _compute(segments, steps, events, activity_of, price, failed_preflight)
    run_end = max((float(r["end"]) for r in c.segments), default=0.0)
    after = after_run(record, spec, price, run_end, failed_preflight)
    detail, split_s = _close_split(c, after, failed_preflight)
    billed = c.billed
    nodes = max(spec.resources.nodes, 1)
    compute = _compute_section(c, detail, split_s, price, nodes, failed_preflight, events)
    compute_usd = compute["usd"]
    rate = price.storage_per_gib_month if price else 0.0
    storage = storage_of(record, spec, events, run_end, rate)
    human, switching = _people(record)
    gpus = spec.resources.gpus  # a CPU run (0) bills no GPU-seconds
    verdict = state.get("verdict")
    totals = {
        "compute_usd": compute_usd,
        "storage_usd": storage["usd"],
        "human_usd": round(sum(h["usd"] for h in human), 6),
        "switching_usd": round(sum(s["usd"] for s in switching), 6),
    }
    dead = dead_periods(events)  # record/liveness.py
    ledger: dict[str, Any] = {
        **stamp(),
        "schema": SCHEMA,
        "run_id": record.run_id,
        "name": state.get("name"),
        "status": state.get("status"),
        "created_at": state.get("created_at"),
        "built_at": now_iso(),
        "inputs": inputs,
        "price": _price_dict(price) if price else None,
        "priced": price is not None,
        "unpriced_reason": unpriced_why,
        "gpus": gpus,
        "segments": c.segments,
        # No supervisor from the last sign of life to `acceptrun resume`: not billed as
        # compute (a resume opens a new segment); shown apart (docs/architecture.md, "Cost").
        "after_run": after,
        "interrupted": {"periods": dead, "seconds": round(sum(p["seconds"] or 0 for p in dead), 3)},
        # A run refused before launch: the checks' wall time, not billed as compute.
        "preflight_refused_s": round(c.preflight_s, 3) if failed_preflight else None,
        "wall_s": round(c.wall, 6),
        "billed_s": round(billed, 6),
        "device_seconds": round(billed * gpus * nodes, 3),
        "nodes": nodes,
        "node_seconds": round(billed * nodes, 3),
        "node_seconds_wasted": round(split_s["wasted"] * nodes, 3),
        # The steps and time failures threw away, as the verdict, show and the report say
        # it (record/lost.py); "wasted" is billed time, that lost time and redone steps.
        "lost": lost_work([a.exit for seg in segments for a in seg.attempts if a.exit]).to_dict(),
        "compute": compute,
        "storage": storage,
        "human": human,
        "switching": switching,
        "totals": totals,
        "total_usd": round(sum(totals.values()), 6),
        "accepted": None if verdict is None else verdict == "accepted",
    }
    record.write_json(LEDGER_FILE, ledger)
    return ledger


def responsibility_of(a: _Attempt) -> tuple[str, dict[str, Any]]:
    """Whose failure an attempt's waste was (record.status.RESPONSIBILITY), and why.

    The evidence is the exit record's own: its class, the sentence and the lines that
    decided it, and whether the fault was injected: a drill's failure is the run's own
    doing, asked for, and booked to ``drill`` (never to the provider or ``unknown``).
    """
    ev = a.exit
    lines = [str(x) for x in ev.get("evidence") or []][:5]
    evidence: dict[str, Any] = {
        "class": a.klass,
        "outcome": a.outcome,
        "reason": ev.get("class_reason") or ev.get("reason"),
        "lines": lines,
        "injected": any(x.startswith("injected fault:") for x in lines),
        "started_at": ev.get("started_at"),
        "ended_at": ev.get("ended_at"),
    }
    if a.outcome in ("success", "running") and a.klass in (None, "success"):
        return Responsibility.NONE.value, evidence
    if evidence["injected"]:  # the run's own drill: booked as one, whatever its class
        return Responsibility.DRILL.value, evidence
    try:
        who = RESPONSIBILITY[FailureClass(str(a.klass))]
    except ValueError:  # no class (an attempt its supervisor lost) or one unknown here
        who = Responsibility.UNKNOWN
        evidence["reason"] = evidence["reason"] or f"no failure class (outcome {a.outcome})"
    return who.value, evidence


def _waste_by_responsibility(
    attempts: list[dict[str, Any]],
    split_s: dict[str, float],
    detail: dict[str, float],
    per_s: float,
    failed_preflight: bool,
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The wasted seconds and USD, split by whose failure they were.

    Each failed attempt's wasted seconds go to its responsibility; a failed preflight
    to ``unknown`` (a machine that does not match the spec may be the provider's or the
    spec's). What is left of ``wasted`` (a redone step counted in a kept attempt) goes
    to ``unknown`` too, so the three always sum to the split's ``wasted``.
    """
    seconds = dict.fromkeys(RESPONSIBLE, 0.0)
    for row in attempts:
        who = row["responsibility"]
        row["wasted_usd"] = round(row["split_s"]["wasted"] * per_s, 6)
        seconds[who if who in seconds else "unknown"] += row["split_s"]["wasted"]
    rest = split_s["wasted"] - sum(seconds.values())
    seconds["unknown"] += max(rest, 0.0)
    preflight = None
    if failed_preflight:
        why = next((e for e in events if e.get("kind") == "preflight_failed"), {})
        preflight = {
            "responsibility": "unknown",
            "seconds": round(detail.get("wasted.failed_preflight", 0.0), 3),
            "reason": "the machine did not pass the spec's preflight checks; the "
            "checks say which (acceptrun report)",
            "failed": why.get("failed") or why.get("checks"),
        }
    return {
        "seconds": {k: round(v, 6) for k, v in seconds.items()},
        "usd": {k: round(v * per_s, 6) for k, v in seconds.items()},
        "preflight": preflight,
        "rule": "each failed attempt's wasted time goes to its failure class's "
        "responsibility (record.status.RESPONSIBILITY); the rest to unknown",
    }


def after_run(
    record: RunRecord, spec: RunSpec, price: Price | None, run_end: float, failed_preflight: bool
) -> dict[str, Any]:
    """The machine after the run: booked when its stop time is recorded, else said to be
    not counted (never silently left out).

    acceptrun sees the run, not the machine: the supervisor's last event is the end of
    what it can time. A stop time recorded with ``acceptrun cost add RUN
    --machine-stopped-at WHEN`` books the tail from the run's end to it as idle. Without
    one the ledger says the tail is not counted, and what bounds it: the SkyPilot export's
    teardown (``skypilot.idle_minutes`` after the run, an estimate), or nothing.
    """
    stops = [
        float(e["at"])
        for e in read_jsonl(record.file(COST_FILE))
        if e.get("kind") == "machine_stop" and isinstance(e.get("at"), int | float)
    ]
    sky = spec.skypilot
    bound_s = sky.idle_minutes * 60.0 if sky.teardown in ("down", "managed") else None
    out: dict[str, Any] = {
        "counted": False,
        "seconds": None,
        "stopped_at": None,
        "estimate_max_s": bound_s,
        "estimate_max_usd": (
            round(compute_cost(bound_s, price) * max(spec.resources.nodes, 1), 6)
            if bound_s is not None and price
            else None
        ),
    }
    if stops and not failed_preflight and run_end > 0:
        at = max(stops)  # the latest word on it
        out.update(counted=True, seconds=round(max(0.0, at - run_end), 6), stopped_at=at)
        out["why"] = "the machine's stop time is recorded (acceptrun cost add --machine-stopped-at)"
        return out
    if sky.teardown == "keep":
        out["why"] = (
            "not counted: acceptrun does not see the machine after the run; skypilot.teardown = "
            "keep leaves a SkyPilot cluster up until `sky down`. Record when it stopped with "
            "`acceptrun cost add RUN --machine-stopped-at WHEN` to book it"
        )
    else:
        out["why"] = (
            "not counted: acceptrun does not see the machine after the run (a SkyPilot cluster "
            f"from `acceptrun export skypilot` goes down {sky.idle_minutes} min after it, "
            "a Slurm allocation and a Kubernetes pod end with it). Record when it stopped with "
            "`acceptrun cost add RUN --machine-stopped-at WHEN` to book it"
        )
    return out


def _parts(detail: dict[str, float]) -> dict[str, float]:
    """Detail keys folded into the four parts of the split."""
    parts = dict.fromkeys(PARTS, 0.0)
    for key, value in detail.items():
        parts[key.split(".")[0]] += value
    return parts


def _people(record: RunRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    human, switching = [], []
    for entry in read_jsonl(record.file(COST_FILE)):
        if entry.get("kind") == "human":
            minutes = float(entry.get("minutes") or 0.0)
            rate = float(entry.get("rate_per_hour") or 0.0)
            human.append({**entry, "usd": round(minutes / 60.0 * rate, 6)})
        elif entry.get("kind") == "switching":
            switching.append({**entry, "usd": float(entry.get("usd") or 0.0)})
    return human, switching
