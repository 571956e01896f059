"""Injected faults: the syntax, attempt selection, a fault after checkpoint waiting for its
commit, a bad fault refused before any record (each action done for real:
tests/integration/test_inject.py)."""

from __future__ import annotations

from typing import Any

import pytest

from acceptrun.errors import UserError
from acceptrun.run.launch import launch
from acceptrun.workload.inject import (
    Fault,
    due_after_checkpoint,
    faults_for_attempt,
    parse_faults,
    time_faults,
    unfired,
)
from conftest import Project

# A client workload; CKPT=1 checkpoints a tiny torch model after steps 2 and 5. The saves
# block (steps take microseconds here): a kill at step 4 then always finds step 2 saved.
WORKLOAD = """
import os
import acceptrun

run = acceptrun.init()
start = 0
if os.environ.get("CKPT"):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    start = run.restore(model=model)
for step in run.steps(start, 8):
    run.log(step, loss=1.0 / (step + 1))
    if os.environ.get("CKPT") and step % 3 == 2:
        run.checkpoint(step, block=True)
"""


# ---- syntax -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("kill@step=40", [Fault("kill", 40, None, 1, None)], id="kill-step"),
        pytest.param("term@time=30s", [Fault("term", None, 30.0, 1, None)], id="term-time"),
        pytest.param("kill@time=1.5", [Fault("kill", None, 1.5, 1, None)], id="bare-seconds"),
        pytest.param("exit=7@step=3:attempt=2", [Fault("exit", 3, None, 2, 7)], id="exit-code"),
        pytest.param(
            " nan@step=0 , oom@step=5,,hang@step=9:attempt=3 ",
            [
                Fault("nan", 0, None, 1, None),
                Fault("oom", 5, None, 1, None),
                Fault("hang", 9, None, 3, None),
            ],
            id="comma-list",
        ),
        pytest.param(["kill@step=1", "term@step=2,kill@time=1m"], None, id="list"),
        pytest.param(
            "kill@step=36:after=checkpoint:attempt=1",
            [Fault("kill", 36, None, 1, None, after_checkpoint=True)],
            id="after-checkpoint",
        ),
        pytest.param(
            "term@step=9:attempt=2:after=checkpoint",
            [Fault("term", 9, None, 2, None, after_checkpoint=True)],
            id="options-either-order",
        ),
    ],
)
def test_parse_faults_accepts(text: Any, expected: list[Fault] | None) -> None:
    faults = parse_faults(text)
    if expected is not None:
        assert faults == expected
    else:
        assert [f.action for f in faults] == ["kill", "term", "kill"]
        assert faults[2].after_s == 60.0
    # The canonical text form (what run.json and $ACCEPTRUN_INJECT hold) reads back the same.
    assert parse_faults([str(f) for f in faults]) == faults


@pytest.mark.parametrize(
    ("item", "why"),
    [
        pytest.param("explode@step=3", "unknown action 'explode'", id="action"),
        pytest.param("kill", "not a fault", id="no-trigger"),
        pytest.param("kill@step=x", "step=x is not a step number", id="step"),
        pytest.param("kill@step=-1", "step=-1 is not a step number", id="negative-step"),
        pytest.param("kill@time=soon", "time=soon is not a duration", id="time"),
        pytest.param("kill@when=3", "when= is not a trigger", id="trigger"),
        pytest.param("nan@time=5s", "nan cannot be timed", id="untimeable"),
        pytest.param("exit@step=3", "exit needs a status", id="exit-no-code"),
        pytest.param("exit=300@step=3", "exit needs a status", id="exit-range"),
        pytest.param("kill=3@step=3", "only exit takes a value", id="value"),
        pytest.param("kill@step=3:attempt=0", "attempt=0 is not an attempt", id="attempt"),
        pytest.param("kill@step=3:rank=1", "rank= is not an option", id="option"),
        pytest.param("kill@step=3:after", "'after' is not an option", id="option-no-value"),
        pytest.param("kill@step=3:after=save", "after=save is not a condition", id="after"),
        pytest.param(
            "kill@time=3s:after=checkpoint", "only a step fault can wait", id="after-timed"
        ),
    ],
)
def test_parse_faults_rejects_naming_the_item(item: str, why: str) -> None:
    with pytest.raises(UserError) as info:
        parse_faults(f"kill@step=1,{item}")
    message = str(info.value)
    assert f"fault {item!r}" in message and why in message
    assert "ACTION@step=N or ACTION@time=DURATION" in message  # the accepted forms


def test_attempt_selection() -> None:
    text = "kill@step=4,term@time=2s,term@time=1s,nan@step=6:attempt=2,kill@time=3s:attempt=2"
    assert faults_for_attempt(text, 1) == [Fault("kill", 4, None, 1, None)]
    assert faults_for_attempt(text, 2) == [Fault("nan", 6, None, 2, None)]
    assert faults_for_attempt(text, 3) == []
    timed = time_faults(parse_faults(text), 1)
    assert [f.after_s for f in timed] == [1.0, 2.0]  # soonest first
    assert time_faults(parse_faults(text), 2) == [Fault("kill", None, 3.0, 2, None)]


def test_a_fault_after_checkpoint_waits_for_a_commit_past_its_step() -> None:
    (fault,) = parse_faults("kill@step=36:after=checkpoint")
    assert not due_after_checkpoint(fault, 35, 24)  # its step not reached
    assert not due_after_checkpoint(fault, 36, None)  # nothing committed yet: later
    assert not due_after_checkpoint(fault, None, 24)  # no step read yet
    assert due_after_checkpoint(fault, 36, 24) and due_after_checkpoint(fault, 41, 24)
    (plain,) = parse_faults("kill@step=36")
    assert due_after_checkpoint(plain, 36, None)  # a plain step fault waits for nothing
    # Never fired: the verdict's sentence says what it waited for.
    steps = [{"kind": "step", "attempt": 1, "step": n} for n in range(50)]
    assert unfired(["kill@step=36:after=checkpoint:attempt=1"], steps) == [
        "kill@step=36:after=checkpoint requested, the run ended at step 49 without it firing:"
        " attempt 1 committed no checkpoint, which it waits for"
    ]


def test_launch_rejects_a_bad_fault_before_any_record(project: Project) -> None:
    spec = project.spec(WORKLOAD)
    with pytest.raises(UserError, match="fault 'kill@step=later'"):
        launch(spec, workspace=project.workspace, echo=False, inject=["kill@step=later"])
    assert project.run_ids() == []
