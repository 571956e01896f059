"""`acceptrun drill --campaign` on examples/campaign with a local checkpoint mirror: the
run's own mirror root cut off for a while, then back; acceptrun must put the failed
uploads and the catch-up on record and finish as the reference did (the ground truth)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import PYTHON, Project

ROOT = Path(__file__).resolve().parents[2]


def test_a_mirror_cut_off_and_back_is_on_record_and_the_run_ends_bitwise(project: Project) -> None:
    shutil.copytree(ROOT / "examples" / "campaign", project.root, dirs_exist_ok=True)
    spec = project.root / "spec.toml"
    text = spec.read_text().replace('["python", "train.py"]', json.dumps([PYTHON, "train.py"]))
    spec.write_text(text.replace("keep_last = 3\n", 'keep_last = 3\nmirror = "mirror"\n'))
    (project.root / "c.toml").write_text('kinds = ["mirror_unreachable"]\n')
    proc = project.cli("drill", "--campaign", "c.toml", "--json", "spec.toml", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    card = json.loads(proc.stdout)
    cert = json.loads((project.runs_dir / card["reference_run"] / "campaign.json").read_text())
    (cut,) = cert["kinds"]
    said = cut["said"]
    assert cut["tried"] and cut["truth"]["fired"], cut
    assert (said["class"], said["whose"], said["action"]) == ("success", "none", "none")
    assert said["mirror_failed"] >= 1 and said["mirror_caught_up"], said
    assert cut["named_right"] and cut["final_state"] == "bitwise", cut
    # The cut-off root is back in place, a directory holding the run's mirrored steps.
    root = project.root / "mirror" / cut["run"]
    assert root.is_dir() and not root.with_name(root.name + ".away").exists()
