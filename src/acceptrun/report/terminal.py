"""``acceptrun show RUN``: a run at a glance in the terminal, read from its record."""

from __future__ import annotations

import statistics
from typing import Any

from acceptrun.spec import format_duration
from acceptrun.verdict import Check, Verdict, format_verdict
from acceptrun.workspace import RunRecord

__all__ = ["format_show"]


def format_show(record: RunRecord) -> str:
    state = record.state
    lines = [
        f"run      {record.run_id}",
        f"name     {state.get('name')}  ({state.get('mode', 'supervised')}, by {state.get('created_by', '?')})",
        f"status   {state.get('status')}  created {state.get('created_at')}  ended {state.get('ended_at') or '-'}",
        f"record   {record.path}",
    ]
    steps: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    for ev in record.events("step", "metric"):
        if ev["kind"] == "step":
            steps.append(ev)
        else:
            metrics[str(ev.get("name"))] = ev.get("value")
    if steps:
        times = [s["step_time"] for s in steps if isinstance(s.get("step_time"), int | float)]
        waits = [s.get("data_wait", 0.0) for s in steps]
        losses = [s["loss"] for s in steps if isinstance(s.get("loss"), int | float)]
        parts = [f"{len(steps)} logged, last step {steps[-1].get('step')}"]
        if times:
            parts.append(f"median step {statistics.median(times) * 1000:.1f} ms")
            total = sum(times)
            if total > 0:
                parts.append(f"data wait {100 * sum(waits) / total:.1f}% of step time")
        if losses:
            parts.append(f"loss {losses[0]:.4g} -> {losses[-1]:.4g}")
        lines.append(f"steps    {', '.join(parts)}")
    if metrics:
        lines.append(
            "metrics  "
            + ", ".join(
                f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}"
                for k, v in metrics.items()
            )
        )
    attempts_dir = record.path / "attempts"
    if attempts_dir.is_dir():
        for d in sorted(
            attempts_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0
        ):
            ex = record.read_json(f"attempts/{d.name}/exit.json")
            if isinstance(ex, dict):
                lines.append(
                    f"attempt  {ex['attempt']}: {ex['reason']} after {format_duration(ex['duration_s'])} ({ex['outcome']})"
                )
    data = record.read_json("verdict.json")
    if isinstance(data, dict):
        checks = [Check(**c) for c in data.get("checks", [])]
        verdict = Verdict(str(data.get("run_id")), checks, str(data.get("decided_at")))
        lines += ["", format_verdict(verdict, name=str(state.get("name", "")))]
    else:
        lines += [
            "",
            "verdict  not decided yet (the run is still going, or it was interrupted before closing)",
        ]
    return "\n".join(lines)
