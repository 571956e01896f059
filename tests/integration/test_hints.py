"""Hints on supervised runs built to show one bottleneck each, for real."""

from __future__ import annotations

import pytest

from acceptrun.run.launch import launch
from acceptrun.telemetry.summary import summarize
from conftest import Project


@pytest.mark.slow
def test_a_loop_waiting_for_data_gets_the_data_wait_hint_and_no_other(project: Project) -> None:
    spec = project.spec(
        """
        import time, acceptrun
        run = acceptrun.init()
        for step in run.steps(15):
            # A data loader too slow for the model. A busy machine lengthens each sleep alike:
            # the wait stays the larger part as long as the rest of a step takes under 90 ms.
            with run.data_wait():
                time.sleep(0.1)
            time.sleep(0.01)
            run.log(step, loss=1.0, samples=16)
        """
    )
    result = launch(spec, workspace=project.workspace, echo=False)
    s = summarize(result.record.path)
    assert s.steps == 15
    assert s.data_wait_share is not None and 0.5 < s.data_wait_share < 0.95
    assert s.breakdown["data_wait"] > s.breakdown["compute"]
    (hint,) = [h for h in s.hints if h.startswith("data wait is")]
    assert f"{100 * s.data_wait_share:.0f}% of step time" in hint
    assert "num_workers" in hint and "pin_memory" in hint
    assert not [h for h in s.hints if h.startswith(("checkpoint stall", "restarts cost"))]
    # `acceptrun show` carries the breakdown, the percentiles, the speed and the hint.
    out = project.cli("show", result.record.run_id, check_rc=0).stdout
    assert "time     " in out and "first step after" in out
    (bar,) = [line for line in out.splitlines() if line.strip().startswith("data wait  ")]
    assert "\u2588" in bar
    assert "p50 " in out and "p99 " in out and "samples/s" in out
    assert f"hints    - {hint}" in out
    assert "ACCEPTED" in out or "REJECTED" in out  # the verdict section is kept


@pytest.mark.slow
def test_a_slow_blocking_checkpoint_gets_the_checkpoint_stall_hint(project: Project) -> None:
    """The state's state_dict() takes 0.15 s: the client's save blocks the loop that long."""
    spec = project.spec(
        """
        import time, torch, acceptrun

        class SlowState:
            def __init__(self):
                self.w = torch.zeros(1000)
            def state_dict(self):
                time.sleep(0.15)  # e.g. gathering a sharded state to host memory
                return {"w": self.w}
            def load_state_dict(self, sd):
                self.w = sd["w"]

        run = acceptrun.init()
        state = SlowState()
        start = run.restore(state=state)
        for step in run.steps(start, 12):
            time.sleep(0.01)
            run.log(step, loss=1.0, samples=16)
            run.maybe_checkpoint(step)
        """,
        extra="[checkpoint]\nevery_steps = 3\n",
    )
    result = launch(spec, workspace=project.workspace, echo=False)
    assert result.verdict.accepted
    s = summarize(result.record.path)
    stages = list(result.record.events("checkpoint_stage"))
    assert len(stages) == 4
    assert s.breakdown["checkpoint_stall"] == pytest.approx(
        sum(e["stall_s"] for e in stages), rel=1e-3
    )
    assert s.breakdown["checkpoint_stall"] >= 0.6
    (hint,) = [h for h in s.hints if h.startswith("checkpoint stall is")]
    assert "of step time" in hint and "checkpoint.every" in hint
    assert not [h for h in s.hints if h.startswith("data wait")]
