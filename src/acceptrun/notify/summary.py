"""The deliveries of a run, as the reports show them: one line per ``notify`` event.

Time to detect is measured, not estimated: the delivery's clock time minus the
condition's own recorded time (both ``time.time()`` on the machine that wrote them; a
``watch`` on another host adds the clock offset between the two machines).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["delivery_lines", "delivery_rows"]


def delivery_rows(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``notify`` events among ``events``, in order, with the fields the reports show."""
    rows = []
    for ev in events:
        if ev.get("kind") != "notify":
            continue
        ttd = ev.get("time_to_detect_s")
        rows.append({
            "event": str(ev.get("event")), "target": str(ev.get("target")),
            "outcome": str(ev.get("outcome")), "attempts": ev.get("attempts"),
            "time_to_detect_s": ttd if isinstance(ttd, int | float) else None,
            "by": str(ev.get("by") or "supervisor"), "error": ev.get("error"),
        })  # fmt: skip
    return rows


def delivery_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per delivery, for ``acceptrun show``; nothing when there were none."""
    lines = []
    for row in rows:
        tries = f"{row['attempts']} tr{'y' if row['attempts'] == 1 else 'ies'}"
        if row["outcome"] == "delivered":
            what = f"delivered, time to detect {row['time_to_detect_s']:.3f} s ({tries})"
        else:
            what = f"NOT DELIVERED: {row['outcome']} ({tries}): {row['error'] or 'no reason'}"
        by = "" if row["by"] == "supervisor" else f" [by {row['by']}]"
        lines.append(f"notify   {row['event']} -> {row['target']}: {what}{by}")
    return lines
