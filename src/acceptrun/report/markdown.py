"""``acceptrun report RUN --format md``: the report's data as Markdown (no charts).

For pull requests, issues and wikis: the verdict, the five tests with evidence and
fixes, the time and cost breakdowns, attempts, checkpoints, outputs with their lineage
and the portability findings, from the same :func:`acceptrun.report.data.report_data`.
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
    """The report as Markdown, a section after another, from the data report.html shows."""
    out = _head(data) + _checks(data) + _time(data.get("summary") or {})
    out += _cost(data.get("ledger")) + _attempts(data.get("attempts") or [])
    out += _checkpoints(data.get("checkpoints") or {}) + _outputs(data)
    out += _portability(data.get("portability") or {})
    if data.get("provenance_text"):
        out += ["## Provenance", "", "```", str(data["provenance_text"]), "```", ""]
    return "\n".join(out)


def _head(data: dict[str, Any]) -> list[str]:
    """The verdict and the run's facts, then the failing required checks with their fixes."""
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
    return out


def _checks(data: dict[str, Any]) -> list[str]:
    """Every check, a table per group of the acceptance tests."""
    out = ["## The acceptance tests", ""]
    checks = data["verdict"].get("checks", [])
    for group, title in data["groups"].items():
        rows = [c for c in checks if c.get("group") == group]
        if not rows:
            continue
        out += [f"### {title}", "", "| check | status | evidence | fix |", "|---|---|---|---|"]
        for c in rows:
            fix = c.get("fix") if c.get("status") != PASS else ""
            out.append(
                f"| {_cell(c.get('name'))} | {_status(c)} | {_cell(c.get('evidence'))} | {_cell(fix)} |"
            )
        out.append("")
    return out


def _time(summary: dict[str, Any]) -> list[str]:
    """Where the time went (the telemetry summary's breakdown) and its hints."""
    if not summary.get("breakdown"):
        return []
    out = ["## Where the time went", "", "| part | time |", "|---|---|"]
    out += [
        f"| {k.replace('_', ' ')} | {format_duration(float(v))} |"
        for k, v in summary["breakdown"].items()
    ]
    out.append("")
    out += [f"- {_cell(hint)}" for hint in summary.get("hints") or []]
    return [*out, ""]


def _cost(ledger: Any) -> list[str]:
    """The ledger's total and its compute split, in time and USD."""
    if not isinstance(ledger, dict):
        return []
    compute = ledger.get("compute") or {}
    out = [
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
    return [*out, ""]


def _attempts(attempts: list[dict[str, Any]]) -> list[str]:
    """A row per attempt: its outcome, class, duration and evidence."""
    out = ["## Attempts", ""]
    if not attempts:
        return [*out, "No attempt ran.", ""]
    out += ["| # | outcome | class | duration | evidence |", "|---|---|---|---|---|"]
    for a in attempts:
        evidence = "; ".join(str(x) for x in (a.get("evidence") or [a.get("reason")]))
        out.append(
            f"| {a.get('attempt')} | {_cell(a.get('outcome'))} | {_cell(a.get('class'))} | {format_duration(float(a.get('duration_s') or 0.0))} | {_cell(evidence)} |"
        )
    return [*out, ""]


def _checkpoints(ck: dict[str, Any]) -> list[str]:
    return [
        "## Checkpoints",
        "",
        f"{ck.get('committed', 0)} committed, {len(ck.get('kept') or [])} kept in `{_cell(ck.get('dir'))}`; LATEST step {ck.get('latest')}.",
        "",
    ]


def _outputs(data: dict[str, Any]) -> list[str]:
    """The metrics, then each output with the code, GPU and software that made it."""
    out = ["## Outputs and their lineage", ""]
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
    return [*out, ""]


def _portability(port: dict[str, Any]) -> list[str]:
    out = ["## Portability", ""]
    findings = port.get("findings") or []
    if not findings:
        out.append(port.get("error") or "Nothing ties this run to one provider or machine.")
    else:
        out += ["| severity | where | value | why | move it |", "|---|---|---|---|---|"]
        for f in findings:
            out.append(
                f"| {f['severity']} | {_cell(f['where'])} | `{_cell(f['value'])}` | {_cell(f['why'])} | {_cell(f['fix'])} |"
            )
    return [*out, ""]
