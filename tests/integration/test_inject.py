"""Injected faults: the syntax, and each action done for real in a supervised run."""

from __future__ import annotations

import math
from typing import Any

import pytest

from acceptrun.record.recovery import restarts
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import LaunchResult, launch
from conftest import PYTHON, Project

# A client workload; CKPT=1 checkpoints a tiny numpy state after steps 2 and 5. The saves
# block (steps take microseconds here): a kill at step 4 then always finds step 2 saved.
WORKLOAD = """
import os
import acceptrun

run = acceptrun.init()
start = 0
if os.environ.get("CKPT"):
    import numpy as np
    weights = np.random.default_rng(0).normal(size=(2, 1))
    start = run.restore(weights=weights)
for step in run.steps(start, 8):
    run.log(step, loss=1.0 / (step + 1))
    if os.environ.get("CKPT") and step % 3 == 2:
        run.checkpoint(step, block=True)
"""

SLEEP_IN_ATTEMPT_1 = (
    "import os, time; time.sleep(30 if os.environ['ACCEPTRUN_ATTEMPT'] == '1' else 0)"
)


# ---- each action, for real --------------------------------------------------------------------


def run_with(project: Project, fault: str, *, ckpt: bool = False, limits: str = "") -> LaunchResult:
    env = 'env = { CKPT = "1" }\n' if ckpt else ""
    extra = f'{env}[limits]\nrestart_backoff = 0\ngrace_period = "1s"\n{limits}'
    spec = project.spec(WORKLOAD, extra=extra)
    return launch(spec, workspace=project.workspace, echo=False, inject=[fault])


def exits(record: RunRecord) -> list[dict[str, Any]]:
    return list(record.events("attempt_exit"))


def injected(record: RunRecord) -> list[dict[str, Any]]:
    return [
        {k: e[k] for k in ("action", "step", "attempt")} for e in record.events("fault_injected")
    ]


def test_kill_then_resume_and_the_fault_does_not_fire_again(project: Project) -> None:
    result = run_with(project, "kill@step=4", ckpt=True, limits="max_restarts = 1\n")
    record = result.record
    assert record.state["injected"] == ["kill@step=4:attempt=1"]
    first, second = exits(record)
    assert first["signal"] == "SIGKILL" and second["outcome"] == "success"
    assert [s["resume_step"] for s in record.events("attempt_start")] == [None, 2]
    # Attempt 2 went through step 4 again, and nothing fired there.
    assert injected(record) == [{"action": "kill", "step": 4, "attempt": 1}]
    assert {e["step"] for e in record.events("step") if e["attempt"] == 2} == set(range(3, 8))
    # What happened is the requested fault, done by the client on itself: said so.
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["class"] == "killed"
    assert exit1["class_reason"] == (
        "killed by the injected fault kill@step=4 (killed by SIGKILL), done by the "
        "workload's client, as asked"
    ), exit1
    assert exit1["reason"] == "killed by an injected fault kill@step=4 (killed by SIGKILL)"
    # The restart's time, from the fault to attempt 2's first step, and its parts: each
    # part between the events that bound it, and together no more than the whole.
    (restart,) = restarts(record)
    fault = next(record.events("fault_injected"))
    first = min(e["t"] for e in record.events("step") if e["attempt"] == 2)
    assert restart.total == pytest.approx(first - fault["t"], abs=1e-3)
    parts = restart.parts()
    assert parts["backoff"] == 0 and parts["restore"] is not None and parts["set_up"] is not None
    assert sum(v or 0.0 for v in parts.values()) <= restart.total + 1e-2  # type: ignore[operator]
    (check,) = [c for c in result.verdict.checks if c.name == "recovery"]
    assert check.evidence.startswith("1 restart(s), median ") and "restore " in check.evidence


def test_term_checkpoints_the_step_and_loses_none(project: Project) -> None:
    result = run_with(project, "term@step=3", ckpt=True, limits="max_restarts = 1\n")
    record = result.record
    first, second = exits(record)
    assert first["returncode"] == 143 and second["outcome"] == "success"
    (stopped,) = record.events("stopped")
    assert stopped["checkpoint"] == 3  # the step the fault fired in, saved before exiting
    assert [s["resume_step"] for s in record.events("attempt_start")] == [None, 3]
    assert injected(record) == [{"action": "term", "step": 3, "attempt": 1}]


# One save, in the background (not blocking): the kill due at step 1 waits for a commit
# and so fires at step 3, once that save, still in flight when the step ends, committed.
ASYNC_SAVE = """
import acceptrun, numpy as np
run = acceptrun.init()
weights = np.zeros((2, 1))
start = run.restore(weights=weights)
for step in run.steps(start, 6):
    run.log(step, loss=1.0 / (step + 1))
    if step == 3:
        run.checkpoint(step)
"""


def test_kill_after_checkpoint_waits_for_the_save_in_flight(project: Project) -> None:
    spec = project.spec(ASYNC_SAVE, extra="[limits]\nrestart_backoff = 0\nmax_restarts = 1\n")
    fault = "kill@step=1:after=checkpoint"
    record = launch(spec, workspace=project.workspace, echo=False, inject=[fault]).record
    assert record.state["injected"] == ["kill@step=1:after=checkpoint:attempt=1"]
    first, second = exits(record)
    assert first["signal"] == "SIGKILL" and second["outcome"] == "success"
    (fired,) = record.events("fault_injected")
    assert (fired["step"], fired["seen_step"]) == (1, 3)  # due at 1, fired after 3's commit
    assert [s["resume_step"] for s in record.events("attempt_start")] == [None, 3]
    assert {e["step"] for e in record.events("step") if e["attempt"] == 2} == {4, 5}


# The client's steps, a checkpoint file of the script's own that the supervisor captures
# (checkpoint.watch): attempt 1 runs until the kill, which waits for that capture.
WATCHED_CLIENT = """
import json, os, sys, time, acceptrun
run = acceptrun.init()
start = json.load(open("out/state.json"))["next"] if "--resume" in sys.argv else 0
os.makedirs("out", exist_ok=True)
for step in run.steps(start, 100_000 if run.attempt == 1 else 8):
    if step == 2:
        with open("out/state.json", "w") as f:
            json.dump({"next": 3}, f)
    run.log(step, loss=1.0 / (step + 1))
    time.sleep(0.02)
"""


def test_kill_after_checkpoint_waits_for_a_watched_capture(project: Project) -> None:
    spec = project.spec(
        WATCHED_CLIENT,
        extra='[checkpoint]\nwatch = ["out/state.json"]\nresume_args = ["--resume"]\n'
        'settle = "0.2s"\n[limits]\nrestart_backoff = 0\nmax_restarts = 1\n',
    )
    fault = "kill@step=1:after=checkpoint"
    record = launch(spec, workspace=project.workspace, echo=False, inject=[fault]).record
    first, second = exits(record)
    assert first["signal"] == "SIGKILL" and second["outcome"] == "success"
    (commit,) = [e for e in record.events("checkpoint_commit") if e["attempt"] == 1]
    (fired,) = record.events("fault_injected")
    # Due at step 1, fired by the client at the first step after the capture it read.
    assert fired["step"] == 1 and fired["seen_step"] >= 2 and fired["t"] > commit["t"]
    assert commit["source"] == "watched"
    assert [s["resume_step"] for s in record.events("attempt_start")][1] is not None
    assert {e["step"] for e in record.events("step") if e["attempt"] == 2} == set(range(3, 8))


def test_nan_diverges(project: Project) -> None:
    record = run_with(project, "nan@step=2", limits="max_restarts = 0\n").record
    (diverged,) = record.events("diverged")
    assert diverged["step"] == 2 and "not finite" in diverged["reason"]
    step2 = [e for e in record.events("step") if e["step"] == 2]
    assert math.isnan(step2[0]["loss"])  # a real NaN in the logged loss
    (only,) = exits(record)
    assert only["returncode"] == 3  # client.EXIT_DIVERGED
    assert injected(record) == [{"action": "nan", "step": 2, "attempt": 1}]


def test_oom_raises_a_real_memory_error(project: Project) -> None:
    record = run_with(project, "oom@step=1", limits="max_restarts = 0\n").record
    (only,) = exits(record)
    assert only["returncode"] == 1
    stderr = (record.attempt_dir(1) / "stderr.log").read_text()
    assert "MemoryError" in stderr and "_exhaust_memory" in stderr
    assert max(e["step"] for e in record.events("step")) == 1


def test_exit_code(project: Project) -> None:
    record = run_with(project, "exit=7@step=5", limits="max_restarts = 0\n").record
    (only,) = exits(record)
    assert only["returncode"] == 7
    (fault,) = record.events("fault_injected")
    assert fault["code"] == 7
    assert not list(record.events("workload_end"))  # os._exit: no exit handlers ran


def test_hang_stays_alive_until_the_wall_time_kill(project: Project) -> None:
    limits = 'max_restarts = 0\nwall_time = "3s"\n'
    record = run_with(project, "hang@step=1", limits=limits).record
    (fault,) = record.events("fault_injected")
    (only,) = exits(record)
    # Alive for seconds after the fault, deaf to SIGTERM (it is not between steps), killed.
    assert only["outcome"] == "wall_time" and only["signal"] == "SIGKILL"
    (kill,) = record.events("kill_sent")
    assert kill["t"] - fault["t"] > 1.0
    assert max(e["step"] for e in record.events("step")) == 1


def test_time_fault_kills_a_black_box_command(project: Project) -> None:
    """@time faults are the supervisor's: they work on a command that knows nothing of acceptrun."""
    spec = project.spec(
        command=[PYTHON, "-c", SLEEP_IN_ATTEMPT_1],
        extra="[limits]\nmax_restarts = 1\nrestart_backoff = 0\n",
    )
    result = launch(spec, workspace=project.workspace, echo=False, inject=["kill@time=0.5s"])
    first, second = exits(result.record)
    assert first["signal"] == "SIGKILL" and first["duration_s"] < 30  # not the 30 s sleep
    (fault,) = result.record.events("fault_injected")
    assert fault["action"] == "kill" and fault["attempt"] == 1
    assert second["outcome"] == "success"  # not fired again in attempt 2
