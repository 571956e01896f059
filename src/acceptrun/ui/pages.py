"""The board's page layout and its run pages: the runs list, a run, its logs, a checkpoint.

The other sections have their own modules: :mod:`~acceptrun.ui.compare`,
:mod:`~acceptrun.ui.pool` (queue and pool), :mod:`~acceptrun.ui.spend`.

Every page is plain HTML with inline SVG charts (:mod:`acceptrun.report.svg`), usable
without JavaScript; the one script (:mod:`acceptrun.ui.assets`) only follows live feeds.
Every string that comes from a record, an index, a queue or a request goes through
:func:`esc` (``html.escape``) or the chart helpers, which escape too.

Forms that change state (stop, resume, cancel, write a report) are POSTs carrying the
board's token: filled in when the browser holds the token cookie, else a field to paste
it into (see :mod:`acceptrun.ui.server`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from acceptrun._util.redact import redact_text
from acceptrun.cost.billing import format_bytes, format_usd
from acceptrun.record.liveness import interruption
from acceptrun.record.workspace import RunRecord
from acceptrun.report.html_sections import esc
from acceptrun.spec.model import format_duration
from acceptrun.ui.board import (
    LIVE_STATES,
    Board,
    RunFilter,
    failed_checks,
    is_live,
    run_cost,
    thin_rows,
)

__all__ = [
    "action_form",
    "checkpoint_page",
    "error_page",
    "esc",
    "layout",
    "logs_page",
    "run_page",
    "run_url",
    "runs_page",
]

NAV = (("runs", "/"), ("compare", "/compare"), ("queue", "/queue"), ("spend", "/spend"))
VERDICTS = ("accepted", "rejected", "none")


def run_url(ws: int, run_id: str, tail: str = "") -> str:
    return f"/run/{ws}/{quote(run_id, safe='')}{tail}"


def layout(
    title: str, active: str, body: Sequence[str], flash: str = "", error: bool = False
) -> str:
    """A whole page: header with the board's sections, an optional message, the body."""
    nav = "".join(
        f'<a href="{href}"{" class=on" if name == active else ""}>{name}</a>' for name, href in NAV
    )
    note = f'<p class="flash{" err" if error else ""}">{esc(flash)}</p>' if flash else ""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)} · acceptrun</title>",
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
    return layout(f"{status}", "", [f"<h1>{status}</h1>", f"<p>{esc(message)}</p>"])


def _token_field(token: str | None) -> str:
    """The CSRF field of an action form: the token when the browser proved it has it."""
    if token:
        return f'<input type="hidden" name="token" value="{esc(token)}">'
    return (
        '<label>token <input type="password" name="token" autocomplete="off" required '
        'placeholder="printed by acceptrun ui"></label> '
    )


def action_form(url: str, label: str, token: str | None, cls: str = "go") -> str:
    return (
        f'<form class="inline" method="post" action="{esc(url)}">{_token_field(token)}'
        f'<button class="{cls}" type="submit">{esc(label)}</button></form>'
    )


# ---- runs -------------------------------------------------------------------------------------


def runs_page(board: Board, flt: RunFilter, page: int) -> str:
    result = board.runs(flt, page)
    body = ["<h1>Runs</h1>"]
    statuses = board.statuses()
    options = "".join(
        f'<option value="{esc(s)}"{" selected" if s == flt.status else ""}>{esc(s or "any")}</option>'
        for s in ["", *statuses]
    )
    verdicts = "".join(
        f'<option value="{v}"{" selected" if v == flt.verdict else ""}>{v or "any"}</option>'
        for v in ("", *VERDICTS)
    )
    body.append(
        '<form class="filters" method="get" action="/">'
        f'<label>name or id<input name="name" value="{esc(flt.name)}"></label>'
        f'<label>status<select name="status">{options}</select></label>'
        f'<label>verdict<select name="verdict">{verdicts}</select></label>'
        f'<label>since<input type="date" name="since" value="{esc(flt.since)}"></label>'
        f'<label>until<input type="date" name="until" value="{esc(flt.until)}"></label>'
        '<button class="go" type="submit">filter</button></form>'
    )
    for note in (*board.notes, *result.notes):
        body.append(f'<p class="note">{esc(note)}</p>')
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
            f'<span class="live-dot" title="live"></span>{esc(r.status)} (live)'
            if live
            else esc(r.status)
        )
        if not live and (gone := interruption(record, r.status)):  # record/liveness.py
            seen = esc(gone.last_seen_iso)
            status = (
                f'<span title="{esc(gone.detail)}">interrupted</span> (last sign of life {seen})'
            )
        verdict = r.verdict or "-"
        checks = failed_checks(record.path) if r.verdict == "rejected" else []
        shown = "".join(f"<li>{esc(c)}</li>" for c in checks[:4])
        if len(checks) > 4:
            shown += f"<li>and {len(checks) - 4} more</li>"
        cost = run_cost(record.path)
        ref = f"{br.ws}/{r.run_id}"
        body.append(
            f'<tr class="run"><td><input type="checkbox" name="run" value="{esc(ref)}"></td>'
            + (f"<td>{esc(br.project)}</td>" if several else "")
            + f'<td><a href="{esc(run_url(br.ws, r.run_id))}">{esc(r.run_id)}</a></td>'
            f"<td>{esc(r.name)}</td><td>{status}</td>"
            f'<td class="verdict {esc(verdict)}">{esc(verdict)}</td>'
            f"<td>{f'<ul class=checks>{shown}</ul>' if shown else ''}</td>"
            f'<td class="num">{esc(format_duration(r.duration_s))}</td>'
            f'<td class="num">{"-" if cost is None else "$" + esc(format_usd(cost))}</td></tr>'
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
        links.append(f'<a href="/?{esc(urlencode({**query, "page": page - 1}))}">newer</a>')
    if page < pages:
        links.append(f'<a href="/?{esc(urlencode({**query, "page": page + 1}))}">older</a>')
    return f'<p class="pager">{"".join(links)}</p>'


# ---- a run ------------------------------------------------------------------------------------


# Rendered report bodies by record, while the record's files stay as they were: gathering
# a report reads events.jsonl several times (seconds for 100,000 steps), a page view should not.
CACHED_BODIES = 16
STAMPED = ("run.json", "events.jsonl", "telemetry.jsonl", "verdict.json", "ledger.json",
           "provenance.json", "preflight.json", "mirror.json", "cost.jsonl")  # fmt: skip
_bodies: OrderedDict[str, tuple[tuple[Any, ...], str, list[int]]] = OrderedDict()
_bodies_lock = threading.Lock()


def _stamp(record: RunRecord) -> tuple[Any, ...]:
    """Size and mtime of each file the report reads: any write changes it."""
    out: list[Any] = []
    for name in STAMPED:
        try:
            st = (record.path / name).stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _report_body(record: RunRecord) -> tuple[str, list[int]]:
    """The report's body and the kept checkpoints' steps, from the cache while the record
    has not changed since."""
    key, stamp = str(record.path), _stamp(record)
    with _bodies_lock:
        hit = _bodies.get(key)
        if hit is not None and hit[0] == stamp:
            _bodies.move_to_end(key)
            return hit[1], hit[2]
    body, steps = _render_report_body(record)
    with _bodies_lock:
        _bodies[key] = (stamp, body, steps)
        while len(_bodies) > CACHED_BODIES:
            _bodies.popitem(last=False)
    return body, steps


def _render_report_body(record: RunRecord) -> tuple[str, list[int]]:
    """The report's own body (verdict, five tests, charts, cost, ...), series thinned
    first; and the steps of the checkpoints it lists (the store is opened once)."""
    from acceptrun.report.data import report_data
    from acceptrun.report.html import render_html

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
    steps = [int(row["step"]) for row in (data.get("checkpoints") or {}).get("kept", [])]
    return page[start + len("<main>") : end], steps


def run_page(board: Board, ws: int, record: RunRecord, token: str | None) -> str:
    state = record.state
    live = is_live(record, state)
    rid = record.run_id
    body = [f'<p class="muted"><a href="/">runs</a> / {esc(rid)}</p>']
    actions = [f'<a href="{esc(run_url(ws, rid, "/logs"))}">logs{" (live)" if live else ""}</a>']
    if record.exists("report.html"):
        actions.append(f'<a href="{esc(run_url(ws, rid, "/report.html"))}">report.html</a>')
    actions.append('<a href="#checkpoints">checkpoints</a>')
    body.append("<nav>" + "".join(actions) + "</nav>")
    forms = []
    if live and state.get("status") in ("preflight", "running"):
        forms.append(
            action_form(run_url(ws, rid, "/stop"), "stop (checkpoint, then exit)", token, "danger")
        )
    if not live and state.get("verdict") != "accepted":
        forms.append(action_form(run_url(ws, rid, "/resume"), "resume", token))
    if not live:
        forms.append(action_form(run_url(ws, rid, "/report"), "write report.html", token))
    if forms:
        body.append('<div id="actions">' + " ".join(forms) + "</div>")
    if live:
        body += _live_panel(ws, record)
    report, steps = _report_body(record)
    body.append(report)
    body += _checkpoint_files(ws, record, steps)
    return layout(f"{state.get('name', '')} {rid}", "runs", body)


def _live_panel(ws: int, record: RunRecord) -> list[str]:
    from acceptrun.ui.live import run_status

    s = run_status(record)
    total = "" if s.get("total_steps") is None else f"of {s['total_steps']}"
    rate = "-" if s.get("throughput") is None else f"{s['throughput']:.4g} {s['throughput_unit']}"
    cost = "not priced" if s.get("cost_usd") is None else f"${format_usd(s['cost_usd'])}"
    out = [
        f'<section id="live" data-stream="{esc(run_url(ws, record.run_id, "/stream"))}">',
        f'<h2>Live <span class="muted" id="live-state">{esc(s.get("status"))}</span></h2>',
        '<div class="kpi">',
        f'<div><span>step</span><b id="live-step">{esc(s.get("step") if s.get("step") is not None else "-")}</b>'
        f'<span id="live-total">{esc(total)}</span></div>',
        f'<div><span>ETA</span><b id="live-eta">{esc(format_duration(s.get("eta_s")))}</b></div>',
        f'<div><span>throughput</span><b id="live-rate">{esc(rate)}</b></div>',
        f'<div><span>GPU or process use</span><b id="live-use">{esc(_use(s))}</b></div>',
        f'<div><span>cost so far</span><b id="live-cost">{esc(cost)}</b></div>',
        f'<div><span>elapsed</span><b id="live-elapsed">{esc(format_duration(s.get("elapsed_s")))}</b></div>',
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
        f'viewBox="0 0 {w} {h}" width="{w}" height="{h}"><title>{esc(title)} (live)</title>'
        f'<text x="8" y="18" class="chart-title">{esc(title)} (live)</text>'
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


def checkpoint_root(record: RunRecord) -> Path:
    """Where the run's checkpoints are: ``checkpoint.dir`` of its frozen spec, else the record's."""
    try:
        spec = record.spec
    except Exception:  # a spec that no longer loads: the default place, as the report does
        return record.checkpoints_dir
    from acceptrun.checkpoint.owner import store_root

    return store_root(record, spec)  # checkpoint.dir/<run id>/ (or an older record's dir)


def _checkpoint_files(ws: int, record: RunRecord, steps: list[int]) -> list[str]:
    """Links to each kept checkpoint's manifest (the report's table says what each holds)."""
    if not steps:
        return []
    links = " ".join(
        f'<a href="{esc(run_url(ws, record.run_id, f"/checkpoint/{step}"))}">step {step}</a>'
        for step in steps
    )
    return [f"<h3>Checkpoint manifests</h3><p>{links}</p>"]


def checkpoint_page(ws: int, record: RunRecord, step: int) -> str:
    import json

    from acceptrun._util.durable import loads_json, read_bytes_bounded

    store = checkpoint_root(record)
    path = store / f"step-{step}" / "MANIFEST.json"
    # No link below the record (a store inside it) or the store is followed.
    root = record.path if store.is_relative_to(record.path) else store
    try:
        text = json.dumps(loads_json(read_bytes_bounded(path, root=root)), indent=2)
    except (OSError, ValueError) as exc:
        text = f"cannot read {path}: {exc}"
    body = [
        f'<p class="muted"><a href="/">runs</a> / <a href="{esc(run_url(ws, record.run_id))}">'
        f"{esc(record.run_id)}</a> / checkpoint {step}</p>",
        f"<h1>Checkpoint step {step}</h1><p><code>{esc(path)}</code></p><pre>{esc(text)}</pre>",
    ]
    return layout(f"checkpoint {step}", "runs", body)


def logs_page(ws: int, record: RunRecord) -> str:
    from acceptrun.ui.live import log_files, log_tail

    live = is_live(record, record.state)
    parts = []
    offsets = []
    for n, stream, path in log_files(record):
        text, size = log_tail(path, root=record.path)
        offsets.append(f"{n}/{stream}={size}")
        parts.append(f"--- attempt {n} {stream} ({format_bytes(size)}, last 64 KiB) ---\n{text}")
    stream_url = run_url(ws, record.run_id, "/logs/stream?" + "&".join(offsets)) if live else ""
    state = "following the run live" if live else "the run is not live"
    body = [
        f'<p class="muted"><a href="/">runs</a> / <a href="{esc(run_url(ws, record.run_id))}">'
        f"{esc(record.run_id)}</a> / logs</p>",
        f'<h1>Logs <span class="muted" id="log-state">{esc(state)}</span></h1>',
        # Redacted before it is escaped: `{"password": "x"}` is a form the redactor knows,
        # `{&quot;password&quot;: ...}` is not (the send's own pass would miss it).
        f'<pre class="log" id="log" data-stream="{esc(stream_url)}">{esc(redact_text(chr(10).join(parts) or "no logs yet"))}\n</pre>',
    ]
    return layout(f"logs {record.run_id}", "runs", body)
