"""The HTML report's sections: the verdict banner, the tests, the charts, time, cost,
attempts, notifications, checkpoints, outputs, portability and provenance.

Each takes :func:`acceptrun.report.data.report_data`'s dict and returns its lines of
HTML; :func:`acceptrun.report.html.render_html` puts them in the page. Every string from
the record goes through :func:`esc`.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from acceptrun._util.controls import escape_controls
from acceptrun._util.units import finite_number, format_bytes
from acceptrun.cost.billing import format_usd
from acceptrun.record.glossary import DEVICE_IDLE, MODEL_THROUGHPUT, label
from acceptrun.record.liveness import status_text
from acceptrun.record.lost import LostWork
from acceptrun.record.status import CheckStatus
from acceptrun.record.workspace import frozen_spec
from acceptrun.report.svg import Mark, Series, line_chart, stacked_bar
from acceptrun.spec.model import format_duration
from acceptrun.verdict.core import PASS, check_mark

__all__ = [
    "attempts_html",
    "banner_html",
    "charts_html",
    "checkpoints_html",
    "cost_html",
    "esc",
    "notify_html",
    "outputs_html",
    "portability_html",
    "provenance_html",
    "tests_html",
    "time_html",
]


def esc(value: Any) -> str:
    """Text from a record, the index or a request, safe in HTML text and attributes;
    control and bidi characters shown as ``\\x1b``, ``\\u202e`` (visible, not acted on:
    a browser would reorder the text around a bidi control)."""
    return escape_controls(html.escape("" if value is None else str(value), quote=True))


def _bytes(n: Any) -> str:
    return format_bytes(n) if isinstance(n, int | float) else "-"


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return esc(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return esc(value)


def _clock(seconds: float) -> str:
    """Tick labels of time axes: seconds, minutes or hours, as precise as the ticks."""
    if abs(seconds) >= 7200:
        return f"{round(seconds / 3600, 2):g}h"
    if abs(seconds) >= 600:
        return f"{round(seconds / 60, 2):g}m"
    return f"{round(seconds, 2):g}s"


_STATUS_TEXT: dict[str, str] = {
    CheckStatus.PASS: "pass",
    CheckStatus.FAIL: "FAIL",
    CheckStatus.NOT_RECORDED: "not recorded",
}


def banner_html(data: dict[str, Any], label: str, accepted: bool) -> list[str]:
    verdict, state = data["verdict"], data["state"]
    failing = [
        c for c in verdict.get("checks", []) if c.get("required") and c.get("status") != PASS
    ]
    cls = "accepted" if accepted else "rejected"
    out = [f'<section class="banner {cls}" id="verdict"><div class="label">{esc(label)}</div>']
    facts = [
        f"status {status_text(state, data.get('supervisor'))}",  # interrupted: record/liveness.py
        f"{state.get('attempts', 0)} attempt(s)",
        f"created {state.get('created_at')} by {state.get('created_by')}",
    ]
    if isinstance(state.get("duration_s"), int | float):
        facts.append(f"ran {format_duration(float(state['duration_s']))}")
    if state.get("reproduces"):
        facts.append(f"reproduces {state['reproduces']}")
    out.append(f"<div>{esc(', '.join(facts))}</div>")
    if verdict.get("provisional"):
        out.append(f"<div>{esc(verdict.get('provisional_why', 'Provisional verdict.'))}</div>")
    if failing:
        out.append("<ul>")
        for c in failing:
            fix = f" Fix: {c.get('fix')}" if c.get("fix") else ""
            out.append(
                f"<li><b>{esc(c.get('name'))}</b> ({esc(_STATUS_TEXT.get(str(c.get('status')), c.get('status')))}): {esc(c.get('evidence'))}.{esc(fix)}</li>"
            )
        out.append("</ul>")
    out.append("</section>")
    return out


def tests_html(data: dict[str, Any]) -> list[str]:
    checks = data["verdict"].get("checks", [])
    out = ['<h2 id="tests">The acceptance tests</h2>']
    groups: dict[str, str] = data["groups"]
    known = list(groups) + sorted({str(c.get("group")) for c in checks} - set(groups))
    for group in known:
        rows = [c for c in checks if c.get("group") == group]
        if not rows:
            continue
        bad = sum(1 for c in rows if c.get("required") and c.get("status") != PASS)
        tag = (
            f'<span class="fail">{bad} failing</span>'
            if bad
            else '<span class="pass">all required pass</span>'
        )
        out.append(f"<h3>{esc(groups.get(group, group))} &middot; {tag}</h3>")
        out.append("<table><tr><th>check</th><th>status</th><th>evidence</th></tr>")
        rows.sort(key=lambda c: (c.get("status") == PASS, not c.get("required")))
        for c in rows:
            status = str(c.get("status"))
            word = check_mark(status, bool(c.get("required")))[1]
            text = word + ("" if c.get("required") or word == "info" else " (info)")
            cls = "info" if word == "info" else status
            evidence = esc(c.get("evidence"))
            if c.get("fix") and status != PASS:
                evidence += f'<div class="fix">fix: {esc(c.get("fix"))}</div>'
            out.append(
                f'<tr><td>{esc(c.get("name"))}</td><td class="{esc(cls)}">{esc(text)}</td><td>{evidence}</td></tr>'
            )
        out.append("</table>")
    return out


def _time_marks(data: dict[str, Any], origin: float) -> list[Mark]:
    marks = []
    for m in (data.get("timelines") or {}).get("marks", []):
        if isinstance(m.get("t"), int | float) and m.get("kind") != "attempt_start":
            marks.append(Mark(float(m["t"]) - origin, str(m.get("kind")), str(m.get("label", ""))))
    return marks


def _step_marks(data: dict[str, Any]) -> list[Mark]:
    """Checkpoints at their step; restarts at the step the next attempt resumed after."""
    marks = []
    tl = data.get("timelines") or {}
    steps = tl.get("steps", [])
    for m in tl.get("marks", []):
        kind = m.get("kind")
        if kind == "checkpoint":
            label = str(m.get("label", ""))
            try:
                marks.append(Mark(float(label.split()[-1]), "checkpoint", label))
            except (ValueError, IndexError):
                continue
        elif kind == "restart":
            before = [s for s in steps if isinstance(s.get("t"), int | float) and s["t"] <= m["t"]]
            if before and isinstance(before[-1].get("step"), int | float):
                marks.append(Mark(float(before[-1]["step"]), "restart", str(m.get("label", ""))))
    return marks


def charts_html(data: dict[str, Any]) -> list[str]:
    tl = data.get("timelines") or {}
    out = ['<h2 id="charts">Loss, throughput and the machine</h2>']
    steps = tl.get("steps", [])
    origin = data.get("origin_t")
    if origin is None and steps:
        origin = float(steps[0]["t"])
    origin = float(origin or 0.0)
    tmarks = _time_marks(data, origin)
    loss = [
        (float(s["step"]), float(s["loss"]))
        for s in steps
        if finite_number(s.get("loss")) is not None and finite_number(s.get("step")) is not None
    ]
    if loss:
        out.append(
            line_chart(
                [Series("loss", loss)],
                title="Loss",
                x_label="step",
                y_label="loss",
                marks=_step_marks(data),
            )
        )
    else:
        out.append('<p class="note">No loss was logged (run.log(step, loss=...)).</p>')
    unit_name = _throughput_unit(data)
    thr = _by_attempt(steps, origin, "throughput", 1.0)
    st = _by_attempt(steps, origin, "step_time", 1000.0)

    def timeline(series: list[Series], title: str, y_label: str, **kw: Any) -> str:
        return line_chart(
            series, title=title, x_label="time since launch", y_label=y_label,
            marks=tmarks, x_format=_clock, y_min=0, **kw,
        )  # fmt: skip

    if thr:
        out.append(timeline([Series(unit_name, thr)], f"Throughput ({unit_name})", unit_name))
    if st:
        out.append(timeline([Series("step time", st, "#7c3aed")], "Step time (ms)", "ms per step"))
    if not thr and not st:
        out.append('<p class="note">No timed steps were recorded (run.steps() times them).</p>')
    gpu = tl.get("gpu", [])
    if gpu:
        by_index: dict[Any, list[dict[str, Any]]] = {}
        for s in gpu:
            by_index.setdefault(s.get("index"), []).append(s)
        gpus = sorted(by_index.items(), key=lambda kv: str(kv[0]))

        def per_gpu(key: str, scale: float = 1.0) -> list[Series]:
            return [Series(f"GPU {i}", _points(ss, key, origin, scale)) for i, ss in gpus]

        out.append(timeline(per_gpu("util_pct"), "GPU utilization (%)", "%", y_max=100))
        out.append(timeline(per_gpu("mem_used", 2**-30), "GPU memory used (GiB)", "GiB"))
        power = per_gpu("power_w")
        if any(s.points for s in power):
            out.append(timeline(power, "GPU power (W)", "W"))
    else:
        why = data.get("gpu_absent") or "no GPU samples in telemetry.jsonl"
        out.append(f'<p class="note">No GPU timeline: {esc(why)}.</p>')
    host = tl.get("host", [])
    if host:
        cpu = [
            Series("machine CPU %", _points(host, "cpu_pct", origin)),
            Series("workload CPU % of one core", _points(host, "proc_cpu_pct", origin)),
        ]
        memory = [
            Series("machine memory used", _points(host, "mem_used", origin, 2**-30)),
            Series("workload RSS", _points(host, "proc_rss", origin, 2**-30)),
        ]
        out.append(timeline(cpu, "Host CPU", "%"))
        out.append(timeline(memory, "Host memory (GiB)", "GiB"))
    else:
        out.append('<p class="note">No host timeline: no host samples in telemetry.jsonl.</p>')
    return out


def _points(
    samples: list[dict[str, Any]], key: str, origin: float, scale: float = 1.0
) -> list[tuple[float, float]]:
    """(seconds since launch, value x scale) of the samples that have a finite ``key``."""
    return [
        (float(s["t"]) - origin, float(s[key]) * scale)
        for s in samples
        if finite_number(s.get(key)) is not None
    ]


def _by_attempt(
    steps: list[dict[str, Any]], origin: float, key: str, scale: float
) -> list[tuple[float, float]]:
    """(seconds since launch, value) of each step, with a gap (NaN) between attempts."""
    out: list[tuple[float, float]] = []
    attempt = None
    for s in steps:
        if finite_number(s.get(key)) is None:
            continue
        t = float(s["t"]) - origin
        if attempt is not None and s.get("attempt") != attempt:
            out.append((t, math.nan))
        attempt = s.get("attempt")
        out.append((t, scale * float(s[key])))
    return out


def _throughput_unit(data: dict[str, Any]) -> str:
    import contextlib

    from acceptrun.errors import SpecError
    from acceptrun.spec.model import AcceptanceSpec

    steps = (data.get("timelines") or {}).get("steps", [])
    spec_unit = AcceptanceSpec().throughput_unit  # a missing or damaged spec: the default
    with_unit = [s for s in steps if s.get("throughput") is not None]
    # no record in the report data (KeyError, TypeError) or a damaged spec: the default
    with contextlib.suppress(SpecError, KeyError, TypeError):
        spec_unit = frozen_spec(Path(data["record"]) / "spec.toml").acceptance.throughput_unit
    if not with_unit:
        return spec_unit
    rates = (data.get("summary") or {}).get("throughput") or {}
    return spec_unit if spec_unit in rates else "steps/s"


def time_html(data: dict[str, Any]) -> list[str]:
    summary = data.get("summary") or {}
    out = ['<h2 id="time">Where the time went</h2>']
    if summary.get("error"):
        return [*out, f'<p class="note">No telemetry summary: {esc(summary["error"])}</p>']
    bd = summary.get("breakdown") or {}
    parts = [(k, float(v)) for k, v in bd.items() if isinstance(v, int | float)]
    out.append(
        stacked_bar(
            parts,
            title=f"Wall time {format_duration(summary.get('wall_s') or 0.0)}",
            unit=lambda s: format_duration(s),
        )
    )
    rows = []
    st = summary.get("step_time") or {}
    if st:
        rows.append(
            (
                "step time",
                f"p50 {1000 * st['p50']:.1f} ms, p90 {1000 * st['p90']:.1f} ms, p99 {1000 * st['p99']:.1f} ms over {int(st['n'])} steady steps",
            )
        )
    if summary.get("throughput"):
        rows.append(
            (
                MODEL_THROUGHPUT,
                ", ".join(f"{v:.4g} {u}" for u, v in summary["throughput"].items())
                + " (median while stepping)",
            )
        )
    if summary.get("first_step_s") is not None:
        rows.append(
            ("first step", f"{format_duration(summary['first_step_s'])} after launch (attempt 1)")
        )
    if summary.get("data_wait_share") is not None:
        rows.append(("data wait", f"{100 * summary['data_wait_share']:.1f}% of step time"))
    if summary.get("idle_share") is not None:
        rows.append((DEVICE_IDLE, f"{100 * summary['idle_share']:.1f}% of samples"))
    if summary.get("mfu") is not None:
        rows.append(("MFU", f"{100 * summary['mfu']:.1f}%"))
    drift = summary.get("drift")
    if drift:
        rows.append(
            (
                "drift",
                f"median step {1000 * drift['first_p50']:.1f} ms in the first quarter, {1000 * drift['last_p50']:.1f} ms in the last ({100 * drift['change']:+.0f}%)",
            )
        )
    for g in summary.get("gpus") or []:
        util = g.get("util_mean")
        rows.append(
            (
                f"GPU {g.get('index')}",
                f"{g.get('name')}: mean utilization {util:.0f}%, memory peak {_bytes(g.get('mem_peak'))} of {_bytes(g.get('mem_total'))}, max {g.get('temp_max')} °C"
                if isinstance(util, int | float)
                else str(g.get("name")),
            )
        )
    host = summary.get("host")
    if host:
        rows.append(
            (
                "host",
                f"{host.get('samples')} samples; workload RSS peak {_bytes(host.get('proc_rss_peak'))}; least free disk {_bytes(host.get('free_min'))}",
            )
        )
    if rows:
        out.append(
            "<table>"
            + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
            + "</table>"
        )
    hints = summary.get("hints") or []
    if hints:
        out.append("<h3>Hints</h3><ul>" + "".join(f"<li>{esc(h)}</li>" for h in hints) + "</ul>")
    return out


def cost_html(data: dict[str, Any]) -> list[str]:
    ledger = data.get("ledger")
    out = ['<h2 id="cost">Cost</h2>']
    if not isinstance(ledger, dict):
        return [*out, '<p class="note">No ledger.json: the run has not closed.</p>']
    if not ledger.get("priced"):
        out.append(
            f'<p class="note">Not priced: {esc(ledger.get("unpriced_reason"))}. Set cost.price_per_hour or cost.provider/instance.</p>'
        )
    compute = ledger.get("compute") or {}
    split = compute.get("split_usd") or {}
    split_s = compute.get("split_s") or {}
    if ledger.get("priced"):
        out.append(
            stacked_bar(
                [(k, float(v)) for k, v in split.items()],
                title=f"Compute {format_usd(float(compute.get('usd', 0.0)))} USD",
                unit=lambda v: f"{format_usd(v)} USD",
            )
        )
    rows = [
        ("total", f"{format_usd(float(ledger.get('total_usd') or 0.0))} USD"),
        ("price", str((ledger.get("price") or {}).get("label", "-"))),
        (
            "billed",
            f"{format_duration(float(ledger.get('billed_s') or 0.0))} ({ledger.get('device_seconds')} device-seconds)",
        ),
    ]
    for k, v in split_s.items():
        rows.append(
            (
                f"compute: {label(k)}",
                f"{format_duration(float(v))}, {format_usd(float(split.get(k, 0.0)))} USD",
            )
        )
    totals = ledger.get("totals") or {}
    for k in ("storage_usd", "human_usd", "switching_usd"):
        if k in totals:
            rows.append((k.removesuffix("_usd"), f"{format_usd(float(totals[k]))} USD"))
    left = (ledger.get("storage") or {}).get("left_behind_monthly_usd")
    if isinstance(left, int | float):
        rows.append(("left behind", f"{format_usd(float(left))} USD per month"))
    out.append(
        "<table>"
        + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )
    return out


def attempts_html(data: dict[str, Any]) -> list[str]:
    out = ['<h2 id="attempts">Attempts</h2>']
    attempts = data.get("attempts") or []
    if not attempts:
        return [*out, '<p class="note">No attempt ran (see preflight).</p>']
    out.append(
        "<table><tr><th>#</th><th>outcome</th><th>class</th><th>duration</th><th>work</th><th>evidence</th></tr>"
    )
    for a in attempts:
        work = a.get("work") or {}
        done = f"{work.get('steps_done', '-')} steps"
        if a.get("outcome") != "success":  # exact, bounded or unknown: record/lost.py
            lost = LostWork.of_work(work)
            done += f", lost {lost.steps_text()} ({lost.seconds_text()})"
        evidence = a.get("evidence") or [a.get("reason")]
        reason = a.get("class_reason") or a.get("reason")
        cls = "pass" if a.get("outcome") == "success" else "fail"
        out.append(
            f'<tr><td>{esc(a.get("attempt"))}</td><td class="{cls}">{esc(a.get("outcome"))}</td>'
            f'<td>{esc(a.get("class"))}<div class="muted">{esc(reason)}</div></td>'
            f"<td>{esc(format_duration(float(a.get('duration_s') or 0.0)))}</td><td>{esc(done)}</td>"
            f"<td>{'<br>'.join(f'<code>{esc(x)}</code>' for x in evidence)}</td></tr>"
        )
    out.append("</table>")
    return out


def notify_html(data: dict[str, Any]) -> list[str]:
    """Who was told what, and how long after the condition was recorded (time to detect)."""
    rows = data.get("notify") or []
    if not rows:
        return []  # no [notify] targets, or nothing to tell
    out = [
        '<h2 id="notify">Notifications</h2>',
        '<p class="muted">Time to detect: from the condition\'s own recorded time to the '
        "delivery, measured.</p>",
        "<table><tr><th>event</th><th>target</th><th>outcome</th><th>tries</th>"
        "<th>time to detect</th></tr>",
    ]
    for r in rows:
        ok = r["outcome"] == "delivered"
        ttd = r.get("time_to_detect_s")
        shown = f"{ttd:.3f} s" if ok and isinstance(ttd, int | float) else "-"
        outcome = r["outcome"] if ok else f"{r['outcome']}: {r.get('error') or 'no reason'}"
        out.append(
            f"<tr><td>{esc(r['event'])}</td><td><code>{esc(r['target'])}</code></td>"
            f'<td class="{"pass" if ok else "fail"}">{esc(outcome)}</td>'
            f"<td>{esc(r.get('attempts'))}</td><td>{esc(shown)}</td></tr>"
        )
    out.append("</table>")
    return out


def checkpoints_html(data: dict[str, Any]) -> list[str]:
    ck = data.get("checkpoints") or {}
    out = ['<h2 id="checkpoints">Checkpoints</h2>']
    rows = ck.get("kept") or []
    summary = f"{ck.get('committed', 0)} committed, {len(rows)} kept in {ck.get('dir')}"
    if ck.get("mirror"):
        summary += f", mirrored to {ck.get('mirror')}"
    if ck.get("quarantined"):
        summary += f"; quarantined: {', '.join(ck['quarantined'])}"
    out.append(f"<p>{esc(summary)}</p>")
    if rows:
        out.append(
            "<table><tr><th>step</th><th>created</th><th>size</th><th>files</th><th>mirror</th><th>metrics</th></tr>"
        )
        for r in rows:
            latest = " (LATEST)" if r["step"] == ck.get("latest") else ""
            metrics = ", ".join(f"{k} {_num(v)}" for k, v in (r.get("metrics") or {}).items())
            out.append(
                f'<tr><td class="num">{esc(r["step"])}{esc(latest)}</td><td>{esc(r["created_at"])}</td>'
                f'<td class="num">{esc(_bytes(r["bytes"]))}</td><td class="num">{esc(r["files"])}</td>'
                f"<td>{esc(r.get('mirror') or '-')}</td><td>{esc(metrics)}</td></tr>"
            )
        out.append("</table>")
    return out


def outputs_html(data: dict[str, Any]) -> list[str]:
    out = ['<h2 id="outputs">Outputs and their lineage</h2>']
    metrics = data.get("metrics") or {}
    scoped = data.get("per_attempt_metrics") or {}  # one attempt's averages: said so
    if metrics:
        out.append(
            "<table><tr><th>metric</th><th>final value</th></tr>"
            + "".join(
                f'<tr><td>{esc(k)}</td><td class="num">{_num(v)}'
                + (f" (attempt {esc(str(scoped[k]))} only)" if k in scoped else "")
                + "</td></tr>"
                for k, v in metrics.items()
            )
            + "</table>"
        )
    outputs = data.get("outputs") or []
    if not outputs:
        return [*out, '<p class="note">No output was registered (run.output(name, path)).</p>']
    for o in outputs:
        commit = o.get("commit") or "not under git"
        if o.get("dirty"):
            commit = f"{commit} + uncommitted diff {o.get('diff_hash')}"
        rows = [
            ("file", f"{o.get('path')} ({_bytes(o.get('size'))})"),
            ("hash", o.get("hash")),
            ("code", commit),
            ("made by", f"attempt {o.get('attempt')} on {o.get('host')}"),
            ("GPU", o.get("gpu") or "none (CPU)"),
            ("driver / CUDA", f"{o.get('driver') or 'none'} / {o.get('cuda') or 'none'}"),
            ("torch / Python", f"{o.get('torch') or 'none'} / {o.get('python') or '?'}"),
        ]
        out.append(
            f"<h3>{esc(o.get('name'))}</h3><table>"
            + "".join(f"<tr><th>{esc(k)}</th><td><code>{esc(v)}</code></td></tr>" for k, v in rows)
            + "</table>"
        )
    return out


def portability_html(data: dict[str, Any]) -> list[str]:
    port = data.get("portability") or {}
    out = ['<h2 id="portability">Portability</h2>']
    if port.get("error"):
        return [*out, f'<p class="note">Not checked: {esc(port["error"])}</p>']
    findings = port.get("findings") or []
    if not findings:
        return [*out, "<p>Nothing ties this run to one provider or machine.</p>"]
    out.append(
        f"<p>{esc(port.get('blockers', 0))} blocker(s), {esc(port.get('warnings', 0))} warning(s). Repeat it elsewhere with <code>acceptrun howto {esc(data['run_id'])}</code>.</p>"
    )
    out.append(
        "<table><tr><th>severity</th><th>where</th><th>value</th><th>why, and the step that moves it</th></tr>"
    )
    for f in findings:
        cls = {"blocker": "fail", "warning": "not_recorded"}.get(str(f.get("severity")), "muted")
        out.append(
            f'<tr><td class="{cls}">{esc(f.get("severity"))}</td><td>{esc(f.get("where"))}</td>'
            f'<td><code>{esc(f.get("value"))}</code></td><td>{esc(f.get("why"))}<div class="fix">{esc(f.get("fix"))}</div></td></tr>'
        )
    out.append("</table>")
    return out


def provenance_html(data: dict[str, Any]) -> list[str]:
    out = ['<h2 id="provenance">Provenance</h2>']
    text = data.get("provenance_text")
    if not text:
        return [*out, '<p class="note">No provenance.json: the run stopped before preflight.</p>']
    return [*out, f"<pre>{esc(text)}</pre>"]
