"""The resilience campaign's certificate in the HTML report: one row per fault kind.

Reads ``campaign.json`` (written by ``acceptrun drill --campaign`` into the reference
run's record, run/drills/campaign/runner.py); a run without it shows nothing here.
"""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["campaign_html"]


def _num(x: Any, unit: str = "") -> str:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return "-"
    return f"{x:.2f}{unit}" if isinstance(x, float) else f"{x}{unit}"


def campaign_html(cert: Any) -> list[str]:
    """The section: the totals, then kind, tried, named right, said, detect, lost, recover."""
    if not isinstance(cert, dict) or not isinstance(cert.get("kinds"), list):
        return []
    summary = cert.get("summary")
    s: dict[str, Any] = summary if isinstance(summary, dict) else {}
    share = s.get("lost_share")
    share_text = f"{100 * share:.1f}%" if isinstance(share, int | float) else "-"
    out = [
        '<h2 id="campaign">resilience campaign</h2>',
        f"<p>{'passed' if cert.get('ok') else 'failed'}: {escape(str(cert.get('tried')))} of "
        f"{len(cert['kinds'])} fault kinds tried, {escape(str(cert.get('named_right')))} named "
        f"right, final state {escape(str(cert.get('final_state')))}; detection median "
        f"{_num(s.get('detect_s_median'), ' s')}, max {_num(s.get('detect_s_max'), ' s')}; "
        f"compute lost {share_text}. Spec hash {escape(str(cert.get('spec_hash')))}.</p>",
        "<table><tr><th>kind</th><th>family</th><th>tried</th><th>named right</th>"
        "<th>acceptrun said</th><th>detect</th><th>lost steps</th><th>recover</th>"
        "<th>final state</th></tr>",
    ]
    for k in cert["kinds"]:
        if not isinstance(k, dict):
            continue
        said_raw = k.get("said")
        said: dict[str, Any] = said_raw if isinstance(said_raw, dict) else {}
        what = (
            f"{said.get('class')}, {said.get('whose')}, {said.get('action')}"
            if k.get("tried")
            else str(k.get("why_not_tried") or "")
        )
        named = "-" if not k.get("tried") else "yes" if k.get("named_right") else "NO"
        cls = "muted" if not k.get("tried") else "pass" if k.get("named_right") else "fail"
        out.append(
            f"<tr><td>{escape(str(k.get('kind')))}</td><td>{escape(str(k.get('family')))}</td>"
            f'<td>{"yes" if k.get("tried") else "no"}</td><td class="{cls}">{named}</td>'
            f'<td>{escape(what)}</td><td class="num">{_num(k.get("detect_s"), " s")}</td>'
            f'<td class="num">{_num(k.get("lost_steps"))}</td>'
            f'<td class="num">{_num(k.get("recover_s"), " s")}</td>'
            f"<td>{escape(str(k.get('final_state')))}</td></tr>"
        )
    out.append("</table>")
    return out
