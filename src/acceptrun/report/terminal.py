"""``acceptrun show RUN``: a run at a glance in the terminal, read from its record.

Besides the run's state, steps, metrics, attempts and verdict, it shows what the time
went to (from :func:`acceptrun.telemetry.summary.load_summary`: the summary.json a closed
run stored, else computed from the record): the breakdown with a bar
per part, step-time percentiles and drift, throughput and MFU, GPU and host peaks, and
the hints.
"""

from __future__ import annotations

from typing import Any

from acceptrun._util.controls import escape_controls
from acceptrun.cost.billing import format_bytes
from acceptrun.notify.summary import delivery_lines, delivery_rows
from acceptrun.record.glossary import MODEL_THROUGHPUT
from acceptrun.record.liveness import supervisor_state
from acceptrun.record.lost import lost_work
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord
from acceptrun.report.data import gpu_absent
from acceptrun.report.sections.inference import batch_lines
from acceptrun.report.sections.serving import serving_lines
from acceptrun.spec.model import format_duration
from acceptrun.telemetry.summary import Summary, load_summary
from acceptrun.verdict.core import Check, Verdict, format_verdict

__all__ = ["format_show", "format_telemetry", "show_dict"]

BAR_WIDTH = 24  # characters of the longest bar in the time breakdown
PART_NAMES = {
    "compute": "compute",
    "data_wait": "data wait",
    "checkpoint_stall": "checkpoint stall",
    "before_first_step": "to each first step",  # every attempt's launch to its first step
    "restarts": "restarts",
    "other": "other",
}


def format_show(record: RunRecord, *, explain: bool = False) -> str:
    """``acceptrun show``: the run, its steps and metrics, its attempts, what they lost,
    the telemetry, and the verdict, from what the record holds."""
    view = RecordView(record)  # run.json, events.jsonl and the exits, read once
    state = view.raw_state
    # The step figures come from the stored summary of a closed run, else from one pass
    # over the step log: never a dict per step.
    stored = load_summary(record.path, with_timelines=False)
    lines = _head_lines(record, state) + _step_lines(stored.steps, view)
    lines += _attempt_lines(view, state)
    if state.get("mode") == "tune":
        return printable("\n".join(lines + _format_tune(record)))
    lines += format_telemetry(stored.summary, gpu_absent(record))
    lines += batch_lines(record.read_json("inference.json"))  # batch inference runs only
    lines += serving_lines(record)  # serving runs only
    return printable("\n".join(lines + _verdict_lines(view, state, explain)))


def _head_lines(record: RunRecord, state: dict[str, Any]) -> list[str]:
    """The run's id, name, status (interrupted when its supervisor is gone) and record."""
    liveness = supervisor_state(record, state)  # record/liveness.py: derived, not written
    lines = [
        f"run      {record.run_id}",
        f"name     {state.get('name')}  ({state.get('mode', 'supervised')}, by {state.get('created_by', '?')})",
        f"status   {'interrupted' if liveness.gone else state.get('status')}  created {state.get('created_at')}  ended {state.get('ended_at') or '-'}",
        f"record   {record.path}",
    ]
    if liveness.gone:
        lines[3:3] = [
            f"         interrupted: {liveness.detail}; last sign of life {liveness.last_seen_iso}; "
            f"`acceptrun resume {record.run_id}` continues it"
        ]
    if output := _output_line(state):
        lines.append(output)
    return lines


def _step_lines(facts: dict[str, Any], view: RecordView) -> list[str]:
    """The steps (count, last, median time, data wait, loss) and the metrics logged."""
    lines = []
    if facts.get("steps"):
        parts = [f"{facts['steps']} logged, last step {facts.get('last_step')}"]
        median = facts.get("median_step_time")
        if median is not None:
            parts.append(f"median step {median * 1000:.1f} ms")
            total = facts.get("step_time_s") or 0.0
            if total > 0:
                parts.append(
                    f"data wait {100 * (facts.get('data_wait_s') or 0.0) / total:.1f}% of step time"
                )
        if facts.get("loss_first") is not None and facts.get("loss_last") is not None:
            parts.append(f"loss {facts['loss_first']:.4g} -> {facts['loss_last']:.4g}")
        lines.append(f"steps    {', '.join(parts)}")
    if metrics := view.metrics():
        scoped = view.per_attempt_metrics()  # one attempt's averages: said so
        lines.append(
            "metrics  "
            + ", ".join(
                (f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}")
                + (f" (attempt {scoped[k]} only)" if k in scoped else "")
                for k, v in metrics.items()
            )
        )
    return lines


def _attempt_lines(view: RecordView, state: dict[str, Any]) -> list[str]:
    """Each attempt's end, the work lost, the step axis's offsets, the progress warnings,
    the notifications and the events that lack a field."""
    lines = [
        f"attempt  {ex['attempt']}: {ex['reason']} after {format_duration(ex['duration_s'])} ({ex['outcome']})"
        for ex in view.attempts()
    ]
    if lost := _lost_line(state, view.attempts()):
        lines.append(lost)
    for ev in view.events("step_counter_restarted"):  # supervisor/axis.py
        lines.append(
            f"axis     attempt {ev.get('attempt')}'s step counter started again at "
            f"{ev.get('first_step')} after resuming from step {ev.get('resumed_from')}: its "
            f"steps are shown as the script's + {ev.get('offset')}"
        )
    for ev in view.events("progress_warning"):  # supervisor/counter.py: a counter went back
        if ev.get("reason") in ("restarted", "unordered", "dropped"):
            lines.append(f"progress attempt {ev.get('attempt')}: {ev.get('message')}")
    lines += delivery_lines(delivery_rows(view.events("notify")))  # notify/: time to detect
    if problems := view.event_problems():  # known events lacking a field: shown, not fatal
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        lines.append(f"events   {'; '.join(problems[:3])}{more}")
    return lines


def _verdict_lines(view: RecordView, state: dict[str, Any], explain: bool) -> list[str]:
    """The verdict as decided at close, or why there is none yet."""
    decided = view.verdict()  # a newer format raises RecordError naming the fix
    if decided is None:
        return [
            "",
            "verdict  not decided yet (the run is still going, or it was interrupted before closing)",
        ]
    checks = [Check(**c) for c in decided.checks]
    verdict = Verdict(str(decided.raw.get("run_id")), checks, str(decided.raw.get("decided_at")))
    return ["", format_verdict(verdict, name=str(state.get("name", "")), explain=explain)]


def _lost_line(state: dict[str, Any], attempts: list[dict[str, Any]]) -> str | None:
    """The work failed attempts lost, as close wrote it in run.json (record/lost.py); a
    run not closed yet sums its exit records with the same function. None: none failed."""
    if all(a.get("outcome") == "success" for a in attempts):
        return None
    work = state.get("work")
    if isinstance(work, dict) and isinstance(work.get("lost"), str):
        return f"lost     {work['lost']}"
    return f"lost     {lost_work(attempts).text()}"


def printable(text: str) -> str:
    """``text`` with control and bidi characters shown as ``\\x1b``, ``\\u202e`` (a name
    or metric from the record never moves the cursor, clears the screen, rewrites a line
    or reorders text on a terminal), also when the text is not printed by the CLI."""
    return escape_controls(text)


def _format_tune(record: RunRecord) -> list[str]:
    """A record of ``acceptrun tune``: its trials, the default, the best; no verdict."""
    data = record.read_json("tune.json")
    if not isinstance(data, dict):
        return ["tune     no tune.json (the sweep was interrupted before its first trial)"]
    trials = data.get("trials") or []

    def trial(n: Any) -> dict[str, Any] | None:
        return trials[n] if isinstance(n, int) and 0 <= n < len(trials) else None

    def rate(t: dict[str, Any] | None) -> str:
        if t is None or not t.get("ok"):
            return "failed"
        return f"{t['label']}: {t['samples_per_s']:,.1f} samples/s"

    base, best, gain = trial(data.get("baseline")), trial(data.get("best")), data.get("gain")
    ok = sum(1 for t in trials if t.get("ok"))
    lines = [
        f"tune     {data.get('target')} on {(data.get('device') or {}).get('name', '?')}: "
        f"{len(trials)} trials ({ok} ran) in {format_duration(data.get('seconds'))}",
        f"default  {rate(base)}",
        f"best     {rate(best)}"
        + (f", {gain:.2f}x the default" if isinstance(gain, int | float) else ""),
    ]
    lines += [f"note     {n}" for n in data.get("notes") or []]
    lines.append(f"trials   {record.path / 'tune.json'} (a tune record has no verdict)")
    return lines


_DECIDED_BY = {
    "acceptrun": "set by acceptrun",
    "env": "from the spec's [env]",
    "inherited": "inherited from acceptrun's environment",
    "off": "python_unbuffered = false",
}


def _output_line(state: dict[str, Any]) -> str | None:
    """How the job's Python output was buffered and who decided (supervisor/process.py)."""
    got = state.get("python_unbuffered")
    if not isinstance(got, dict):
        return None  # a record from before it was kept
    value, by = got.get("value"), _DECIDED_BY.get(str(got.get("by")), str(got.get("by"))[:40])
    if value:
        return f"output   PYTHONUNBUFFERED={str(value)[:20]} ({by}): Python prints are read live"
    return (
        f"output   PYTHONUNBUFFERED unset ({by}): a Python job's prints arrive in 8 KiB "
        "blocks, so the steps they show are dated late"
    )


def show_dict(record: RunRecord) -> dict[str, Any]:
    """What ``show --json`` prints: run.json, the verdict and the telemetry summary."""
    liveness = supervisor_state(record)
    return {
        "state": record.state,
        "supervisor": liveness.to_dict(),  # record/liveness.py: alive | gone | ended, derived
        "verdict": _decided(record),
        "summary": load_summary(record.path, with_timelines=False).summary.to_dict(),
    }


def _decided(record: RunRecord) -> dict[str, Any] | None:
    """verdict.json checked like every reader checks it (a newer format raises, naming it)."""
    decided = RecordView(record).verdict()
    return None if decided is None else decided.raw


def _bar(share: float) -> str:
    filled = round(max(0.0, min(share, 1.0)) * BAR_WIDTH)
    return "\u2588" * filled + "\u00b7" * (BAR_WIDTH - filled)


def _rate(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.1f}k"
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def format_telemetry(s: Summary, gpu_absent: str | None = None) -> list[str]:
    """The telemetry lines of ``show``: time, steps, speed, GPU, host, hints."""
    lines: list[str] = []
    if s.wall_s:
        first = (
            ""
            if s.first_step_s is None
            else f", attempt 1's first step after {format_duration(s.first_step_s)}"
        )
        lines.append(f"time     {format_duration(s.wall_s)} wall{first}")
        for part, name in PART_NAMES.items():
            seconds = s.breakdown.get(part, 0.0)
            share = seconds / s.wall_s
            lines.append(
                f"         {name:<18} {format_duration(seconds):>7} {100 * share:5.1f}%  {_bar(share)}"
            )
    if s.step_time:
        st = s.step_time
        text = (
            f"p50 {st['p50'] * 1000:.1f} ms, p90 {st['p90'] * 1000:.1f} ms, "
            f"p99 {st['p99'] * 1000:.1f} ms over {st['n']:.0f} steady steps"
        )
        if s.drift:
            text += f"; drift {100 * s.drift['change']:+.0f}% (first -> last quarter)"
        lines.append(f"step     {text}")
    if s.throughput:
        speed = ", ".join(f"{_rate(v)} {unit}" for unit, v in s.throughput.items())
        mfu = (
            f"; MFU {100 * s.mfu:.1f}%"
            if s.mfu is not None
            else "; MFU - (set telemetry.flops_per_sample or flops_per_token)"
        )
        lines.append(f"speed    {MODEL_THROUGHPUT} {speed} (median while stepping){mfu}")
    for g in s.gpus:
        parts = [f"util {g['util_mean']:.0f}% mean" if g.get("util_mean") is not None else "util -"]
        if g.get("mem_peak") is not None:
            total = f" of {format_bytes(g['mem_total'])}" if g.get("mem_total") else ""
            parts.append(f"memory peak {format_bytes(g['mem_peak'])}{total}")
        if g.get("power_capped_share") is not None:
            parts.append(f"power-capped {100 * g['power_capped_share']:.0f}%")
        if g.get("throttled_share") is not None:
            parts.append(f"throttled {100 * g['throttled_share']:.0f}%")
        if g.get("temp_max") is not None:
            parts.append(f"max {g['temp_max']:.0f} \u00b0C")
        if g.get("ecc_uncorrected"):
            parts.append(f"{g['ecc_uncorrected']:.0f} uncorrected ECC errors")
        lines.append(f"gpu {g['index']:<4} {g.get('name') or '?'}: {', '.join(parts)}")
    if not s.gpus and (gpu_absent is not None or s.host is not None):
        lines.append(f"gpu      no GPU ({gpu_absent})" if gpu_absent else "gpu      no GPU samples")
    if s.host:
        h, parts = s.host, []
        if h.get("cpu_mean") is not None:
            parts.append(f"machine CPU {h['cpu_mean']:.0f}% mean")
        if h.get("proc_cpu_mean") is not None:
            parts.append(f"workload {h['proc_cpu_mean'] / 100:.2f} cores mean")
        if h.get("proc_rss_peak") is not None:
            parts.append(f"workload memory peak {format_bytes(h['proc_rss_peak'])}")
        if h.get("mem_peak") is not None:
            total = f" of {format_bytes(h['mem_total'])}" if h.get("mem_total") else ""
            parts.append(f"machine memory peak {format_bytes(h['mem_peak'])}{total}")
        if h.get("free_min") is not None:
            parts.append(f"free disk min {format_bytes(h['free_min'])}")
        lines.append(f"host     {', '.join(parts) or 'no figures'}")
    if s.idle_share is not None:
        lines.append(f"idle     {100 * s.idle_share:.0f}% of the samples")
    for i, hint in enumerate(s.hints):
        lines.append(f"{'hints' if i == 0 else '':<8} - {hint}")
    return lines
