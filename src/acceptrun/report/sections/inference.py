"""A batch inference run's figures in `acceptrun show` and in the HTML report.

Both read ``inference.json`` (written at close by :mod:`acceptrun.inference.summary`); a run without it
shows nothing here.
"""

from __future__ import annotations

from html import escape
from typing import Any

from acceptrun._util.units import format_latency

__all__ = ["batch_html", "batch_lines"]


def _ms(seconds: Any) -> str:
    return format_latency(seconds) if isinstance(seconds, int | float) else "-"


def _rate(value: Any, unit: str) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:,.1f} {unit}"


def _usd(value: Any, per: str) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.6g} USD per {per}"


def _rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    total = int(s.get("items") or 0)
    rows = [
        ("input", f"{s.get('input')} ({total:,} items, shards of {s.get('shard_size')})"),
        ("output", f"{s.get('output')} ({s.get('shards_committed')} of {s.get('shards_total')} shards committed)"),
        (
            "coverage",
            f"{float(s.get('coverage') or 0):.2%}: {s.get('outputs', 0):,} outputs, "
            f"{s.get('failed', 0):,} failed, {s.get('missing', 0):,} missing, "
            f"{s.get('duplicated', 0):,} duplicated",
        ),
        ("error rate", f"{float(s.get('error_rate') or 0):.2%}"),
        (
            "wall throughput",
            f"{_rate(s.get('items_per_s'), 'items/s')}, {_rate(s.get('tokens_per_s'), 'tokens/s')} "
            f"over {s.get('seconds')} s of attempts",
        ),
        (
            "latency",
            f"per item p50 {_ms(s.get('latency_p50'))}, p90 {_ms(s.get('latency_p90'))}, "
            f"p99 {_ms(s.get('latency_p99'))}",
        ),
        (
            "cost",
            f"{_usd(s.get('usd_per_1k_items'), '1,000 items')}; "
            f"{_usd(s.get('usd_per_million_tokens'), 'million tokens')}",
        ),
    ]  # fmt: skip
    for entry in (s.get("failed_items") or [])[:5]:
        rows.append(("failed", f"{entry.get('id')!r}: {entry.get('error')}"))
    for problem in (s.get("bad_shards") or [])[:5]:
        rows.append(("not counted", str(problem)))
    if s.get("missing_ids"):
        rows.append(("missing ids", ", ".join(map(repr, s["missing_ids"][:10]))))
    if s.get("error"):
        rows = [("error", str(s["error"]))]
    return rows


def batch_lines(summary: Any) -> list[str]:
    """Lines for `acceptrun show` (``batch    ...``); none for other runs."""
    if not isinstance(summary, dict):
        return []
    return [f"{'batch' if i == 0 else '':<8} {k}: {v}" for i, (k, v) in enumerate(_rows(summary))]


def batch_html(summary: Any) -> list[str]:
    """A small section of the HTML report; none for other runs."""
    if not isinstance(summary, dict):
        return []
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in _rows(summary))
    return ['<h2 id="inference">Batch inference</h2>', f"<table>{body}</table>"]
