"""``acceptrun report RUN``: one self-contained HTML file that explains a run.

:func:`acceptrun.report.data.report_data` gathers everything from the record (verdict,
telemetry summary and timelines, ledger, provenance, attempts, checkpoints, outputs and
their lineage, portability); :func:`render_html` is the page's frame (head, inline CSS,
navigation) around the sections of :mod:`acceptrun.report.html_sections`, with inline SVG
charts (:mod:`acceptrun.report.svg`): no script, no font, no image is fetched, so it
opens the same from a laptop, a CI artifact or an air-gapped cluster. Every string that
comes from the record is escaped. ``--format md`` (:mod:`acceptrun.report.markdown`)
renders the same data as Markdown and ``--format json`` prints the data itself.

>>> path = write_report(ws.get_run("latest"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_atomic
from acceptrun.record.workspace import RunRecord
from acceptrun.report.data import report_data
from acceptrun.report.html_sections import (
    attempts_html,
    banner_html,
    charts_html,
    checkpoints_html,
    cost_html,
    esc,
    notify_html,
    outputs_html,
    portability_html,
    provenance_html,
    tests_html,
    time_html,
)
from acceptrun.report.sections.campaign import campaign_html
from acceptrun.report.sections.inference import batch_html

__all__ = ["CSS", "REPORT_FILE", "render_html", "write_report"]

REPORT_FILE = "report.html"


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
        f"<title>{esc(label)} {esc(name)} {esc(data['run_id'])}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f'<h1>{esc(name)} <span class="muted">{esc(data["run_id"])}</span></h1>',
        '<nav><a href="#tests">tests</a><a href="#charts">charts</a><a href="#time">time</a>'
        '<a href="#serving">serving</a>'
        '<a href="#cost">cost</a><a href="#attempts">attempts</a><a href="#notify">notifications</a>'
        '<a href="#checkpoints">checkpoints</a>'
        '<a href="#outputs">outputs</a><a href="#portability">portability</a>'
        '<a href="#provenance">provenance</a></nav>',
    ]
    out += banner_html(data, label, accepted)
    out += tests_html(data)
    out += charts_html(data)
    out += time_html(data)
    out += cost_html(data)
    out += batch_html(data.get("inference"))
    out += campaign_html(data.get("campaign"))
    out += data.get("serving_html") or []  # serving runs only
    out += attempts_html(data)
    out += notify_html(data)
    out += checkpoints_html(data)
    out += outputs_html(data)
    out += portability_html(data)
    out += provenance_html(data)
    out.append(
        f'<p class="muted">Generated by acceptrun from {esc(data["record"])}; '
        "every figure comes from the run record.</p>"
    )
    out.append("</main></body></html>")
    return "\n".join(out)


def write_report(record: RunRecord, path: str | Path | None = None) -> Path:
    """Write the HTML report (default: ``report.html`` in the record), atomically."""
    target = Path(path) if path is not None else record.file(REPORT_FILE)
    write_atomic(target, render_html(report_data(record)))
    return target
