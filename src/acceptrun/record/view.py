"""Derived views of one run record: attempts, timeline and the work lost.

These read the record only (events.jsonl, attempts/*/exit.json), so every reader (the
verdict, the telemetry summary, the reports, the exports) derives them the same way.
"""

from __future__ import annotations

from typing import Any

from acceptrun.record.workspace import RunRecord

__all__ = ["read_attempts", "run_timeline", "work_lost"]


def run_timeline(record: RunRecord) -> dict[str, Any]:
    """Launch, first step, last step and end times (unix seconds) from the events."""
    launch = first_step = last_step = end = None
    steps = 0
    for ev in record.events():
        kind, t = ev.get("kind"), ev.get("t")
        if kind in ("attempt_start", "workload_start") and launch is None:
            launch = t
        elif kind == "step":
            steps += 1
            first_step = first_step or t
            last_step = t
        elif kind in ("attempt_exit", "workload_end"):
            end = t
    return {
        "launch": launch,
        "first_step": first_step,
        "last_step": last_step,
        "end": end,
        "steps": steps,
    }


def read_attempts(record: RunRecord) -> list[dict[str, Any]]:
    root = record.path / "attempts"
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        data = record.read_json(f"attempts/{d.name}/exit.json")
        if isinstance(data, dict):
            found.append(data)
    return found


def work_lost(attempts: list[dict[str, Any]]) -> dict[str, float]:
    """Steps, seconds and device-seconds lost over all attempts (from exit.json "work")."""
    totals = {"steps_lost": 0.0, "seconds_lost": 0.0, "device_seconds_lost": 0.0}
    for a in attempts:
        work = a.get("work") or {}
        for key in totals:
            value = work.get(key)
            if isinstance(value, int | float):
                totals[key] += value
    totals["steps_lost"] = int(totals["steps_lost"])
    return totals
