"""`acceptrun drill --campaign` with the kinds that change a run's inputs between attempts:
data_changed and package_changed, each injected on the campaign's scratch copy and named
by the restart that refuses to start. The user's own data is left as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from acceptrun.capture import data as datamod
from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("data_changed", "package_changed")


def test_changed_data_and_packages_are_named_on_scratch_copies(tmp_path: Path) -> None:
    project = Project(root=tmp_path / "proj", workspace=tmp_path / ".acceptrun")
    shutil.copytree(ROOT / "examples" / "campaign", project.root)
    data = project.root / "data"
    data.mkdir()
    (data / "x.bin").write_bytes(bytes(range(256)) * 16)
    (data / "y.bin").write_bytes(b"y" * 512)
    manifest = datamod.snapshot(data)
    datamod.write_manifest(project.root / "data.manifest.json", manifest)
    spec = project.root / "spec.toml"
    text = spec.read_text().replace('["python", "train.py"]', json.dumps([PYTHON, "train.py"]))
    spec.write_text(text + '\n[data]\npath = "data"\nmanifest = "data.manifest.json"\n')
    (project.root / "c.toml").write_text(f"kinds = {json.dumps(list(KINDS))}\n")

    proc = project.cli("drill", "--campaign", "c.toml", "--json", "spec.toml", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    card = json.loads(proc.stdout)
    ref = RunRecord(project.runs_dir / card["reference_run"])
    cert = json.loads(ref.file("campaign.json").read_text())
    kinds = {k["kind"]: k for k in cert["kinds"]}
    for name in KINDS:
        k = kinds[name]
        assert k["tried"] and k["truth"]["fired"], k
        said = (k["said"]["class"], k["said"]["whose"], k["said"]["action"])
        assert said == ("setup_changed", "workload", "stop"), k
        assert k["named_right"] and k["final_state"] == "not_comparable", k
    assert "x.bin" in kinds["data_changed"]["said"]["reason"]
    assert "acceptrun-campaign-probe 1.0 -> 1.1" in kinds["package_changed"]["said"]["reason"]
    # The user's data is what it was; the scratch copies are gone.
    assert datamod.verify(data, manifest).ok
    assert not list(project.workspace.glob(".campaign-*"))
