"""A black box whose batch counter starts again each epoch, killed at a random step and resumed.

The script prints the ImageNet example's ``Epoch: [e][ i/n]`` lines (4 epochs of 50
batches, a line every 5), saves ``out/ckpt.json`` at the end of each epoch and resumes
from the epoch it holds with ``--resume``. The spec names the epoch, the batch and the
epoch's length (``total``) in ``progress.pattern``. Attempt 1 is killed by an injected
``kill@step=N`` at a random step of the second or third epoch; attempt 2 resumes from the
captured save. ``show``'s last step is the run's (195), the step log holds every line at
its true step (epoch * 50 + batch), and the loss curve every printed loss at its step.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from acceptrun.telemetry.timelines import timelines
from conftest import Project

PATTERN = r"'Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<batch>\d+)/(?P<total>\d+)\]\tLoss (?P<loss>\S+)'"
SCRIPT = """
import json, os, sys, time
from pathlib import Path

epoch0 = 0
if "--resume" in sys.argv:
    epoch0 = json.loads(Path("out/ckpt.json").read_text())["epoch"]
    print(f"resuming at epoch {epoch0}", flush=True)
first = os.environ.get("ACCEPTRUN_ATTEMPT") == "1"
events = Path(os.environ["ACCEPTRUN_RUN_DIR"]) / "events.jsonl"

def captured():
    return any(
        '"checkpoint_commit"' in line and '"watched"' in line
        for line in events.read_text().splitlines()
    )

def loss(step):
    return 2.0 / (1 + step)

os.makedirs("out", exist_ok=True)
for e in range(epoch0, 4):
    for b in range(50):
        if b % 5 == 0:
            print(f"Epoch: [{e}][{b:>3}/50]\\tLoss {loss(e * 50 + b):.6f}", flush=True)
            if first and e > 0:
                time.sleep(0.1)
    Path("out/tmp.json").write_text(json.dumps({"epoch": e + 1}))
    os.replace("out/tmp.json", "out/ckpt.json")
    if first and e == 0:
        while not captured():  # the kill comes after a capture, however slow the start-up
            time.sleep(0.05)
if first:
    time.sleep(600)  # the injected kill ends attempt 1
    sys.exit("attempt 1 was not killed")
Path("out/model.json").write_text("{}")
"""


def truth() -> list[tuple[int, float]]:
    return [
        (e * 50 + b, round(2.0 / (1 + e * 50 + b), 6)) for e in range(4) for b in range(0, 50, 5)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_an_epoch_counter_killed_mid_epoch_resumes_on_its_true_steps(
    project: Project, seed: int
) -> None:
    kill = random.Random(seed).choice([s for s, _ in truth() if 50 < s < 150])
    spec = project.spec(
        SCRIPT,
        extra=f"""
[checkpoint]
watch = ["out/ckpt.json"]
resume_args = ["--resume"]
settle = "0.3s"
[limits]
max_restarts = 2
restart_backoff = 0
[progress]
pattern = {PATTERN}
stream = "stdout"
""",
    )
    proc = project.cli("run", "--inject", f"kill@step={kill}", str(spec), timeout=600)
    record: RunRecord = project.only_record()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exits: list[dict[str, Any]] = [
        json.loads((record.path / "attempts" / str(n) / "exit.json").read_text()) for n in (1, 2)
    ]
    assert f"injected fault kill@step={kill}" in exits[0]["reason"], exits[0]

    # The step log: every line at its true step, attempt 1 up to the kill, attempt 2 from
    # the epoch it resumed at; no counter offset, nothing dropped or said unordered.
    steps = list(record.events("step"))
    one = [e["step"] for e in steps if e["attempt"] == 1]
    two = [e["step"] for e in steps if e["attempt"] == 2]
    want = [s for s, _ in truth()]
    assert one == want[: len(one)] and one[-1] >= kill
    resumed_epoch = int((record.path / "attempts" / "2" / "stdout.log").read_text().split()[3])
    assert two == [s for s in want if s >= resumed_epoch * 50]
    assert list(record.events("step_counter_restarted")) == []
    assert list(record.events("progress_warning")) == []

    # The capture is dated by the newest line read before the save: a line of the epoch it
    # ends (batch 45, or earlier when the save came between two reads: early dating counts
    # more lost work, never less), and the lost work is the steps after it.
    resumed_from = exits[1]["work"]["resumed_from"]
    assert (resumed_epoch - 1) * 50 <= resumed_from <= resumed_epoch * 50 - 5
    assert exits[0]["work"]["steps_lost"] == one[-1] - resumed_from > 0

    # show's last step is the run's, the loss curve holds every printed loss at its step.
    show = project.cli("show", record.path.name).stdout
    assert "last step 195" in show, show
    curve: dict[int, set[float]] = {}
    for point in timelines(record.path)["steps"]:
        curve.setdefault(point["step"], set()).add(round(point["loss"], 6))
    assert curve == {step: {loss} for step, loss in truth()}


TWO_COUNTERS = """
import sys
for step in range(0, 45, 5):
    print(f"step {step} loss {1.0 / (1 + step):.4f}", flush=True)
for step in range(22, 30):  # a second counter the pattern also reads: cannot be ordered
    print(f"step {step} loss 0.5", flush=True)
sys.exit("died after the second counter began")
"""


def test_lines_that_cannot_be_ordered_make_the_lost_work_unknown_from_their_step(
    project: Project,
) -> None:
    """Step lines dropped as unordered after step 40: the attempt's lost work, run.json's
    figure and the verdict say that what ran after step 40 is unknown, never a count."""
    spec = project.spec(
        TWO_COUNTERS,
        extra="""
[limits]
max_restarts = 0
[progress]
pattern = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'
""",
    )
    proc = project.cli("run", str(spec), timeout=600)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = project.only_record()
    work = json.loads((record.path / "attempts" / "1" / "exit.json").read_text())["work"]
    assert work["steps_unknown_after"] == 40 and work["steps_lost_range"][1] is None, work
    assert "progress unknown after step 40" in record.state["work"]["lost"]
    warned = {e["reason"]: e for e in record.events("progress_warning")}
    assert warned["unordered"]["unknown_after"] == 40 and warned["dropped"]["dropped"] == 8
    explained = " ".join(project.cli("show", "--explain", record.path.name).stdout.split())
    assert "unknown after step 40" in explained and "8 step lines were dropped" in explained
