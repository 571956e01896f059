"""``acceptrun report RUN --format md``: the report's data as Markdown (no charts).

For pull requests, issues and wikis: the verdict, the five tests with evidence and
fixes, the time and cost breakdowns, attempts, checkpoints, outputs with their lineage
and the portability findings, from the same :func:`acceptrun.report.html.report_data`.
"""

from __future__ import annotations

from typing import Any

from acceptrun._util.controls import CONTROLS, escape_controls
from acceptrun.cost.billing import format_usd
from acceptrun.record.liveness import status_text
from acceptrun.spec.model import format_duration
from acceptrun.verdict.core import PASS, check_mark

__all__ = ["render_markdown"]


def _status(c: dict[str, Any]) -> str:
    mark, word = check_mark(str(c.get("status")), bool(c.get("required")))
    return f"{mark} {word}" + ("" if c.get("required") or word == "info" else " (info)")


_CELL = {
    # Controls shown as \x1b, \u202e (never acted on, never reordering the text); line
    # breaks folded to a space, which keeps the table's row on one line.
    **{ord(c): escape_controls(c) for c in CONTROLS},
    **{ord(c): " " for c in "\n\r\t\x0b\x0c\x1c\x1d\x1e\x85"},
    ord("|"): "\\|",
    ord("<"): "&lt;",  # no raw HTML: <script>, <img onerror=...>
    ord(">"): "&gt;",
    ord("["): "\\[",  # no links: [x](javascript:...)
    ord("]"): "\\]",
    ord("`"): "&#96;",  # never closes the code span it is shown in
}


def _cell(value: Any) -> str:
    """Text from the record made inert: table-safe, no HTML, no links, no control characters."""
    return str("" if value is None else value).translate(_CELL)


def render_markdown(data: dict[str, Any]) -> str:
    state, verdict = data["state"], data["verdict"]
    label = "ACCEPTED" if verdict.get("accepted") else "REJECTED"
    if verdict.get("provisional"):
        label += " (provisional)"
    out = [f"# {label}: {_cell(state.get('name'))} `{data['run_id']}`", ""]
    if verdict.get("provisional"):
        out += [f"> {_cell(verdict.get('provisional_why', 'Provisional verdict.'))}", ""]
    facts = f"status {status_text(state, data.get('supervisor'))}, {state.get('attempts', 0)} attempt(s), created {state.get('created_at')} by {state.get('created_by')}"
    if state.get("reproduces"):
        facts += f", reproduces `{state['reproduces']}`"
    out += [facts, ""]
    failing = [
        c for c in verdict.get("checks", []) if c.get("required") and c.get("status") != PASS
    ]
    if failing:
        out.append("Failing checks:")
        out += [
            f"- **{_cell(c.get('name'))}**: {_cell(c.get('evidence'))}. Fix: {_cell(c.get('fix') or '-')}"
            for c in failing
        ]
        out.append("")
    out += ["## The acceptance tests", ""]
    groups: dict[str, str] = data["groups"]
    for group, title in groups.items():
        rows = [c for c in verdict.get("checks", []) if c.get("group") == group]
        if not rows:
            continue
        out += [f"### {title}", "", "| check | status | evidence | fix |", "|---|---|---|---|"]
        for c in rows:
            status = _status(c)
            fix = c.get("fix") if c.get("status") != PASS else ""
            out.append(
                f"| {_cell(c.get('name'))} | {status} | {_cell(c.get('evidence'))} | {_cell(fix)} |"
            )
        out.append("")
    summary = data.get("summary") or {}
    if summary.get("breakdown"):
        out += ["## Where the time went", "", "| part | time |", "|---|---|"]
        out += [
            f"| {k.replace('_', ' ')} | {format_duration(float(v))} |"
            for k, v in summary["breakdown"].items()
        ]
        out.append("")
        for hint in summary.get("hints") or []:
            out.append(f"- {_cell(hint)}")
        out.append("")
    ledger = data.get("ledger")
    if isinstance(ledger, dict):
        compute = ledger.get("compute") or {}
        out += [
            "## Cost",
            "",
            f"Total {format_usd(float(ledger.get('total_usd') or 0.0))} USD ({_cell((ledger.get('price') or {}).get('label', 'not priced'))}).",
            "",
        ]
        out += ["| compute part | time | USD |", "|---|---|---|"]
        for k, v in (compute.get("split_s") or {}).items():
            usd = (compute.get("split_usd") or {}).get(k, 0.0)
            out.append(
                f"| {k.replace('_', ' ')} | {format_duration(float(v))} | {format_usd(float(usd))} |"
            )
        out.append("")
    out += ["## Attempts", ""]
    attempts = data.get("attempts") or []
    if attempts:
        out += ["| # | outcome | class | duration | evidence |", "|---|---|---|---|---|"]
        for a in attempts:
            evidence = "; ".join(str(x) for x in (a.get("evidence") or [a.get("reason")]))
            out.append(
                f"| {a.get('attempt')} | {_cell(a.get('outcome'))} | {_cell(a.get('class'))} | {format_duration(float(a.get('duration_s') or 0.0))} | {_cell(evidence)} |"
            )
    else:
        out.append("No attempt ran.")
    out.append("")
    ck = data.get("checkpoints") or {}
    out += [
        "## Checkpoints",
        "",
        f"{ck.get('committed', 0)} committed, {len(ck.get('kept') or [])} kept in `{_cell(ck.get('dir'))}`; LATEST step {ck.get('latest')}.",
        "",
    ]
    out += ["## Outputs and their lineage", ""]
    for name, value in (data.get("metrics") or {}).items():
        out.append(f"- metric `{_cell(name)}` = {value}")
    for o in data.get("outputs") or []:
        commit = o.get("commit") or "not under git"
        if o.get("dirty"):
            commit += f" + diff {o.get('diff_hash')}"
        out.append(
            f"- output **{_cell(o.get('name'))}** `{_cell(o.get('hash'))}` ({_cell(o.get('path'))}): "
            f"code {_cell(commit)}; GPU {_cell(o.get('gpu') or 'none')}, driver {_cell(o.get('driver') or 'none')}, "
            f"CUDA {_cell(o.get('cuda') or 'none')}, torch {_cell(o.get('torch') or 'none')}"
        )
    out.append("")
    port = data.get("portability") or {}
    out += ["## Portability", ""]
    findings = port.get("findings") or []
    if not findings:
        out.append(port.get("error") or "Nothing ties this run to one provider or machine.")
    else:
        out += ["| severity | where | value | why | move it |", "|---|---|---|---|---|"]
        for f in findings:
            out.append(
                f"| {f['severity']} | {_cell(f['where'])} | `{_cell(f['value'])}` | {_cell(f['why'])} | {_cell(f['fix'])} |"
            )
    out.append("")
    if data.get("provenance_text"):
        out += ["## Provenance", "", "```", str(data["provenance_text"]), "```", ""]
    return "\n".join(out)
