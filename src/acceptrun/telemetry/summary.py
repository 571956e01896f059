"""What a run's time went to, read back from its record: breakdown, percentiles, hints.

:func:`summarize` reads only the record (the step log, ``events.jsonl``,
``telemetry.jsonl``, ``attempts/*/exit.json``, ``run.json``, ``spec.toml``,
``provenance.json``) and never raises on a missing, partial or torn file: what cannot be
computed is None. Steps are read in chunks of arrays (record/steplog.py), never as one
object per step. A closed run stores the summary in ``summary.json``
(:func:`pending_summary`, computed once at close for the verdict to judge, then
written); ``acceptrun show`` and the report read it through :func:`load_summary`.

Its rooms: telemetry/inputs.py reads the record's files, telemetry/steps.py is the one
pass over the steps, telemetry/figures.py the statistics over the steady steps,
telemetry/timelines.py the chart series; this module adds the machine (GPUs, host, idle),
the breakdown and the stored summary.

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

import copy
import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json, write_json_atomic
from acceptrun._util.units import finite_number as num
from acceptrun._version import __version__
from acceptrun.record.steplog import StepLog
from acceptrun.telemetry.figures import figures
from acceptrun.telemetry.hints import Evidence, make_hints
from acceptrun.telemetry.inputs import RunFiles, black_box, json_step_count, read_run
from acceptrun.telemetry.peaks import peak_tflops
from acceptrun.telemetry.steps import Attempt, NotWholeUs, Steps, read_steps, spans
from acceptrun.telemetry.timelines import chart_series

__all__ = [
    "BREAKDOWN_PARTS",
    "SUMMARY_FILE",
    "PendingSummary",
    "Stored",
    "Summary",
    "load_summary",
    "pending_summary",
    "summarize",
]

BREAKDOWN_PARTS = (
    "compute",
    "data_wait",
    "checkpoint_stall",
    "before_first_step",
    "restarts",
    "other",
)
# NVML clock event names (sw_power_cap, hw_slowdown, hw_thermal_slowdown, ...): which
# count as power-capped and which as thermal or hardware throttling.
POWER_CAP_MARK = "power_cap"
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


# ---- the machine: GPUs and host -------------------------------------------------------------


def _mfu(throughput: dict[str, float], rec: RunFiles, gpu_name: str | None) -> float | None:
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


def _gpu_name(rec: RunFiles) -> str | None:
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
    return [v for v in (num(s.get(key)) for s in samples) if v is not None]


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
        util = num(s.get("util_pct"))
        if s.get("kind") == "gpu" and util is not None:
            by_index[s.get("index")].append(util)
    if by_index:
        shares = [sum(1 for u in us if u < threshold) / len(us) for us in by_index.values()]
        return statistics.fmean(shares), "gpu"
    cpu = [
        v for v in (num(s.get("proc_cpu_pct")) for s in samples if s.get("kind") == "host") if v is not None
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
    attempts: list[Attempt],
    steps: Steps,
    start: float,
    end: float,
    samples: list[dict[str, Any]] | None,
    threshold: float,  # telemetry.idle_threshold of the spec
) -> _Breakdown:
    parts = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
    no_client = samples is not None and black_box(events)
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
        if not a.steps and no_client and not a.client:
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
    for k in ("compute", "data_wait", "restarts"):  # the steps' own time (see read_steps)
        parts[k] += steps.parts[k]
    stall = sum(
        num(ev.get("stall_s")) or 0.0 for ev in events if ev.get("kind") == "checkpoint_stage"
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
    return _summarize(read_run(Path(run_dir)))[0]


def _summarize(rec: RunFiles, *, whole: bool = True) -> tuple[Summary, dict[str, Any]]:
    """The summary, and the step facts ``show`` prints (count, last step, median, loss).

    ``whole=False`` holds every steady step time in float64 even when they are whole
    microseconds (the tests prove the two give the same figures)."""
    events = [ev for ev in rec.events if ev.get("kind") != "step"]
    log = rec.log
    steps, by_number = _all_steps(rec, events, whole)
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
    figs = figures(steps, [a.number for a in attempts], log)
    throughput = figs["throughput"]
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
        step_time=figs["step_time"],
        drift=figs["drift"],
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
            black_box=black_box(rec.events),
        ),
    )
    return summary, _step_facts(steps, bd, with_steps, figs["median_all"])


def _all_steps(
    rec: RunFiles, events: list[dict[str, Any]], whole: bool
) -> tuple[Steps, dict[int, Attempt]]:
    """Every step read once (telemetry/steps.py), and the attempts with their aggregates."""
    expected = rec.log.count() + json_step_count(rec.events)
    by_number = spans(events)
    fresh = copy.deepcopy(by_number)
    try:
        if not whole:
            raise NotWholeUs
        return read_steps(rec.log, expected, by_number), by_number
    except NotWholeUs:  # a record written by hand: every steady time in float64
        return read_steps(rec.log, expected, fresh, whole=False), fresh


def _step_facts(
    steps: Steps, bd: _Breakdown, with_steps: list[Attempt], median_all: float | None
) -> dict[str, Any]:
    """What ``show`` prints of the steps: count, redone, last step, median, time, loss."""
    losses = [a for a in with_steps if a.loss_first is not None]
    return {
        "steps": steps.count,
        "steps_redone": bd.steps_redone,
        "last_step": with_steps[-1].last_step if with_steps else None,
        "median_step_time": median_all,
        "step_time_s": steps.all_seconds,
        "data_wait_s": steps.all_wait,
        "loss_first": losses[0].loss_first if losses else None,
        "loss_last": losses[-1].loss_last if losses else None,
    }


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


@dataclass
class PendingSummary:
    """A summary computed for summary.json and not yet written: close computes it once,
    its verdict judges :attr:`summary`, and :meth:`write` stores it after close's own
    events."""

    run_dir: Path
    summary: Summary
    data: dict[str, Any]
    """summary.json's content, its ``computed_from`` taken before the record was read."""

    def write(self) -> Path:
        """Store summary.json, current for readers of the closed run.

        Events appended since the summary was computed are the run's closing (the
        verdict, notifications, a part of closing that failed), not its time: the
        summary stands, stamped with the events as they are now. Steps or telemetry that
        changed since leave the first stamp, so readers find it stale and compute it.
        """
        source, now = self.data["computed_from"], _computed_from(self.run_dir)
        if all(source[name] == now[name] for name in ("step_records", "telemetry_bytes")):
            source = now
        target = self.run_dir / SUMMARY_FILE
        write_json_atomic(target, {**self.data, "computed_from": source})
        return target


def pending_summary(record_path: Path) -> PendingSummary:
    """Compute the summary and the chart series once, for summary.json (see
    :class:`PendingSummary`); readers take the stored file through :func:`load_summary`."""
    run_dir = Path(record_path)
    source = _computed_from(run_dir)  # before reading: a later change makes it stale
    rec = read_run(run_dir)
    summary, facts = _summarize(rec)
    data = {
        "format": SUMMARY_FORMAT,
        "acceptrun_version": __version__,  # which acceptrun computed these figures
        "computed_from": source,
        "summary": summary.to_dict(),
        "step_facts": facts,
        "timelines": chart_series(rec),
    }
    return PendingSummary(run_dir, summary, data)


def load_summary(run_dir: Path, *, with_timelines: bool = True) -> Stored:
    """The stored summary of a closed run when it is current, else one computed now.

    A run still going (status created, preflight, running or closing), a summary.json
    missing, damaged, of another format or computed from other steps or events: computed.
    """
    run_dir = Path(run_dir)
    stored = _read_stored(run_dir)
    if stored is not None:
        return stored
    rec = read_run(run_dir)
    summary, facts = _summarize(rec)
    return Stored(summary, chart_series(rec) if with_timelines else None, facts, False)


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
