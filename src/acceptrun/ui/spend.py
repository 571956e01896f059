"""The spend page: cost per accepted run by week and by spec, the split, what is left behind.

Everything comes from :mod:`acceptrun.cost.report` over the closed runs' figures in the
workspaces' indexes (the same as ``acceptrun cost``: no record is opened, whatever the
number of runs); live runs are counted apart.
"""

from __future__ import annotations

from typing import Any

from acceptrun.cost.billing import format_bytes, format_usd
from acceptrun.cost.ledger import RESPONSIBLE
from acceptrun.cost.report import (
    LedgerSet,
    group_ledgers,
    select_ledgers,
    summarize,
    waste_by,
    where_the_money_went,
)
from acceptrun.record.glossary import label
from acceptrun.record.index import COST_FIGURES
from acceptrun.report.svg import stacked_bar
from acceptrun.ui.board import Board
from acceptrun.ui.pages import esc, layout

__all__ = ["spend_page"]


# ---- spend ------------------------------------------------------------------------------------


def spend_page(board: Board) -> str:
    ledgers = LedgerSet([])
    live: list[str] = []
    for _, ws in board.workspaces:
        found, running = select_ledgers(ws)
        ledgers.rows += found.rows
        live += running
    s = summarize(ledgers)
    body = ["<h1>Spend</h1>"]
    per = s["cost_per_accepted_run"]
    body.append(
        '<div class="kpi">'
        + "".join(
            f"<div><span>{esc(k)}</span><b>{esc(v)}</b></div>"
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
    body.append(f"<p>{esc(where_the_money_went(s))}.</p>")
    parts = [(k, float(v)) for k, v in s["split_usd"].items()]
    parts.append(("storage", float(s["totals"]["storage_usd"])))
    body.append(stacked_bar(parts, title="The split (USD)", unit=lambda v: f"${format_usd(v)}"))
    body.append(_grouped("By week", ledgers, "week"))
    body.append(_grouped("By spec", ledgers, "spec"))
    body += _waste(ledgers)
    body += _left_behind(ledgers, s)
    return layout("spend", "spend", body)


def _waste(ledgers: LedgerSet) -> list[str]:
    """Wasted spend by whose failure it was, per week, provider and run (cost.report.waste_by)."""
    out = [
        "<h2>Wasted, by whose failure</h2>",
        "<p>Provider: preemption, a lost node, a GPU fault. Workload: the run's code, data "
        "or limits. Unknown: the evidence does not tell. Drill: a fault the run injected "
        "into itself (<code>--inject</code>). <code>acceptrun cost claim --since "
        "7d</code> lists the provider's incidents with their evidence.</p>",
    ]
    head = "".join(f"<th>{esc(k)}</th>" for k in RESPONSIBLE)
    # A run is a group of its own: the first 50 runs' rows are those of the first 50 runs.
    first = LedgerSet(sorted(ledgers.rows, key=lambda r: r.run_id)[:50])
    for group in ("week", "provider", "run"):
        rows = waste_by(first if group == "run" else ledgers, group)[:50]
        cells = "".join(
            f"<tr><td>{esc(r[group])}</td><td class=num>{r['runs']}</td>"
            + "".join(f"<td class=num>${esc(format_usd(r['usd'][k]))}</td>" for k in RESPONSIBLE)
            + "</tr>"
            for r in rows
        )
        out.append(
            f"<h3>per {esc(group)}</h3><table><tr><th></th><th>runs</th>{head}</tr>{cells}</table>"
        )
    return out


def _grouped(title: str, ledgers: LedgerSet, group: str) -> str:
    groups = group_ledgers(ledgers, group)
    rows = []
    for name in sorted(groups, reverse=title == "By week"):
        s = summarize(groups[name])
        per = s["cost_per_accepted_run"]
        split = s["split_usd"]
        rows.append(
            f"<tr><td>{esc(name)}</td><td class=num>{s['runs']}</td><td class=num>{s['accepted']}</td>"
            f"<td class=num>${esc(format_usd(s['total_usd']))}</td>"
            f"<td class=num>{'-' if per is None else '$' + esc(format_usd(per))}</td>"
            + "".join(f"<td class=num>${esc(format_usd(split[k]))}</td>" for k in split)
            + f"<td class=num>${esc(format_usd(s['totals']['storage_usd']))}</td></tr>"
        )
    head = "".join(
        f"<th>{esc(label(k))}</th>" for k in ("productive", "wasted", "idle", "checkpoint_stall")
    )
    return (
        f"<h2>{esc(title)}</h2><table><tr><th></th><th>runs</th><th>accepted</th><th>total</th>"
        f"<th>per accepted run</th>{head}<th>storage</th></tr>{''.join(rows)}</table>"
    )


def _left_behind(ledgers: LedgerSet, s: dict[str, Any]) -> list[str]:
    mirrors = (
        f"; mirrors hold {format_bytes(s['mirror_left_bytes'])}" if s["mirror_left_bytes"] else ""
    )
    at = COST_FIGURES.index("storage.left_behind.bytes")
    kept = sorted((r for r in ledgers.rows if r.figures[at]), key=lambda r: -r.figures[at])
    rows = LedgerSet(kept[:50])  # the digests of the 50 shown alone are read
    out = [
        "<h2>Left behind in storage</h2>",
        f"<p>{esc(format_bytes(s['left_behind_bytes']))} kept, "
        f"${esc(format_usd(s['left_behind_monthly_usd']))} per month{esc(mirrors)}. "
        "<code>acceptrun gc</code> clears what is no longer needed.</p>",
    ]
    if rows:
        out.append(
            "<table><tr><th>run</th><th>checkpoints</th><th>outputs</th><th>per month</th><th>where</th></tr>"
        )
        for led in rows:
            lb = led["storage"]["left_behind"]
            out.append(
                f"<tr><td>{esc(led.get('run_id'))}</td><td class=num>{esc(format_bytes(lb.get('checkpoint_bytes', 0)))}</td>"
                f"<td class=num>{esc(format_bytes(lb.get('output_bytes', 0)))}</td>"
                f"<td class=num>${esc(format_usd(float(lb.get('monthly_usd') or 0.0)))}</td>"
                f"<td><code>{esc(lb.get('checkpoint_dir'))}</code></td></tr>"
            )
        out.append("</table>")
    return out
