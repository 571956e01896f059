"""The spend page: cost per accepted run by week and by spec, the split, what is left behind.

Everything comes from :mod:`acceptrun.cost.report` over the ledgers of closed runs (the
same as ``acceptrun cost``); live runs are counted apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from acceptrun.cost.billing import format_bytes, format_usd
from acceptrun.record.glossary import label
from acceptrun.report.svg import stacked_bar
from acceptrun.ui.board import Board
from acceptrun.ui.pages import esc, layout

__all__ = ["spend_page"]


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
    body.append(_grouped("By week", ledgers, _week))
    body.append(_grouped("By spec", ledgers, lambda led: str(led.get("name"))))
    body += _waste(ledgers)
    body += _left_behind(ledgers, s)
    return layout("spend", "spend", body)


def _week(ledger: dict[str, Any]) -> str:
    from acceptrun.cost.report import GROUPS

    return GROUPS["week"](ledger)


def _waste(ledgers: Sequence[dict[str, Any]]) -> list[str]:
    """Wasted spend by whose failure it was, per week, provider and run (cost.report.waste_by)."""
    from acceptrun.cost.ledger import RESPONSIBLE
    from acceptrun.cost.report import waste_by

    out = [
        "<h2>Wasted, by whose failure</h2>",
        "<p>Provider: preemption, a lost node, a GPU fault. Workload: the run's code, data "
        "or limits. Unknown: the evidence does not tell. Drill: a fault the run injected "
        "into itself (<code>--inject</code>). <code>acceptrun cost claim --since "
        "7d</code> lists the provider's incidents with their evidence.</p>",
    ]
    head = "".join(f"<th>{esc(k)}</th>" for k in RESPONSIBLE)
    for group in ("week", "provider", "run"):
        rows = waste_by(ledgers, group)[:50]
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
        f"<p>{esc(format_bytes(s['left_behind_bytes']))} kept, "
        f"${esc(format_usd(s['left_behind_monthly_usd']))} per month{esc(mirrors)}. "
        "<code>acceptrun gc</code> clears what is no longer needed.</p>",
    ]
    if rows:
        out.append(
            "<table><tr><th>run</th><th>checkpoints</th><th>outputs</th><th>per month</th><th>where</th></tr>"
        )
        for led in rows[:50]:
            lb = led["storage"]["left_behind"]
            out.append(
                f"<tr><td>{esc(led.get('run_id'))}</td><td class=num>{esc(format_bytes(lb.get('checkpoint_bytes', 0)))}</td>"
                f"<td class=num>{esc(format_bytes(lb.get('output_bytes', 0)))}</td>"
                f"<td class=num>${esc(format_usd(float(lb.get('monthly_usd') or 0.0)))}</td>"
                f"<td><code>{esc(lb.get('checkpoint_dir'))}</code></td></tr>"
            )
        out.append("</table>")
    return out
