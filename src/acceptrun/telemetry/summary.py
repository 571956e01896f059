"""What a run's time went to, read back from its record: breakdown, percentiles, hints.

:func:`summarize` reads only the record (``events.jsonl``, ``telemetry.jsonl``,
``attempts/*/exit.json``, ``run.json``, ``spec.toml``, ``provenance.json``) and never
raises on a missing, partial or torn file: what cannot be computed is None. It is what
``acceptrun show``, the HTML report and the verdict read.

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
import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json, read_jsonl
from acceptrun.record.view import AttemptSpan, attempt_spans
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.telemetry.hints import Evidence, make_hints
from acceptrun.telemetry.peaks import peak_tflops

__all__ = [
    "BREAKDOWN_PARTS",
    "DRIFT_MIN_STEPS",
    "WARMUP_STEPS",
    "Summary",
    "summarize",
    "timelines",
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
    events: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    spec: RunSpec  # the frozen spec; a default one when it is missing or damaged
    provenance: dict[str, Any]


def _load(run_dir: Path) -> _Record:
    """Everything summarize reads; a missing or damaged file reads as empty."""
    events = _timed(read_jsonl(run_dir / "events.jsonl"))
    samples = _timed(read_jsonl(run_dir / "telemetry.jsonl"))
    spec = RunSpec(name="-", command=["-"])  # every section at its defaults
    with contextlib.suppress(Exception):  # a damaged spec: defaults, never an exception
        spec = load_spec(run_dir / "spec.toml")
    provenance: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        found = read_json(run_dir / "provenance.json")
        provenance = found if isinstance(found, dict) else {}
    return _Record(events, samples, spec, provenance)


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


def _span(step: dict[str, Any]) -> int:
    """Steps one event stands for: ``span`` of a log line every N steps, else 1."""
    span = step.get("span")
    return span if isinstance(span, int) and not isinstance(span, bool) and span > 0 else 1


def _black_box(events: list[dict[str, Any]]) -> bool:
    """True when the launch recorded a command that does not use the client API."""
    usage = next((ev for ev in events if ev.get("kind") == "usage"), None)
    return usage is not None and usage.get("usage") != "client"


def _redone(attempts: list[AttemptSpan]) -> set[tuple[int, int]]:
    """(attempt, step) of steps that a later attempt ran again: work thrown away."""
    latest: dict[Any, int] = {}
    for a in attempts:
        for s in a.steps:
            latest[s.get("step")] = max(latest.get(s.get("step"), a.number), a.number)
    return {
        (a.number, int(s.get("step", -1)))
        for a in attempts
        for s in a.steps
        if latest.get(s.get("step"), a.number) > a.number
    }


def _step_start(step: dict[str, Any]) -> float:
    """When a step began: its event is written at its end, after ``step_time``."""
    return float(step["t"]) - (_num(step.get("step_time")) or 0.0)


# ---- figures --------------------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; ``q`` in 0..1."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _steady(attempts: list[AttemptSpan]) -> list[dict[str, Any]]:
    """Timed steps without each attempt's warm-up; all timed steps if that leaves none."""
    timed = [[s for s in a.steps if (_num(s.get("step_time")) or 0) > 0] for a in attempts]
    steady = [s for steps in timed for s in steps[WARMUP_STEPS:]]
    return steady or [s for steps in timed for s in steps]


def _step_time(steady: list[dict[str, Any]]) -> dict[str, float] | None:
    times = sorted(float(s["step_time"]) for s in steady)
    if not times:
        return None
    return {
        "p50": _percentile(times, 0.50),
        "p90": _percentile(times, 0.90),
        "p99": _percentile(times, 0.99),
        "mean": statistics.fmean(times),
        "n": float(len(times)),
    }


def _drift(steady: list[dict[str, Any]]) -> dict[str, float] | None:
    times = [float(s["step_time"]) for s in sorted(steady, key=lambda s: float(s["t"]))]
    if len(times) < DRIFT_MIN_STEPS:
        return None
    q = len(times) // 4
    first, last = statistics.median(times[:q]), statistics.median(times[-q:])
    if first <= 0:
        return None
    return {"first_p50": first, "last_p50": last, "change": last / first - 1.0}


def _throughput(steady: list[dict[str, Any]]) -> dict[str, float]:
    rates: dict[str, list[float]] = defaultdict(list)
    for s in steady:
        st = float(s["step_time"])
        for unit, key in (("samples/s", "samples"), ("tokens/s", "tokens")):
            amount = _num(s.get(key))
            if amount is not None:
                rates[unit].append(amount / st)
        rates["steps/s"].append(1.0 / st)
    return {unit: statistics.median(values) for unit, values in rates.items()}


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
    attempts: list[AttemptSpan],
    start: float,
    end: float,
    samples: list[dict[str, Any]] | None,
    threshold: float,  # telemetry.idle_threshold of the spec
) -> _Breakdown:
    parts = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
    black_box = samples is not None and _black_box(events)
    redone = _redone(attempts)
    restart_into = {ev.get("attempt") for ev in events if ev.get("kind") == "restart"}
    first_wait: float | None = None
    for i, a in enumerate(attempts):
        origin = start if i == 0 else a.start
        a_end = a.end if a.end is not None else (float(a.steps[-1]["t"]) if a.steps else end)
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
        wait = max(0.0, _step_start(a.steps[0]) - origin)
        parts["before_first_step"] += wait
        if i == 0:
            first_wait = wait
        for s in a.steps:
            st = (_num(s.get("step_time")) or 0.0) * _span(s)
            if (a.number, int(s.get("step", -1))) in redone:
                parts["restarts"] += st
                continue
            dw = min(_num(s.get("data_wait")) or 0.0, st)
            parts["data_wait"] += dw
            parts["compute"] += st - dw
        if followed:  # a failed attempt's time after its last step is lost work
            parts["restarts"] += max(0.0, a_end - float(a.steps[-1]["t"]))
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
        steps_redone=len(redone),
        first_attempt_wait=first_wait,
    )


# ---- the API ---------------------------------------------------------------------------------


def summarize(run_dir: Path) -> Summary:
    """Summarize one run record; fields it cannot compute are None, never an exception.

    >>> summarize(record.path).breakdown
    {'compute': 41.2, 'data_wait': 3.1, 'checkpoint_stall': 0.4, ...}
    """
    rec = _load(Path(run_dir))
    events = rec.events
    steps = [ev for ev in events if ev.get("kind") == "step"]
    run_start = next((float(ev["t"]) for ev in events if ev.get("kind") == "run_start"), None)
    start = run_start if run_start is not None else (float(events[0]["t"]) if events else None)
    end = max((float(ev["t"]) for ev in events), default=None)
    wall = None if start is None or end is None else max(0.0, end - start)
    first_step_s = (
        max(0.0, float(steps[0]["t"]) - run_start) if steps and run_start is not None else None
    )
    attempts = attempt_spans(events)  # record/view.py
    threshold = rec.spec.telemetry.idle_threshold
    if start is not None and end is not None:
        bd = _breakdown(events, attempts, start, end, rec.samples, threshold)
    else:
        bd = _Breakdown(dict.fromkeys(BREAKDOWN_PARTS, 0.0), 0, 0, None)
    steady = _steady(attempts)
    throughput = _throughput(steady)
    timed = [s for s in steps if (_num(s.get("step_time")) or 0) > 0]
    total_step = sum(float(s["step_time"]) * _span(s) for s in timed)
    data_wait_share = None
    if total_step > 0 and any("data_wait" in s for s in timed):
        data_wait_share = sum(_num(s.get("data_wait")) or 0.0 for s in timed) / total_step
    idle_share, idle_source = _idle(rec.samples, threshold)
    gpu_name = _gpu_name(rec)
    summary = Summary(
        steps=len(steps),
        first_step_s=first_step_s,
        wall_s=wall,
        breakdown=bd.parts,
        step_time=_step_time(steady),
        drift=_drift(steady),
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
            first_attempt_wait=bd.first_attempt_wait,
            step_seconds=total_step,
            idle_threshold=threshold,
            idle_source=idle_source,
            xids=[s for s in rec.samples if s.get("kind") == "xid"],
        ),
    )
    return summary


def timelines(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Series for charts: steps, host and GPU samples, and marks (restarts, checkpoints...).

    Each step carries ``throughput`` in the spec's ``acceptance.throughput_unit`` when
    the step logged that quantity, else in steps/s.
    """
    rec = _load(Path(run_dir))
    unit = rec.spec.acceptance.throughput_unit
    key = {"samples/s": "samples", "tokens/s": "tokens"}.get(unit)
    steps: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []
    for ev in rec.events:
        kind = ev.get("kind")
        if kind == "step":
            st = _num(ev.get("step_time"))
            amount = _num(ev.get(key)) if key else None
            rate = None
            if st:
                rate = (amount if amount is not None else 1.0) / st
            steps.append(
                {
                    "t": ev["t"],
                    "step": ev.get("step"),
                    "attempt": ev.get("attempt"),
                    "step_time": st,
                    "loss": _num(ev.get("loss")),
                    "throughput": rate,
                }
            )
        elif kind in ("restart", "attempt_start", "attempt_exit", "idle"):
            marks.append({"t": ev["t"], "kind": kind, "label": _mark_label(ev)})
        elif kind == "checkpoint_commit":
            marks.append({"t": ev["t"], "kind": "checkpoint", "label": f"step {ev.get('step')}"})
    return {
        "steps": steps,
        "host": [s for s in rec.samples if s.get("kind") == "host"],
        "gpu": [s for s in rec.samples if s.get("kind") == "gpu"],
        "marks": marks,
    }


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
