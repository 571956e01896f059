"""Scripts as users bring them, killed by ``--inject kill@step`` and resumed from their own checkpoint.

One script (tests/shapes_train.py) in three shapes: it prints ``iter N: loss X``, it writes
TensorBoard scalars, or it calls only ``run.log`` in a loop of its own. Each saves
``out/ckpt.pt`` in place and resumes with ``--init_from=resume``; the spec watches the file,
reads the progress and declares ``out/model.pt``. For each shape: attempt 1 is killed by an
injected step fault (the supervisor fires it when it reads the step from a black box's
output or TensorBoard files; the client fires it itself), attempt 2 starts from the
captured checkpoint (not from scratch), the lost steps are the steps after it, the output
is verified, and the time split shows compute.

The kill is a step fault, not a time fault: the script's first save comes after its
start-up, which on a busy machine took longer than any fixed time (a ``kill@time=20s``
then found nothing captured and attempt 2 started over).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from acceptrun.record.workspace import RunRecord
from acceptrun.telemetry.summary import summarize
from conftest import PYTHON, Project

SCRIPT = Path(__file__).with_name("shapes_train.py")
CLIENT_SCRIPT = Path(__file__).with_name("shapes_client.py")
PROGRESS = {
    "lines": "[progress]\npattern = 'iter (?P<step>\\d+): loss (?P<loss>[0-9.eE+-]+)'\n",
    "tensorboard": '[progress]\ntensorboard = "tb"\ntags = { loss = "train/loss" }\n',
    "client": "",  # run.log writes the step events itself
}


@pytest.mark.slow
@pytest.mark.parametrize("report", ["lines", "tensorboard", "client"])
def test_killed_script_resumes_from_its_own_checkpoint(project: Project, report: str) -> None:
    if report == "tensorboard":
        pytest.importorskip("tensorboard")
    spec = project.spec(
        command=[PYTHON, str(CLIENT_SCRIPT)]
        if report == "client"
        else [PYTHON, str(SCRIPT), "--report", report],
        name=f"shape-{report}",
        extra=f"""
[checkpoint]
watch = ["out/ckpt.pt"]
resume_args = ["--init_from=resume"]
settle = "0.3s"
[limits]
max_restarts = 2
restart_backoff = 0
[outputs]
model = "out/model.pt"
[acceptance]
outputs = ["model"]
{PROGRESS[report]}""",
    )
    # The script waits for the capture of its first save (iter 10) before going on slowly,
    # and attempt 1 waits at its end to be killed: the kill at step 15 always comes after a
    # checkpoint exists and some steps after it, however long start-up takes.
    proc = project.cli("run", "--inject", "kill@step=15", str(spec), timeout=900)
    record: RunRecord = project.only_record()
    exits = [
        json.loads((record.path / "attempts" / str(n) / "exit.json").read_text()) for n in (1, 2)
    ]
    (fired,) = record.events("fault_injected")
    assert (fired["action"], fired["step"], fired["attempt"]) == ("kill", 15, 1)
    assert exits[0]["signal"] == "SIGKILL", exits[0]
    if report != "client":  # the supervisor sent it, and the attempt's reason says so
        assert "injected fault kill@step=15" in exits[0]["reason"], exits[0]
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # Attempt 2 resumed from a captured checkpoint, with the script's own flag.
    commits = [e for e in record.events("checkpoint_commit") if e.get("source") == "watched"]
    assert commits, "no watched checkpoint was captured"
    resumed_from = exits[1]["work"]["resumed_from"]
    stdout2 = (record.path / "attempts" / "2" / "stdout.log").read_text()
    match = re.search(r"resuming from out/ckpt.pt at iter (\d+)", stdout2)
    assert match is not None, stdout2[-2000:]
    script_iter = int(match.group(1))  # the script's own count: steps 0..script_iter-1 done
    assert script_iter >= 10
    # acceptrun dates a capture by the newest step it had read before the file's mtime: the
    # true step, or a little earlier when the save came between two reads of the log. Early
    # dating over-counts lost work; it never hides any.
    assert resumed_from is not None and 0 <= resumed_from <= script_iter - 1
    starts = [e for e in record.events("attempt_start") if e.get("attempt") == 2]
    assert "--init_from=resume" in starts[0]["command"]

    # Lost work: the steps attempt 1 did after the checkpoint it resumed from.
    work1 = exits[0]["work"]
    assert work1["last_step"] is not None and work1["last_step"] > script_iter
    assert work1["steps_lost"] == work1["last_step"] - resumed_from
    assert work1["steps_lost"] >= work1["last_step"] - (script_iter - 1)
    assert work1["seconds_lost"] > 0
    steps2 = [e["step"] for e in record.events("step") if e.get("attempt") == 2]
    assert steps2 and min(steps2) == script_iter and max(steps2) == 199

    # The declared output is verified and the run is accepted.
    (output,) = [e for e in record.events("output") if e.get("name") == "model"]
    assert output["attempt"] == 2 and output["hash"].startswith("xxh3_128:")
    verdict = json.loads((record.path / "verdict.json").read_text())
    assert verdict["verdict"] == "accepted", [
        (c["name"], c["evidence"]) for c in verdict["checks"] if c["status"] == "fail"
    ]

    # The time split books the training as compute, not as start-up or idle: at least
    # half of attempt 2's stepping span (first to last step), however slow the start-up.
    breakdown = summarize(record.path).breakdown
    times2 = [e["t"] for e in record.events("step") if e.get("attempt") == 2]
    assert breakdown["compute"] >= 0.5 * (max(times2) - min(times2)) > 0, breakdown
