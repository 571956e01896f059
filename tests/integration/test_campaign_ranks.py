"""`acceptrun drill --campaign` on a 2-process gloo workload (examples/ddp under torchrun):
one rank killed, named ``distributed`` and resumed bit for bit; one rank slowed, named no
failure; the restart's rendezvous refused, named ``distributed`` and the next restart
resumed bit for bit (the ground truth is here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import PYTHON, Project

pytestmark = pytest.mark.slow  # four runs of two torch ranks each: about a minute

ROOT = Path(__file__).resolve().parents[2]

SPEC = f"""
name = "ddp"
command = {json.dumps([PYTHON, "train.py"])}
[resources]
processes = 2
[checkpoint]
every_steps = 10
keep_last = 2
[limits]
max_restarts = 2
restart_backoff = 0
grace_period = "20s"
[env]
DDP_STEPS = "30"
"""


def test_a_killed_rank_is_named_distributed_and_the_group_resumes_bitwise(project: Project) -> None:
    shutil.copy(ROOT / "examples" / "ddp" / "train.py", project.root / "train.py")
    (project.root / "spec.toml").write_text(SPEC)
    kinds = ["rank_killed", "straggler", "rendezvous_refused"]
    (project.root / "c.toml").write_text(f"kinds = {json.dumps(kinds)}\n")
    proc = project.cli("drill", "--campaign", "c.toml", "--json", "spec.toml", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    card = json.loads(proc.stdout)
    killed, straggler, refused = card["kinds"]
    assert killed["tried"] and killed["named_right"] and killed["final_state"] == "bitwise"
    assert killed["lost_steps"] > 0 and killed["detect_s"] is not None
    # The slowed rank is no failure (no false hang): the run ends as the reference, bitwise.
    assert straggler["tried"] and straggler["named_right"] and straggler["final_state"] == "bitwise"
    # The kill's restart meets at a c10d store that refuses it; the restart after that
    # rendezvouses normally and ends as the reference, bitwise.
    assert refused["tried"] and refused["named_right"], refused
    assert refused["final_state"] == "bitwise"
    cert = json.loads((project.runs_dir / card["reference_run"] / "campaign.json").read_text())
    said = cert["kinds"][0]["said"]
    assert (said["class"], said["whose"], said["action"]) == ("distributed", "unknown", "restart")
    rdzv = cert["kinds"][2]
    assert rdzv["truth"]["attempt"] == 2 and rdzv["fault"].startswith("rdzv@attempt=2,")
    exit2 = json.loads(
        (project.runs_dir / rdzv["run"] / "attempts" / "2" / "exit.json").read_text()
    )
    assert "RendezvousConnectionError" in " ".join(exit2["evidence"]), exit2
