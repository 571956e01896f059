"""``acceptrun report RUN``: one self-contained HTML file that explains a run.

:func:`report_data` gathers everything from the record (verdict, telemetry summary and
timelines, ledger, provenance, attempts, checkpoints, outputs and their lineage,
portability); :func:`render_html` turns it into one file with inline CSS and inline SVG
charts (:mod:`acceptrun.report.svg`): no script, no font, no image is fetched, so it
opens the same from a laptop, a CI artifact or an air-gapped cluster. Every string that
comes from the record is escaped. ``--format md`` (:mod:`acceptrun.report.markdown`)
renders the same data as Markdown and ``--format json`` prints the data itself.

>>> path = write_report(ws.get_run("latest"))
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from acceptrun._util.controls import escape_controls
from acceptrun._util.durable import write_atomic
from acceptrun._util.units import format_bytes
from acceptrun.capture import provenance as provmod
from acceptrun.cost.billing import format_usd
from acceptrun.notify.summary import delivery_rows
from acceptrun.record.glossary import DEVICE_IDLE, MODEL_THROUGHPUT, label
from acceptrun.record.liveness import status_text, supervisor_state
from acceptrun.record.lost import LostWork
from acceptrun.record.status import RUN_CLOSED, RUN_LIVE, CheckStatus
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord, frozen_spec
from acceptrun.report.sections.inference import batch_html
from acceptrun.report.sections.serving import serving_html
from acceptrun.report.svg import Mark, Series, line_chart, stacked_bar
from acceptrun.spec.model import format_duration
from acceptrun.verdict.core import GROUPS, PASS, check_mark

__all__ = ["REPORT_FILE", "render_html", "report_data", "write_report"]

REPORT_FILE = "report.html"
SCHEMA = 1


# ---- the data ---------------------------------------------------------------------------------


def _verdict(record: RunRecord, view: RecordView) -> dict[str, Any]:
    """verdict.json as decided at close; a run not closed yet is decided now (and says so).

    A closed run is never decided again here: without its verdict.json it shows none.
    """
    decided = view.verdict()  # a newer format raises RecordError naming the fix
    if decided is not None:
        return {**decided.raw, "provisional": False}
    if record.state.get("status") in RUN_CLOSED:
        why = (
            f"{record.file('verdict.json')} is missing from this closed run: its verdict was "
            "decided once, at close, and is not decided again here (not accepted). Restore "
            "verdict.json from a copy of the record."
        )
        return {"accepted": False, "checks": [], "provisional": True, "provisional_why": why}
    from acceptrun.verdict.decide import compute_verdict

    why = "The run has not closed: this verdict was computed now, from the record so far."
    return {**compute_verdict(record).to_dict(), "provisional": True, "provisional_why": why}


def _checkpoints(record: RunRecord, view: RecordView) -> dict[str, Any]:
    from acceptrun.checkpoint.owner import StoreOwnedError, open_run_store, store_root

    try:
        spec = record.spec
        root = store_root(record, spec)  # checkpoint.dir/<run id>/ (or an older record's dir)
        mirror = spec.checkpoint.mirror
    except Exception:  # a spec that no longer loads: the default place
        root, mirror = record.checkpoints_dir, None
    mirror_steps = (record.read_json("mirror.json") or {}).get("steps", {})
    rows = []
    try:  # the run's own store; another run's steps are none of this run's
        store = open_run_store(record, root=root, retention=False)
        infos, latest = store.list(), store.latest()
    except StoreOwnedError:
        infos, latest = [], None
    for info in infos:
        rows.append(
            {
                "step": info.step,
                "created_at": info.created_at,
                "bytes": info.total_bytes,
                "files": len(info.files),
                "metrics": info.metrics,
                "mirror": (mirror_steps.get(str(info.step)) or {}).get("state") if mirror else None,
            }
        )
    quarantine = root / "quarantine"
    quarantined = sorted(p.name for p in quarantine.iterdir()) if quarantine.is_dir() else []
    commits = len(view.checkpoints().committed)
    return {
        "dir": str(root),
        "mirror": mirror,
        "latest": latest.step if latest else None,
        "kept": rows,
        "committed": commits,
        "quarantined": quarantined,
    }


def _lineage(record: RunRecord, prov: dict[str, Any]) -> list[dict[str, Any]]:
    """Each output with what produced it: hash, commit, GPU, driver, CUDA, torch, host."""
    git = prov.get("git") or {}
    gpus = prov.get("gpus") or {}
    torch = prov.get("torch") or {}
    host = prov.get("host") or {}
    python = prov.get("python") or {}
    names = sorted({str(d.get("name")) for d in gpus.get("devices") or []})
    out: dict[str, dict[str, Any]] = {}
    for ev in record.events("output"):
        out[str(ev.get("name"))] = {
            "name": ev.get("name"),
            "path": ev.get("path"),
            "hash": ev.get("hash"),
            "size": ev.get("size"),
            "attempt": ev.get("attempt"),
            "t": ev.get("t"),
            "commit": None if git.get("absent") else git.get("commit"),
            "dirty": None if git.get("absent") else git.get("dirty"),
            "diff_hash": git.get("diff_hash") if git.get("dirty") else None,
            "gpu": ", ".join(names) if names else None,
            "driver": gpus.get("driver"),
            "cuda": torch.get("cuda"),
            "torch": torch.get("version"),
            "python": python.get("version"),
            "host": host.get("hostname"),
        }
    return list(out.values())


def _summary_and_timelines(record: RunRecord) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    try:
        from acceptrun.telemetry.summary import load_summary

        stored = load_summary(record.path)  # summary.json of a closed run, else computed
        return stored.summary.to_dict(), stored.timelines or {}
    except Exception as exc:  # the report still shows everything else
        return {"error": f"{type(exc).__name__}: {exc}"}, {}


def _portability_data(record: RunRecord, state: dict[str, Any]) -> dict[str, Any]:
    """portability.json as written at close; a run still going is checked now (and says so).

    A closed run is never checked again here: the checkout may have changed since, and
    the verdict's exit check read what close wrote.
    """
    from acceptrun.verdict.portability import PORTABILITY_FILE, check_run, recorded_portability

    try:
        found = recorded_portability(record)
        if found is not None:
            return found.to_dict()
        if state.get("status") not in RUN_LIVE:
            why = f"not recorded at close (no {PORTABILITY_FILE})"
            return {"error": f"{why}; `acceptrun portability {record.run_id}` checks it now"}
        return {**check_run(record).to_dict(), "provisional": True}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "findings": []}


def report_data(record: RunRecord) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-able data (``--format json``).

    A closed run's data is what close wrote (verdict.json, summary.json, ledger.json,
    portability.json, run.json): the same report at any later time, with no git, verdict,
    summary or ledger computed.
    """
    view = RecordView(record)  # events.jsonl and the exits, read once
    state = view.raw_state
    prov = record.read_json("provenance.json") or {}
    summary, tl = _summary_and_timelines(record)
    events = view.events("run_start", "attempt_start", "workload_start")
    origin = float(events[0]["t"]) if events else None
    metrics = view.metrics()
    per_attempt = view.per_attempt_metrics()
    portability = _portability_data(record, state)
    gpu_absent = [
        s.get("reason") for s in _telemetry_lines(record) if s.get("kind") == "gpu_absent"
    ]
    return {
        "schema": SCHEMA,
        "run_id": record.run_id,
        "record": str(record.path),
        "state": state,
        "supervisor": supervisor_state(record, state).to_dict(),  # record/liveness.py
        "verdict": _verdict(record, view),
        "groups": GROUPS,
        "summary": summary,
        "timelines": tl,
        "origin_t": origin,
        "gpu_absent": gpu_absent[-1] if gpu_absent else None,
        "metrics": metrics,
        "per_attempt_metrics": per_attempt,
        "ledger": record.read_json("ledger.json"),
        "provenance": prov,
        "provenance_text": provmod.format_provenance(prov) if prov else None,
        "attempts": view.attempts(),
        "checkpoints": _checkpoints(record, view),
        "outputs": _lineage(record, prov),
        "portability": portability,
        "preflight": record.read_json("preflight.json"),
        "inference": record.read_json("inference.json"),  # batch inference runs only
        "serving_html": serving_html(record),  # serving runs only: figures and charts
        "notify": delivery_rows(view.events("notify")),  # notify/: deliveries, time to detect
    }


def _telemetry_lines(record: RunRecord) -> list[dict[str, Any]]:
    from acceptrun._util.durable import read_jsonl

    if not record.telemetry_path.exists():
        return []
    return [s for s in read_jsonl(record.telemetry_path) if s.get("kind") in ("gpu_absent", "xid")]


# ---- rendering ----------------------------------------------------------------------------------


def _e(value: Any) -> str:
    """Escaped for HTML; control and bidi characters from the record shown as ``\\x1b``,
    ``\\u202e`` (a browser would reorder the text around a bidi control)."""
    return escape_controls(html.escape("" if value is None else str(value), quote=True))


def _bytes(n: Any) -> str:
    return format_bytes(n) if isinstance(n, int | float) else "-"


def _num(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return _e(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return _e(value)


def _clock(seconds: float) -> str:
    """Tick labels of time axes: seconds, minutes or hours, as precise as the ticks."""
    if abs(seconds) >= 7200:
        return f"{round(seconds / 3600, 2):g}h"
    if abs(seconds) >= 600:
        return f"{round(seconds / 60, 2):g}m"
    return f"{round(seconds, 2):g}s"


CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:#111827;margin:0;background:#f9fafb}
main{max-width:980px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:20px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
.banner{border-radius:8px;padding:14px 18px;color:#fff;margin:12px 0}
.banner.accepted{background:#15803d}.banner.rejected{background:#b91c1c}
.banner .label{font-size:26px;font-weight:700;letter-spacing:.04em}
.banner ul{margin:6px 0 0 18px;padding:0}
nav a{margin-right:12px;color:#1d4ed8;text-decoration:none;font-size:13px}
table{border-collapse:collapse;width:100%;margin:6px 0;background:#fff}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f3f4f6}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#15803d;font-weight:600}.fail{color:#b91c1c;font-weight:600}.not_recorded{color:#92400e;font-weight:600}.info{color:#1d4ed8;font-weight:600}
.fix{color:#374151;font-style:italic}
.muted{color:#6b7280}
pre{background:#fff;border:1px solid #e5e7eb;padding:8px;overflow-x:auto;font-size:12px}
code{font-size:12px}
svg.chart{display:block;background:#fff;border:1px solid #e5e7eb;margin:8px 0;max-width:100%;height:auto}
svg .grid{stroke:#f1f5f9}svg .axis{stroke:#6b7280}
svg .tick{font-size:11px;fill:#4b5563}svg .label{font-size:12px;fill:#374151}
svg .legend{font-size:11px;fill:#374151}svg .chart-title{font-size:13px;font-weight:600;fill:#111827}
.note{background:#fffbeb;border:1px solid #fde68a;padding:6px 10px;border-radius:6px}
"""

_STATUS_TEXT: dict[str, str] = {
    CheckStatus.PASS: "pass",
    CheckStatus.FAIL: "FAIL",
    CheckStatus.NOT_RECORDED: "not recorded",
}


def render_html(data: dict[str, Any]) -> str:
    """The report as one HTML document (inline CSS and SVG, no script, no network)."""
    state = data["state"]
    verdict = data["verdict"]
    accepted = bool(verdict.get("accepted"))
    label = "ACCEPTED" if accepted else "REJECTED"
    name = state.get("name", "")
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # No network: the policy forbids every fetch (fonts, images, scripts, frames).
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(label)} {_e(name)} {_e(data['run_id'])}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f'<h1>{_e(name)} <span class="muted">{_e(data["run_id"])}</span></h1>',
        '<nav><a href="#tests">tests</a><a href="#charts">charts</a><a href="#time">time</a>'
        '<a href="#serving">serving</a>'
        '<a href="#cost">cost</a><a href="#attempts">attempts</a><a href="#notify">notifications</a>'
        '<a href="#checkpoints">checkpoints</a>'
        '<a href="#outputs">outputs</a><a href="#portability">portability</a>'
        '<a href="#provenance">provenance</a></nav>',
    ]
    out += _banner(data, label, accepted)
    out += _tests(data)
    out += _charts(data)
    out += _time(data)
    out += _cost(data)
    out += batch_html(data.get("inference"))
    out += data.get("serving_html") or []  # serving runs only
    out += _attempts(data)
    out += _notify(data)
    out += _checkpoints_html(data)
    out += _outputs(data)
    out += _portability(data)
    out += _provenance(data)
    out.append(
        f'<p class="muted">Generated by acceptrun from {_e(data["record"])}; '
        "every figure comes from the run record.</p>"
    )
    out.append("</main></body></html>")
    return "\n".join(out)


def _banner(data: dict[str, Any], label: str, accepted: bool) -> list[str]:
    verdict, state = data["verdict"], data["state"]
    failing = [
        c for c in verdict.get("checks", []) if c.get("required") and c.get("status") != PASS
    ]
    cls = "accepted" if accepted else "rejected"
    out = [f'<section class="banner {cls}" id="verdict"><div class="label">{_e(label)}</div>']
    facts = [
        f"status {status_text(state, data.get('supervisor'))}",  # interrupted: record/liveness.py
        f"{state.get('attempts', 0)} attempt(s)",
        f"created {state.get('created_at')} by {state.get('created_by')}",
    ]
    if isinstance(state.get("duration_s"), int | float):
        facts.append(f"ran {format_duration(float(state['duration_s']))}")
    if state.get("reproduces"):
        facts.append(f"reproduces {state['reproduces']}")
    out.append(f"<div>{_e(', '.join(facts))}</div>")
    if verdict.get("provisional"):
        out.append(f"<div>{_e(verdict.get('provisional_why', 'Provisional verdict.'))}</div>")
    if failing:
        out.append("<ul>")
        for c in failing:
            fix = f" Fix: {c.get('fix')}" if c.get("fix") else ""
            out.append(
                f"<li><b>{_e(c.get('name'))}</b> ({_e(_STATUS_TEXT.get(str(c.get('status')), c.get('status')))}): {_e(c.get('evidence'))}.{_e(fix)}</li>"
            )
        out.append("</ul>")
    out.append("</section>")
    return out


def _tests(data: dict[str, Any]) -> list[str]:
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
        out.append(f"<h3>{_e(groups.get(group, group))} &middot; {tag}</h3>")
        out.append("<table><tr><th>check</th><th>status</th><th>evidence</th></tr>")
        rows.sort(key=lambda c: (c.get("status") == PASS, not c.get("required")))
        for c in rows:
            status = str(c.get("status"))
            word = check_mark(status, bool(c.get("required")))[1]
            text = word + ("" if c.get("required") or word == "info" else " (info)")
            cls = "info" if word == "info" else status
            evidence = _e(c.get("evidence"))
            if c.get("fix") and status != PASS:
                evidence += f'<div class="fix">fix: {_e(c.get("fix"))}</div>'
            out.append(
                f'<tr><td>{_e(c.get("name"))}</td><td class="{_e(cls)}">{_e(text)}</td><td>{evidence}</td></tr>'
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


def _charts(data: dict[str, Any]) -> list[str]:
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
        if _finite(s.get("loss")) and _finite(s.get("step"))
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
        out.append(f'<p class="note">No GPU timeline: {_e(why)}.</p>')
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
    return [(float(s["t"]) - origin, float(s[key]) * scale) for s in samples if _finite(s.get(key))]


def _by_attempt(
    steps: list[dict[str, Any]], origin: float, key: str, scale: float
) -> list[tuple[float, float]]:
    """(seconds since launch, value) of each step, with a gap (NaN) between attempts."""
    out: list[tuple[float, float]] = []
    attempt = None
    for s in steps:
        if not _finite(s.get(key)):
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


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _time(data: dict[str, Any]) -> list[str]:
    summary = data.get("summary") or {}
    out = ['<h2 id="time">Where the time went</h2>']
    if summary.get("error"):
        return [*out, f'<p class="note">No telemetry summary: {_e(summary["error"])}</p>']
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
            + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
            + "</table>"
        )
    hints = summary.get("hints") or []
    if hints:
        out.append("<h3>Hints</h3><ul>" + "".join(f"<li>{_e(h)}</li>" for h in hints) + "</ul>")
    return out


def _cost(data: dict[str, Any]) -> list[str]:
    ledger = data.get("ledger")
    out = ['<h2 id="cost">Cost</h2>']
    if not isinstance(ledger, dict):
        return [*out, '<p class="note">No ledger.json: the run has not closed.</p>']
    if not ledger.get("priced"):
        out.append(
            f'<p class="note">Not priced: {_e(ledger.get("unpriced_reason"))}. Set cost.price_per_hour or cost.provider/instance.</p>'
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
        + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )
    return out


def _attempts(data: dict[str, Any]) -> list[str]:
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
            f'<tr><td>{_e(a.get("attempt"))}</td><td class="{cls}">{_e(a.get("outcome"))}</td>'
            f'<td>{_e(a.get("class"))}<div class="muted">{_e(reason)}</div></td>'
            f"<td>{_e(format_duration(float(a.get('duration_s') or 0.0)))}</td><td>{_e(done)}</td>"
            f"<td>{'<br>'.join(f'<code>{_e(x)}</code>' for x in evidence)}</td></tr>"
        )
    out.append("</table>")
    return out


def _notify(data: dict[str, Any]) -> list[str]:
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
            f"<tr><td>{_e(r['event'])}</td><td><code>{_e(r['target'])}</code></td>"
            f'<td class="{"pass" if ok else "fail"}">{_e(outcome)}</td>'
            f"<td>{_e(r.get('attempts'))}</td><td>{_e(shown)}</td></tr>"
        )
    out.append("</table>")
    return out


def _checkpoints_html(data: dict[str, Any]) -> list[str]:
    ck = data.get("checkpoints") or {}
    out = ['<h2 id="checkpoints">Checkpoints</h2>']
    rows = ck.get("kept") or []
    summary = f"{ck.get('committed', 0)} committed, {len(rows)} kept in {ck.get('dir')}"
    if ck.get("mirror"):
        summary += f", mirrored to {ck.get('mirror')}"
    if ck.get("quarantined"):
        summary += f"; quarantined: {', '.join(ck['quarantined'])}"
    out.append(f"<p>{_e(summary)}</p>")
    if rows:
        out.append(
            "<table><tr><th>step</th><th>created</th><th>size</th><th>files</th><th>mirror</th><th>metrics</th></tr>"
        )
        for r in rows:
            latest = " (LATEST)" if r["step"] == ck.get("latest") else ""
            metrics = ", ".join(f"{k} {_num(v)}" for k, v in (r.get("metrics") or {}).items())
            out.append(
                f'<tr><td class="num">{_e(r["step"])}{_e(latest)}</td><td>{_e(r["created_at"])}</td>'
                f'<td class="num">{_e(_bytes(r["bytes"]))}</td><td class="num">{_e(r["files"])}</td>'
                f"<td>{_e(r.get('mirror') or '-')}</td><td>{_e(metrics)}</td></tr>"
            )
        out.append("</table>")
    return out


def _outputs(data: dict[str, Any]) -> list[str]:
    out = ['<h2 id="outputs">Outputs and their lineage</h2>']
    metrics = data.get("metrics") or {}
    scoped = data.get("per_attempt_metrics") or {}  # one attempt's averages: said so
    if metrics:
        out.append(
            "<table><tr><th>metric</th><th>final value</th></tr>"
            + "".join(
                f'<tr><td>{_e(k)}</td><td class="num">{_num(v)}'
                + (f" (attempt {_e(str(scoped[k]))} only)" if k in scoped else "")
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
            f"<h3>{_e(o.get('name'))}</h3><table>"
            + "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in rows)
            + "</table>"
        )
    return out


def _portability(data: dict[str, Any]) -> list[str]:
    port = data.get("portability") or {}
    out = ['<h2 id="portability">Portability</h2>']
    if port.get("error"):
        return [*out, f'<p class="note">Not checked: {_e(port["error"])}</p>']
    findings = port.get("findings") or []
    if not findings:
        return [*out, "<p>Nothing ties this run to one provider or machine.</p>"]
    out.append(
        f"<p>{_e(port.get('blockers', 0))} blocker(s), {_e(port.get('warnings', 0))} warning(s). Repeat it elsewhere with <code>acceptrun howto {_e(data['run_id'])}</code>.</p>"
    )
    out.append(
        "<table><tr><th>severity</th><th>where</th><th>value</th><th>why, and the step that moves it</th></tr>"
    )
    for f in findings:
        cls = {"blocker": "fail", "warning": "not_recorded"}.get(str(f.get("severity")), "muted")
        out.append(
            f'<tr><td class="{cls}">{_e(f.get("severity"))}</td><td>{_e(f.get("where"))}</td>'
            f'<td><code>{_e(f.get("value"))}</code></td><td>{_e(f.get("why"))}<div class="fix">{_e(f.get("fix"))}</div></td></tr>'
        )
    out.append("</table>")
    return out


def _provenance(data: dict[str, Any]) -> list[str]:
    out = ['<h2 id="provenance">Provenance</h2>']
    text = data.get("provenance_text")
    if not text:
        return [*out, '<p class="note">No provenance.json: the run stopped before preflight.</p>']
    return [*out, f"<pre>{_e(text)}</pre>"]


def write_report(record: RunRecord, path: str | Path | None = None) -> Path:
    """Write the HTML report (default: ``report.html`` in the record), atomically."""
    target = Path(path) if path is not None else record.file(REPORT_FILE)
    write_atomic(target, render_html(report_data(record)))
    return target
