"""The compare page: two or more runs overlaid, side by side, and ``acceptrun diff``'s verdict.

Curves are by step, thinned to min/max per pixel column first; the diff of each run
against the first comes from :func:`acceptrun.verdict.diff.diff_runs`, the same as the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acceptrun.cost.billing import format_usd
from acceptrun.record.workspace import RunRecord
from acceptrun.report.svg import Series, line_chart
from acceptrun.spec.model import format_duration
from acceptrun.ui.board import Board, run_cost, thin_minmax
from acceptrun.ui.pages import esc, layout, run_url

__all__ = ["compare_page"]


# ---- compare ----------------------------------------------------------------------------------


def compare_page(board: Board, refs: Sequence[tuple[int, str]]) -> str:
    from acceptrun.verdict.diff import diff_runs, loss_curve

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
            f'<li><a href="{esc(run_url(ws, rid))}">{esc(n)}</a></li>'
            for (ws, rid), n in zip(refs, names, strict=True)
        )
        + "</ul>"
    )
    loss = [
        Series(n, thin_minmax(loss_curve(r).points())) for n, r in zip(names, records, strict=True)
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
    """Throughput and step time (ms) per step, from the run's chart rows.

    The rows are the summary's (``summary.json`` of a closed run, else one pass over the
    step log), already thinned to the minimum and maximum of each bucket of steps
    (docs/report.md, "Charts of long runs"): the page costs the same at any run length.
    """
    from acceptrun.telemetry.summary import load_summary

    timelines = load_summary(record.path).timelines or {}
    thr, st = [], []
    for row in timelines.get("steps") or []:
        step = row.get("step")
        if not isinstance(step, int | float):
            continue
        if isinstance(row.get("throughput"), int | float):
            thr.append((float(step), float(row["throughput"])))
        if isinstance(row.get("step_time"), int | float):
            st.append((float(step), 1000.0 * float(row["step_time"])))
    return thr, st


def _metrics_side_by_side(records: Sequence[RunRecord], names: Sequence[str]) -> list[str]:
    from acceptrun.telemetry.summary import load_summary

    finals = [{str(e.get("name")): e.get("value") for e in r.events("metric")} for r in records]
    summaries: list[dict[str, Any]] = []
    for r in records:
        try:
            summaries.append(load_summary(r.path, with_timelines=False).summary.to_dict())
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
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    out = ['<h2 id="metrics">Side by side</h2>', f"<table><tr><th>metric</th>{head}</tr>"]
    for label, values in rows:
        out.append(
            f"<tr><th>{esc(label)}</th>"
            + "".join(f'<td class="num">{esc(v)}</td>' for v in values)
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
        f'<h2 class="diff">acceptrun diff {esc(d["a"])} {esc(d["b"])}</h2>',
        f'<p class="{cls}">{esc(d["conclusion"])}</p>',
    ]
    if d["differences"]:
        out.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in d["differences"]) + "</ul>")
    if d["not_compared"]:
        out.append(f'<p class="muted">not compared: {esc("; ".join(d["not_compared"]))}</p>')
    data = d.get("data") or {}
    out.append("<h3>data</h3>")
    if data.get("a") or data.get("b"):
        a, b = data.get("a") or {}, data.get("b") or {}
        out.append(
            "<table><tr><th></th><th>A</th><th>B</th></tr>"
            + "".join(
                f"<tr><th>{esc(k)}</th><td><code>{esc(a.get(k))}</code></td><td><code>{esc(b.get(k))}</code></td></tr>"
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
                f"<tr><td><code>{esc(c['path'])}</code></td><td>{esc(c['a'])}</td><td>{esc(c['b'])}</td></tr>"
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
                f"<tr><td>{esc(o['name'])}</td><td><code>{esc(o['a'])}</code></td>"
                f"<td><code>{esc(o['b'])}</code></td><td>{'yes' if o['same'] else 'no'}</td></tr>"
                for o in outputs
            )
            + "</table>"
        )
    else:
        out.append('<p class="muted">neither run registered an output</p>')
    return out
