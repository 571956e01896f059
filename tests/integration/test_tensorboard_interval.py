"""A TensorBoard-only script that saves every 500 iterations, killed mid-interval, resumed with its counter from 0.

tests/integration/tb_interval_train.py logs ``Loss/train`` and saves ``out/ckpt.json``
every 500 iterations; its counter starts again at each resume, and its first scalar
after resuming from the save of iteration 500 is step 500 itself. Through a real
``acceptrun run --inject kill@step=1500``: attempt 1 is killed mid-interval, attempt 2
resumes from the capture of iteration 500, the restarted counter is noticed by wall
time and offset by 500, every capture is stored under the run step it holds (none left
one save behind), retention keeps ``keep_last`` by commit, and the loss is read from a
``Loss/train`` tag.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project

SCRIPT = Path(__file__).with_name("tb_interval_train.py")


@pytest.mark.slow
@pytest.mark.parametrize("keep_last", [5, 2])
def test_tensorboard_saves_dated_in_a_chain_and_a_restart_told_by_wall_time(
    project: Project, keep_last: int
) -> None:
    pytest.importorskip("tensorboard")
    spec = project.spec(
        command=[PYTHON, str(SCRIPT)],
        name="tb-interval",
        extra=f"""
[checkpoint]
watch = ["out/ckpt.json"]
resume_args = ["--resume"]
settle = "0.3s"
keep_last = {keep_last}
[limits]
max_restarts = 2
restart_backoff = 0
[progress]
tensorboard = "tb"
""",
    )
    proc = project.cli("run", "--inject", "kill@step=1500", str(spec), timeout=900)
    record: RunRecord = project.only_record()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exits = [
        json.loads((record.path / "attempts" / str(n) / "exit.json").read_text()) for n in (1, 2)
    ]
    assert exits[0]["signal"] == "SIGKILL" and exits[1]["work"]["resumed_from"] == 500, exits

    # The restart was told apart by wall time: attempt 2's steps are the run's.
    (restart,) = record.events("step_counter_restarted")
    assert (restart["attempt"], restart["offset"], restart["first_step"]) == (2, 500, 500)
    assert "after the start" in restart["why"], restart
    steps2 = [e["step"] for e in record.events("step") if e.get("attempt") == 2]
    assert steps2 == [1000, 1500, 2000, 2500], steps2
    losses = [e.get("loss") for e in record.events("step") if e.get("attempt") == 2]
    assert all(isinstance(v, float) for v in losses), losses  # read from Loss/train

    # Every capture under the run step it holds; the newest keep_last commits kept.
    store = CheckpointStore(record.path / "checkpoints")
    held = {}
    for info in store.ordered():
        (name,) = [n for n in info.files if n.startswith("files/")]
        saved = json.loads((info.path / name).read_text())
        held[info.step] = saved["iters"] + (500 if saved["attempt"] == 2 else 0)
    expected = {500: 500, 1000: 1000, 1500: 1500, 2000: 2000, 2500: 2500}
    newest = dict(list(expected.items())[-keep_last:])
    assert held == newest, held
    assert [i.step for i in store.ordered()] == list(newest)
