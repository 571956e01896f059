"""summarize() over a real restart: its time is counted as restart time (over records
written as files: tests/unit/test_telemetry_summary.py)."""

from __future__ import annotations

import json

import pytest

from acceptrun.run.launch import launch
from acceptrun.telemetry.summary import summarize
from conftest import Project


@pytest.mark.slow
def test_a_real_restart_is_counted_as_restart_time(project: Project) -> None:
    """A workload killed at step 6 restarts from scratch: its steps are redone."""
    spec = project.spec(
        """
        import time, acceptrun
        run = acceptrun.init()
        for step in run.steps(10):
            time.sleep(0.02)
            run.log(step, loss=1.0, samples=4)
        """,
        extra='[limits]\nrestart_backoff = "1s"\n',
    )
    result = launch(spec, workspace=project.workspace, echo=False, inject=["kill@step=6"])
    s = summarize(result.record.path)
    exit1 = json.loads((result.record.path / "attempts/1/exit.json").read_text())
    lost = exit1["work"]["steps_lost"]
    assert lost >= 6
    assert s.breakdown["restarts"] >= 1.0  # the backoff, at least
    assert s.wall_s is not None and sum(s.breakdown.values()) == pytest.approx(s.wall_s, rel=0.02)
    assert any(f"(1 restart, {lost} steps redone)" in h for h in s.hints), s.hints
