"""`acceptrun drill --campaign` on a black box (tests/watched_train.py, no client API): the
supervisor fires the kill and the preemption at a step it read from the script's output,
the script resumes from its own watched checkpoint bit for bit, and a kind the client would
do is reported not applicable with the reason (the ground truth is here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project

pytestmark = pytest.mark.slow  # five torch processes: the reference, two runs, two restarts

TRAIN = Path(__file__).with_name("watched_train.py")
PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)"
TRUTH = {
    "sigkill": ("killed", "unknown", "restart"),
    "sigterm": ("preempted", "provider", "restart"),
}


def test_a_black_box_is_killed_and_preempted_by_the_supervisor_and_resumes_bitwise(
    project: Project,
) -> None:
    shutil.copy(TRAIN, project.root / "train.py")
    project.spec(
        command=[PYTHON, "train.py", "--iters", "30", "--every", "10", "--sleep", "0.03"],
        extra=f"""
[checkpoint]
watch = ["out/ckpt.pt"]
resume_args = ["--init_from=resume"]
settle = "0.3s"
[limits]
max_restarts = 1
restart_backoff = 0
[outputs]
weights = "out/weights.sha256"
[progress]
pattern = {json.dumps(PATTERN)}
""",
    )
    (project.root / "c.toml").write_text('kinds = ["sigkill", "sigterm", "nan"]\n')
    proc = project.cli("drill", "--campaign", "c.toml", "--json", "spec.toml", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    card = json.loads(proc.stdout)
    cert = json.loads((project.runs_dir / card["reference_run"] / "campaign.json").read_text())
    kinds = {k["kind"]: k for k in cert["kinds"]}
    for name, truth in TRUTH.items():
        k = kinds[name]
        said = (k["said"]["class"], k["said"]["whose"], k["said"]["action"])
        assert k["tried"] and k["truth"]["fired"] and said == truth, k
        assert k["named_right"] and k["final_state"] == "bitwise", k
        assert k["lost_steps"] is not None and k["lost_steps"] > 0, k
        (fired,) = RunRecord(project.runs_dir / k["run"]).events("fault_injected")
        assert fired["by"] == "supervisor" and fired["seen_step"] >= fired["step"]
    nan = kinds["nan"]
    assert not nan["tried"] and "not applicable to a black box" in nan["why_not_tried"]
    assert card["tried"] == card["named_right"] == len(TRUTH) and card["ok"]
