"""The board's pages as HTML: runs, a run, its logs, compare, queue and pool, spend.

Every page is plain HTML with inline SVG charts (:mod:`acceptrun.report.svg`), usable
without JavaScript; the one script (:mod:`acceptrun.ui.assets`) only follows live feeds.
Every string that comes from a record, an index, a queue or a request goes through
:func:`_e` (``html.escape``) or the chart helpers, which escape too.

Forms that change state (stop, resume, cancel, write a report) are POSTs carrying the
board's token: filled in when the browser holds the token cookie, else a field to paste
it into (see :mod:`acceptrun.ui.server`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from acceptrun.cost.billing import format_bytes, format_usd
from acceptrun.report.svg import Series, line_chart, stacked_bar
from acceptrun.spec import format_duration
from acceptrun.ui.board import (
    LIVE_STATES,
    Board,
    RunFilter,
    failed_checks,
    is_live,
    run_cost,
    thin_minmax,
    thin_rows,
)
from acceptrun.workspace import RunRecord

__all__ = [
    "compare_page",
    "error_page",
    "layout",
    "logs_page",
    "queue_page",
    "run_page",
    "runs_page",
    "spend_page",
]

NAV = (("runs", "/"), ("compare", "/compare"), ("queue", "/queue"), ("spend", "/spend"))
VERDICTS = ("accepted", "rejected", "none")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def run_url(ws: int, run_id: str, tail: str = "") -> str:
    return f"/run/{ws}/{quote(run_id, safe='')}{tail}"


def layout(
    title: str, active: str, body: Sequence[str], flash: str = "", error: bool = False
) -> str:
    """A whole page: header with the board's sections, an optional message, the body."""
    nav = "".join(
        f'<a href="{href}"{" class=on" if name == active else ""}>{name}</a>' for name, href in NAV
    )
    note = f'<p class="flash{" err" if error else ""}">{_e(flash)}</p>' if flash else ""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(title)} · acceptrun</title>",
            '<link rel="stylesheet" href="/static/board.css">',
            '<script src="/static/live.js" defer></script></head><body>',
            f'<header class="top"><span class="brand">acceptrun</span>{nav}</header>',
            "<main>",
            note,
            *body,
            "</main></body></html>",
        ]
    )


def error_page(status: int, message: str) -> str:
    return layout(f"{status}", "", [f"<h1>{status}</h1>", f"<p>{_e(message)}</p>"])


def _token_field(token: str | None) -> str:
    """The CSRF field of an action form: the token when the browser proved it has it."""
    if token:
        return f'<input type="hidden" name="token" value="{_e(token)}">'
    return (
        '<label>token <input type="password" name="token" autocomplete="off" required '
        'placeholder="printed by acceptrun ui"></label> '
    )


def _action(url: str, label: str, token: str | None, cls: str = "go") -> str:
    return (
        f'<form class="inline" method="post" action="{_e(url)}">{_token_field(token)}'
        f'<button class="{cls}" type="submit">{_e(label)}</button></form>'
    )


# ---- runs -------------------------------------------------------------------------------------


def runs_page(board: Board, flt: RunFilter, page: int) -> str:
    result = board.runs(flt, page)
    body = ["<h1>Runs</h1>"]
    statuses = board.statuses()
    options = "".join(
        f'<option value="{_e(s)}"{" selected" if s == flt.status else ""}>{_e(s or "any")}</option>'
        for s in ["", *statuses]
    )
    verdicts = "".join(
        f'<option value="{v}"{" selected" if v == flt.verdict else ""}>{v or "any"}</option>'
        for v in ("", *VERDICTS)
    )
    body.append(
        '<form class="filters" method="get" action="/">'
        f'<label>name or id<input name="name" value="{_e(flt.name)}"></label>'
        f'<label>status<select name="status">{options}</select></label>'
        f'<label>verdict<select name="verdict">{verdicts}</select></label>'
        f'<label>since<input type="date" name="since" value="{_e(flt.since)}"></label>'
        f'<label>until<input type="date" name="until" value="{_e(flt.until)}"></label>'
        '<button class="go" type="submit">filter</button></form>'
    )
    for note in (*board.notes, *result.notes):
        body.append(f'<p class="note">{_e(note)}</p>')
    several = len(board.workspaces) > 1
    body.append(
        f"<p>{result.total} run(s); page {result.page} of {result.pages}. "
        "Tick two or more to compare them.</p>"
    )
    body.append('<form method="get" action="/compare"><table id="runs"><tr><th></th>')
    body.append(
        ("<th>project</th>" if several else "")
        + "<th>run</th><th>name</th><th>status</th><th>verdict</th><th>failed checks</th>"
        "<th>duration</th><th>cost</th></tr>"
    )
    for br in result.runs:
        r = br.row
        record = RunRecord(r.path)
        live = False
        if r.status in LIVE_STATES:
            try:
                live = is_live(record, record.state)
            except Exception:  # a record half-removed under us: shown as not live
                live = False
        status = (
            f'<span class="live-dot" title="live"></span>{_e(r.status)} (live)'
            if live
            else _e(r.status)
        )
        verdict = r.verdict or "-"
        checks = failed_checks(record.path) if r.verdict == "rejected" else []
        shown = "".join(f"<li>{_e(c)}</li>" for c in checks[:4])
        if len(checks) > 4:
            shown += f"<li>and {len(checks) - 4} more</li>"
        cost = run_cost(record.path)
        ref = f"{br.ws}/{r.run_id}"
        body.append(
            f'<tr class="run"><td><input type="checkbox" name="run" value="{_e(ref)}"></td>'
            + (f"<td>{_e(br.project)}</td>" if several else "")
            + f'<td><a href="{_e(run_url(br.ws, r.run_id))}">{_e(r.run_id)}</a></td>'
            f"<td>{_e(r.name)}</td><td>{status}</td>"
            f'<td class="verdict {_e(verdict)}">{_e(verdict)}</td>'
            f"<td>{f'<ul class=checks>{shown}</ul>' if shown else ''}</td>"
            f'<td class="num">{_e(format_duration(r.duration_s))}</td>'
            f'<td class="num">{"-" if cost is None else "$" + _e(format_usd(cost))}</td></tr>'
        )
    body.append('</table><button class="go" type="submit">compare</button></form>')
    if not result.runs:
        body.append(
            '<p class="note">No run matches; start one with <code>acceptrun run SPEC</code>.</p>'
        )
    body.append(_pager(flt, result.page, result.pages))
    return layout("runs", "runs", body)


def _pager(flt: RunFilter, page: int, pages: int) -> str:
    query = {k: getattr(flt, k) for k in ("name", "status", "verdict", "since", "until")}
    query = {k: v for k, v in query.items() if v}
    links = []
    if page > 1:
        links.append(f'<a href="/?{_e(urlencode({**query, "page": page - 1}))}">newer</a>')
    if page < pages:
        links.append(f'<a href="/?{_e(urlencode({**query, "page": page + 1}))}">older</a>')
    return f'<p class="pager">{"".join(links)}</p>'


# ---- a run ------------------------------------------------------------------------------------


def _report_body(record: RunRecord) -> str:
    """The report's own body (verdict, five tests, charts, cost, ...), series thinned first."""
    from acceptrun.report.html import render_html, report_data

    data = report_data(record)
    tl = data.get("timelines") or {}
    if tl:
        tl["steps"] = thin_rows(tl.get("steps") or [], "step", ("loss", "step_time", "throughput"))
        tl["host"] = thin_rows(tl.get("host") or [], "t", ("cpu_pct", "proc_cpu_pct", "mem_used"))
        gpu = tl.get("gpu") or []
        by_index: dict[Any, list[dict[str, Any]]] = {}
        for s in gpu:
            by_index.setdefault(s.get("index"), []).append(s)
        tl["gpu"] = [
            s for ss in by_index.values() for s in thin_rows(ss, "t", ("util_pct", "mem_used"))
        ]
    page = render_html(data)
    start, end = page.find("<main>"), page.rfind("</main>")
    return page[start + len("<main>") : end]


def run_page(board: Board, ws: int, record: RunRecord, token: str | None) -> str:
    state = record.state
    live = is_live(record, state)
    rid = record.run_id
    body = [f'<p class="muted"><a href="/">runs</a> / {_e(rid)}</p>']
    actions = [f'<a href="{_e(run_url(ws, rid, "/logs"))}">logs{" (live)" if live else ""}</a>']
    if record.exists("report.html"):
        actions.append(f'<a href="{_e(run_url(ws, rid, "/report.html"))}">report.html</a>')
    actions.append('<a href="#checkpoints">checkpoints</a>')
    body.append("<nav>" + "".join(actions) + "</nav>")
    forms = []
    if live and state.get("status") in ("preflight", "running"):
        forms.append(
            _action(run_url(ws, rid, "/stop"), "stop (checkpoint, then exit)", token, "danger")
        )
    if not live and state.get("verdict") != "accepted":
        forms.append(_action(run_url(ws, rid, "/resume"), "resume", token))
    if not live:
        forms.append(_action(run_url(ws, rid, "/report"), "write report.html", token))
    if forms:
        body.append('<div id="actions">' + " ".join(forms) + "</div>")
    if live:
        body += _live_panel(ws, record)
    body.append(_report_body(record))
    body += _checkpoint_files(ws, record)
    return layout(f"{state.get('name', '')} {rid}", "runs", body)


def _live_panel(ws: int, record: RunRecord) -> list[str]:
    from acceptrun.ui.live import run_status

    s = run_status(record)
    total = "" if s.get("total_steps") is None else f"of {s['total_steps']}"
    rate = "-" if s.get("throughput") is None else f"{s['throughput']:.4g} {s['throughput_unit']}"
    cost = "not priced" if s.get("cost_usd") is None else f"${format_usd(s['cost_usd'])}"
    out = [
        f'<section id="live" data-stream="{_e(run_url(ws, record.run_id, "/stream"))}">',
        f'<h2>Live <span class="muted" id="live-state">live: {_e(s.get("status"))}</span></h2>',
        '<div class="kpi">',
        f'<div><span>step</span><b id="live-step">{_e(s.get("step") if s.get("step") is not None else "-")}</b>'
        f'<span id="live-total">{_e(total)}</span></div>',
        f'<div><span>ETA</span><b id="live-eta">{_e(format_duration(s.get("eta_s")))}</b></div>',
        f'<div><span>throughput</span><b id="live-rate">{_e(rate)}</b></div>',
        f'<div><span>GPU or process use</span><b id="live-use">{_e(_use(s))}</b></div>',
        f'<div><span>cost so far</span><b id="live-cost">{_e(cost)}</b></div>',
        f'<div><span>elapsed</span><b id="live-elapsed">{_e(format_duration(s.get("elapsed_s")))}</b></div>',
        "</div>",
    ]
    for key, title in (
        ("loss", "Loss"),
        ("throughput", "Throughput"),
        ("step_time", "Step time (ms)"),
    ):
        out.append(_live_chart(key, title))
    out.append(
        '<p class="muted">These charts follow the run as steps arrive (server-sent events); '
        "the report below is as of the page load.</p></section>"
    )
    return out


def _live_chart(key: str, title: str) -> str:
    """An empty chart frame that the page's script draws into (x: step)."""
    w, h, left, right, top, bottom = 760, 220, 64, 16, 30, 34
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart live" id="live-{key}" role="img" '
        f'viewBox="0 0 {w} {h}" width="{w}" height="{h}"><title>{_e(title)} (live)</title>'
        f'<text x="8" y="18" class="chart-title">{_e(title)} (live)</text>'
        f'<text x="{w - right}" y="18" class="tick count" text-anchor="end">waiting for steps</text>'
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" class="axis"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" class="axis"/>'
        f'<text x="{left - 6}" y="{top + 4}" class="tick ymax" text-anchor="end"></text>'
        f'<text x="{left - 6}" y="{h - bottom}" class="tick ymin" text-anchor="end"></text>'
        f'<text x="{left}" y="{h - bottom + 16}" class="tick xmin"></text>'
        f'<text x="{w - right}" y="{h - bottom + 16}" class="tick xmax" text-anchor="end"></text>'
        f'<text x="{(left + w - right) / 2}" y="{h - 4}" class="label" text-anchor="middle">step</text>'
        f'<path class="series" d="" stroke="#2563eb"/></svg>'
    )


def _use(s: dict[str, Any]) -> str:
    if s.get("gpus"):
        return ", ".join(
            f"GPU {g['index']} "
            + ("-" if g.get("util_pct") is None else f"{g['util_pct']:.0f}%")
            + ("" if g.get("mem_used") is None else f" {format_bytes(g['mem_used'])}")
            for g in s["gpus"]
        )
    if s.get("proc_cpu_pct") is None:
        return "-"
    rss = "" if s.get("proc_rss") is None else f", {format_bytes(s['proc_rss'])}"
    return f"{s['proc_cpu_pct']:.0f}% CPU{rss}"


def _checkpoint_files(ws: int, record: RunRecord) -> list[str]:
    """Links to each kept checkpoint's manifest (the report's table says what each holds)."""
    from acceptrun.report.html import _checkpoints

    try:
        ck = _checkpoints(record)
    except Exception as exc:  # a damaged store: say so, the rest of the page stands
        return [f'<p class="note">Checkpoints could not be listed: {_e(exc)}</p>']
    rows = ck.get("kept") or []
    if not rows:
        return []
    links = " ".join(
        f'<a href="{_e(run_url(ws, record.run_id, "/checkpoint/" + str(r["step"])))}">step {_e(r["step"])}</a>'
        for r in rows
    )
    return [f"<h3>Checkpoint manifests</h3><p>{links}</p>"]


def checkpoint_page(ws: int, record: RunRecord, step: int) -> str:
    import json

    from acceptrun.report.html import _checkpoints

    ck = _checkpoints(record)
    from pathlib import Path

    path = Path(ck["dir"]) / f"step-{step}" / "MANIFEST.json"
    try:
        text = json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=2)
    except (OSError, ValueError) as exc:
        text = f"cannot read {path}: {exc}"
    body = [
        f'<p class="muted"><a href="/">runs</a> / <a href="{_e(run_url(ws, record.run_id))}">'
        f"{_e(record.run_id)}</a> / checkpoint {step}</p>",
        f"<h1>Checkpoint step {step}</h1><p><code>{_e(path)}</code></p><pre>{_e(text)}</pre>",
    ]
    return layout(f"checkpoint {step}", "runs", body)


def logs_page(ws: int, record: RunRecord) -> str:
    from acceptrun.ui.live import log_files, log_tail

    live = is_live(record, record.state)
    parts = []
    offsets = []
    for n, stream, path in log_files(record):
        text, size = log_tail(path)
        offsets.append(f"{n}/{stream}={size}")
        parts.append(f"--- attempt {n} {stream} ({format_bytes(size)}, last 64 KiB) ---\n{text}")
    stream_url = run_url(ws, record.run_id, "/logs/stream?" + "&".join(offsets)) if live else ""
    state = "following the run live" if live else "the run is not live"
    body = [
        f'<p class="muted"><a href="/">runs</a> / <a href="{_e(run_url(ws, record.run_id))}">'
        f"{_e(record.run_id)}</a> / logs</p>",
        f'<h1>Logs <span class="muted" id="log-state">{_e(state)}</span></h1>',
        f'<pre class="log" id="log" data-stream="{_e(stream_url)}">{_e(chr(10).join(parts) or "no logs yet")}\n</pre>',
    ]
    return layout(f"logs {record.run_id}", "runs", body)


# ---- compare ----------------------------------------------------------------------------------


def compare_page(board: Board, refs: Sequence[tuple[int, str]]) -> str:
    from acceptrun.diff import diff_runs, loss_curve

    body = ["<h1>Compare runs</h1>"]
    if len(refs) < 2:
        body.append(
            '<p class="note">Choose two or more runs: tick them on the <a href="/">runs</a> page, '
            "or give <code>/compare?run=0/RUN_A&amp;run=0/RUN_B</code>.</p>"
        )
        return layout("compare", "compare", body)
    records = [board.record(ws, rid) for ws, rid in refs]
    names = [f"{r.state.get('name')} {r.run_id}" for r in records]
    body.append(
        "<ul>"
        + "".join(
            f'<li><a href="{_e(run_url(ws, rid))}">{_e(n)}</a></li>'
            for (ws, rid), n in zip(refs, names, strict=True)
        )
        + "</ul>"
    )
    loss = [
        Series(n, thin_minmax(sorted(loss_curve(r).items())))
        for n, r in zip(names, records, strict=True)
    ]
    body.append('<h2 id="overlay">Overlaid</h2>')
    body.append(line_chart(loss, title="Loss", x_label="step", y_label="loss"))
    steps = [_step_series(r) for r in records]
    thr = [Series(n, thin_minmax(s[0])) for n, s in zip(names, steps, strict=True)]
    st = [Series(n, thin_minmax(s[1])) for n, s in zip(names, steps, strict=True)]
    body.append(line_chart(thr, title="Throughput", x_label="step", y_label="per second", y_min=0))
    body.append(
        line_chart(st, title="Step time (ms)", x_label="step", y_label="ms per step", y_min=0)
    )
    body += _metrics_side_by_side(records, names)
    first = records[0]
    for other in records[1:]:
        d = diff_runs(first, other).to_dict()
        body += _diff_html(d)
    return layout("compare", "compare", body)


def _step_series(record: RunRecord) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    from acceptrun.ui.live import _step_row, throughput_key

    key, _ = throughput_key(record)
    thr, st = [], []
    for ev in record.events("step"):
        row = _step_row(ev, key)
        step = row["step"]
        if not isinstance(step, int | float):
            continue
        if isinstance(row["throughput"], float):
            thr.append((float(step), row["throughput"]))
        if isinstance(row["step_time"], int | float):
            st.append((float(step), 1000.0 * float(row["step_time"])))
    return thr, st


def _metrics_side_by_side(records: Sequence[RunRecord], names: Sequence[str]) -> list[str]:
    from acceptrun.telemetry.summary import summarize

    finals = [{str(e.get("name")): e.get("value") for e in r.events("metric")} for r in records]
    summaries: list[dict[str, Any]] = []
    for r in records:
        try:
            summaries.append(summarize(r.path).to_dict())
        except Exception:  # a run without telemetry still has its metrics compared
            summaries.append({})
    rows: list[tuple[str, list[Any]]] = []
    rows.append(("verdict", [r.state.get("verdict") or "-" for r in records]))
    rows.append(("duration", [format_duration(r.state.get("duration_s")) for r in records]))
    rows.append(
        (
            "cost",
            [("-" if (c := run_cost(r.path)) is None else f"${format_usd(c)}") for r in records],
        )
    )
    rows.append(("step time p50", [_p50(s) for s in summaries]))
    rows.append(
        (
            "throughput",
            [
                ", ".join(f"{v:.4g} {u}" for u, v in (s.get("throughput") or {}).items()) or "-"
                for s in summaries
            ],
        )
    )
    for name in sorted({k for f in finals for k in f}):
        rows.append((name, [_num(f.get(name, "-")) for f in finals]))
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    out = ['<h2 id="metrics">Side by side</h2>', f"<table><tr><th>metric</th>{head}</tr>"]
    for label, values in rows:
        out.append(
            f"<tr><th>{_e(label)}</th>"
            + "".join(f'<td class="num">{_e(v)}</td>' for v in values)
            + "</tr>"
        )
    out.append("</table>")
    return out


def _p50(summary: dict[str, Any]) -> str:
    st = summary.get("step_time") or {}
    return f"{1000 * st['p50']:.1f} ms" if isinstance(st.get("p50"), int | float) else "-"


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _diff_html(d: dict[str, Any]) -> list[str]:
    cls = "pass" if d["reproduced"] else "fail"
    out = [
        f'<h2 class="diff">acceptrun diff {_e(d["a"])} {_e(d["b"])}</h2>',
        f'<p class="{cls}">{_e(d["conclusion"])}</p>',
    ]
    if d["differences"]:
        out.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in d["differences"]) + "</ul>")
    if d["not_compared"]:
        out.append(f'<p class="muted">not compared: {_e("; ".join(d["not_compared"]))}</p>')
    data = d.get("data") or {}
    out.append("<h3>data</h3>")
    if data.get("a") or data.get("b"):
        a, b = data.get("a") or {}, data.get("b") or {}
        out.append(
            "<table><tr><th></th><th>A</th><th>B</th></tr>"
            + "".join(
                f"<tr><th>{_e(k)}</th><td><code>{_e(a.get(k))}</code></td><td><code>{_e(b.get(k))}</code></td></tr>"
                for k in ("source", "manifest_root", "found_root", "files", "verified")
            )
            + "</table>"
        )
    else:
        out.append('<p class="muted">neither run checked a data manifest</p>')
    out.append("<h3>environment</h3>")
    prov = d.get("provenance") or []
    if prov:
        out.append(
            "<table><tr><th>where</th><th>A</th><th>B</th></tr>"
            + "".join(
                f"<tr><td><code>{_e(c['path'])}</code></td><td>{_e(c['a'])}</td><td>{_e(c['b'])}</td></tr>"
                for c in prov[:200]
            )
            + "</table>"
        )
    else:
        out.append("<p>same environment (provenance)</p>")
    out.append("<h3>outputs</h3>")
    outputs = d.get("outputs") or []
    if outputs:
        out.append(
            "<table><tr><th>output</th><th>A</th><th>B</th><th>same</th></tr>"
            + "".join(
                f"<tr><td>{_e(o['name'])}</td><td><code>{_e(o['a'])}</code></td>"
                f"<td><code>{_e(o['b'])}</code></td><td>{'yes' if o['same'] else 'no'}</td></tr>"
                for o in outputs
            )
            + "</table>"
        )
    else:
        out.append('<p class="muted">neither run registered an output</p>')
    return out


# ---- queue and pool ---------------------------------------------------------------------------


def queue_page(board: Board, token: str | None) -> str:
    from acceptrun.queue.db import ACTIVE, STATES, QueueDB

    body = ["<h1>Queue and pool</h1>"]
    any_queue = False
    now = datetime.now().timestamp()
    for i, (project, ws) in enumerate(board.workspaces):
        path = ws.root / "queue" / "queue.sqlite"
        if not path.exists():
            continue
        any_queue = True
        db = QueueDB(path)
        try:
            jobs, workers = db.jobs(), db.workers()
        finally:
            db.close()
        body.append(f"<h2>{_e(project)} <span class=muted>{_e(ws.root)}</span></h2>")
        counts = {s: sum(1 for j in jobs if j.state == s) for s in STATES}
        body.append(
            '<div class="kpi">'
            + "".join(f"<div><span>{_e(s)}</span><b>{n}</b></div>" for s, n in counts.items())
            + "</div>"
        )
        body.append("<h3>Devices</h3>")
        if workers:
            on: dict[tuple[str, int], Any] = {}
            for j in jobs:
                if j.state in ACTIVE:
                    for d in j.devices:
                        on[(j.kind, d)] = j
            body.append(
                "<table><tr><th>worker</th><th>host</th><th>kind</th><th>device</th><th>running</th><th>heartbeat</th></tr>"
            )
            for w in workers:
                for d in w.devices:
                    busy = on.get((w.kind, d))
                    what = (
                        "idle"
                        if busy is None
                        else f"job {busy.id} {busy.name} (run {busy.run_id or '-'})"
                    )
                    body.append(
                        f"<tr><td>{_e(w.id)}</td><td>{_e(w.host)}</td><td>{_e(w.kind)}</td>"
                        f'<td class="num">{d}</td><td>{_e(what)}</td>'
                        f"<td>{_e(format_duration(max(0.0, now - w.heartbeat)))} ago</td></tr>"
                    )
            body.append("</table>")
        else:
            body.append(
                '<p class="note">No worker is running: start one with <code>acceptrun worker</code>.</p>'
            )
        body += _idle_chart(jobs, workers, now)
        body.append("<h3>Jobs</h3>")
        for state in STATES:
            subset = [j for j in jobs if j.state == state]
            if not subset:
                continue
            body.append(
                f"<h4>{_e(state)} ({len(subset)})</h4><table><tr><th>job</th><th>name</th>"
                "<th>kind</th><th>devices</th><th>run</th><th>waited</th><th>ran</th><th>note</th><th></th></tr>"
            )
            for j in subset[-200:]:
                run = (
                    f'<a href="{_e(run_url(i, j.run_id))}">{_e(j.run_id)}</a>' if j.run_id else "-"
                )
                act = (
                    _action(f"/queue/{i}/{j.id}/cancel", "cancel", token, "danger")
                    if state in ("queued", *ACTIVE)
                    else ""
                )
                body.append(
                    f'<tr><td class="num">{j.id}</td><td>{_e(j.name)}</td><td>{_e(j.kind)} x{j.slots}</td>'
                    f"<td>{_e(','.join(map(str, j.devices)) or '-')}</td><td>{run}</td>"
                    f"<td>{_e(format_duration(j.waited_s(now)))}</td><td>{_e(format_duration(j.ran_for(now)))}</td>"
                    f"<td>{_e(j.note)}</td><td>{act}</td></tr>"
                )
            body.append("</table>")
    if not any_queue:
        body.append(
            '<p class="note">No queue in this workspace yet. Submit a job with '
            "<code>acceptrun submit SPEC</code> and start a worker with <code>acceptrun worker</code>; "
            "this page then shows the jobs by state, the devices and what runs on each.</p>"
        )
    return layout("queue", "queue", body)


def _idle_chart(jobs: Sequence[Any], workers: Sequence[Any], now: float) -> list[str]:
    """The pool's idle share per hour (per 5 minutes for a short history).

    The pool is the devices of the live workers (else every device a job ever used);
    busy time is each job's last stint, from ``started_at`` to ``ended_at`` (or now).
    """
    devices = {(w.kind, d) for w in workers for d in w.devices} or {
        (j.kind, d) for j in jobs for d in j.devices
    }
    stints = [
        (float(j.started_at), float(j.ended_at or now), len(j.devices))
        for j in jobs
        if j.started_at
    ]
    if not devices or not stints:
        return []
    start = min(s for s, _, _ in stints)
    span = max(now - start, 1.0)
    bucket = 300.0 if span <= 6 * 3600 else 3600.0
    n = min(500, math.ceil(span / bucket))
    start = now - n * bucket
    busy = [0.0] * n
    for s, e, k in stints:
        for b in range(max(0, int((s - start) // bucket)), min(n, int((e - start) // bucket) + 1)):
            lo, hi = start + b * bucket, start + (b + 1) * bucket
            busy[b] += max(0.0, min(e, hi) - max(s, lo)) * k
    cap = len(devices) * bucket
    pts = [
        ((start + (b + 0.5) * bucket - now) / 3600.0, 100.0 * max(0.0, 1 - busy[b] / cap))
        for b in range(n)
    ]
    idle = 100.0 * (1 - sum(busy) / (cap * n))
    return [
        f"<h3>Idle share over time</h3><p>{idle:.0f}% of {len(devices)} device(s) idle over the last "
        f"{_e(format_duration(n * bucket))} (each job's latest stint counts as busy).</p>",
        line_chart(
            [Series("idle share", pts, "#d97706")],
            title="Pool idle share (%)",
            x_label="hours before now",
            y_label="% idle",
            y_min=0,
            y_max=100,
        ),
    ]


# ---- spend ------------------------------------------------------------------------------------


def spend_page(board: Board) -> str:
    from acceptrun.cost.report import select_ledgers, summarize, where_the_money_went

    ledgers: list[dict[str, Any]] = []
    live: list[str] = []
    for _, ws in board.workspaces:
        found, running = select_ledgers(ws)
        ledgers += found
        live += running
    s = summarize(ledgers)
    body = ["<h1>Spend</h1>"]
    per = s["cost_per_accepted_run"]
    body.append(
        '<div class="kpi">'
        + "".join(
            f"<div><span>{_e(k)}</span><b>{_e(v)}</b></div>"
            for k, v in (
                ("cost per accepted run", "-" if per is None else f"${format_usd(per)}"),
                ("total", f"${format_usd(s['total_usd'])}"),
                ("runs", s["runs"]),
                ("accepted", s["accepted"]),
                ("unpriced runs", s["unpriced"]),
                ("live (not counted)", len(live)),
            )
        )
        + "</div>"
    )
    body.append(f"<p>{_e(where_the_money_went(s))}.</p>")
    parts = [(k, float(v)) for k, v in s["split_usd"].items()]
    parts.append(("storage", float(s["totals"]["storage_usd"])))
    body.append(stacked_bar(parts, title="The split (USD)", unit=lambda v: f"${format_usd(v)}"))
    body.append(_grouped("By week", ledgers, _week))
    body.append(_grouped("By spec", ledgers, lambda led: str(led.get("name"))))
    body += _left_behind(ledgers, s)
    return layout("spend", "spend", body)


def _week(ledger: dict[str, Any]) -> str:
    try:
        d = datetime.fromisoformat(str(ledger.get("created_at")).replace("Z", "+00:00"))
    except ValueError:
        return "unknown"
    year, week, _ = d.isocalendar()
    return f"{year}-W{week:02d}"


def _grouped(title: str, ledgers: Sequence[dict[str, Any]], key: Any) -> str:
    from acceptrun.cost.report import summarize

    groups: dict[str, list[dict[str, Any]]] = {}
    for led in ledgers:
        groups.setdefault(key(led), []).append(led)
    rows = []
    for name in sorted(groups, reverse=title == "By week"):
        s = summarize(groups[name])
        per = s["cost_per_accepted_run"]
        split = s["split_usd"]
        rows.append(
            f"<tr><td>{_e(name)}</td><td class=num>{s['runs']}</td><td class=num>{s['accepted']}</td>"
            f"<td class=num>${_e(format_usd(s['total_usd']))}</td>"
            f"<td class=num>{'-' if per is None else '$' + _e(format_usd(per))}</td>"
            + "".join(f"<td class=num>${_e(format_usd(split[k]))}</td>" for k in split)
            + f"<td class=num>${_e(format_usd(s['totals']['storage_usd']))}</td></tr>"
        )
    head = "".join(
        f"<th>{_e(k.replace('_', ' '))}</th>"
        for k in ("productive", "wasted", "idle", "checkpoint_stall")
    )
    return (
        f"<h2>{_e(title)}</h2><table><tr><th></th><th>runs</th><th>accepted</th><th>total</th>"
        f"<th>per accepted run</th>{head}<th>storage</th></tr>{''.join(rows)}</table>"
    )


def _left_behind(ledgers: Sequence[dict[str, Any]], s: dict[str, Any]) -> list[str]:
    mirrors = (
        f"; mirrors hold {format_bytes(s['mirror_left_bytes'])}" if s["mirror_left_bytes"] else ""
    )
    rows = sorted(
        (led for led in ledgers if (led.get("storage") or {}).get("left_behind", {}).get("bytes")),
        key=lambda led: -float(led["storage"]["left_behind"]["bytes"]),
    )
    out = [
        "<h2>Left behind in storage</h2>",
        f"<p>{_e(format_bytes(s['left_behind_bytes']))} kept, "
        f"${_e(format_usd(s['left_behind_monthly_usd']))} per month{_e(mirrors)}. "
        "<code>acceptrun gc</code> clears what is no longer needed.</p>",
    ]
    if rows:
        out.append(
            "<table><tr><th>run</th><th>checkpoints</th><th>outputs</th><th>per month</th><th>where</th></tr>"
        )
        for led in rows[:50]:
            lb = led["storage"]["left_behind"]
            out.append(
                f"<tr><td>{_e(led.get('run_id'))}</td><td class=num>{_e(format_bytes(lb.get('checkpoint_bytes', 0)))}</td>"
                f"<td class=num>{_e(format_bytes(lb.get('output_bytes', 0)))}</td>"
                f"<td class=num>${_e(format_usd(float(lb.get('monthly_usd') or 0.0)))}</td>"
                f"<td><code>{_e(lb.get('checkpoint_dir'))}</code></td></tr>"
            )
        out.append("</table>")
    return out
