"""Declared outputs ([outputs]): checked, hashed and recorded after each attempt of a real run."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from acceptrun._util.hashing import hash_file
from acceptrun.record.workspace import RunRecord
from conftest import Project

WRITES_MODEL = """
import os
os.makedirs("out", exist_ok=True)
for i in range(1, 4):
    print(f"iter {i}: loss 0.5", flush=True)
with open("out/model.bin", "wb") as f:
    f.write(b"weights" * 100)
"""
PROGRESS = "[progress]\npattern = 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'\n"


def verdict(record: RunRecord) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((record.path / "verdict.json").read_text())
    return data


def check(record: RunRecord, name: str) -> dict[str, Any]:
    (found,) = [c for c in verdict(record)["checks"] if c["name"] == name]
    return found


def test_declared_output_is_hashed_with_its_lineage(project: Project) -> None:
    spec = project.spec(
        WRITES_MODEL,
        extra=PROGRESS + '[outputs]\nmodel = "out/model.bin"\n[acceptance]\noutputs = ["model"]\n',
    )
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = project.only_record()
    (ev,) = record.events("output")
    path = project.root / "out" / "model.bin"
    digest, size = hash_file(path)
    assert ev["name"] == "model" and ev["path"] == str(path)
    assert (ev["hash"], ev["size"]) == (digest, size) and size == 700
    assert ev["run_id"] == record.run_id and ev["attempt"] == 1 and ev["step"] == 3
    assert ev["source"] == "spec"
    c = check(record, "output model")
    assert c["status"] == "pass" and c["required"]


def test_missing_declared_output_fails_the_verdict_naming_it(project: Project) -> None:
    spec = project.spec(
        "print('trained, but forgot to save')\n",
        extra='[outputs]\nmodel = "out/model.bin"\n[acceptance]\noutputs = ["model"]\n',
    )
    proc = project.cli("run", str(spec), timeout=120)
    assert proc.returncode == 1
    record = project.only_record()
    (missing,) = record.events("output_missing")
    assert missing["name"] == "model" and "no file at" in missing["reason"]
    assert "output model" in verdict(record)["failed"]
    c = check(record, "output model")
    assert c["status"] == "fail" and "out/model.bin" in c["evidence"]
    assert "[outputs]" in c["fix"]


def test_a_glob_registers_the_newest_match(project: Project) -> None:
    spec = project.spec(
        """
        import os, time
        os.makedirs("out", exist_ok=True)
        for step in (100, 200):
            with open(f"out/ckpt-{step}.pt", "wb") as f:
                f.write(str(step).encode() * 10)
            os.utime(f"out/ckpt-{step}.pt", (time.time() + step / 100,) * 2)
        """,
        extra='[outputs]\nfinal = "out/ckpt-*.pt"\n[acceptance]\noutputs = ["final"]\n',
    )
    assert project.cli("run", str(spec), timeout=120).returncode == 0
    (ev,) = project.only_record().events("output")
    assert ev["path"].endswith("ckpt-200.pt") and ev["matched"] == 2


def test_a_file_from_before_the_run_is_not_its_output(project: Project) -> None:
    stale = project.root / "out" / "model.bin"
    stale.parent.mkdir()
    stale.write_bytes(b"last week's model")
    old = time.time() - 7 * 86400
    os.utime(stale, (old, old))
    spec = project.spec(
        "print('did not write the model')\n",
        extra='[outputs]\nmodel = "out/model.bin"\n[acceptance]\noutputs = ["model"]\n',
    )
    assert project.cli("run", str(spec), timeout=120).returncode == 1
    (missing,) = project.only_record().events("output_missing")
    assert "before this run started" in missing["reason"]


def test_spec_check_lists_declared_and_registered_outputs(project: Project) -> None:
    spec = project.spec(
        "import acceptrun\nrun = acceptrun.init()\nrun.output('metrics', 'm.json')\n",
        extra='[outputs]\nmodel = "out/model.bin"\n[acceptance]\noutputs = ["model", "metrics"]\n',
    )
    proc = project.cli("spec", "check", str(spec), check_rc=0)
    assert "declared in [outputs]: model = out/model.bin" in proc.stdout
    assert "the script must register: metrics" in proc.stdout
    assert "uses      client" in proc.stdout


def test_required_output_nobody_provides_is_refused_before_any_record(project: Project) -> None:
    spec = project.spec(
        "print('hello')\n",
        extra='[outputs]\nmodel = "out/model.bin"\n[acceptance]\noutputs = ["model", "report"]\n',
    )
    for args in (("spec", "check", str(spec)), ("run", str(spec))):
        proc = project.cli(*args, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "acceptance.outputs: 'report' is required" in proc.stderr
        assert '[outputs] report = "path/to/file"' in proc.stderr  # the fix
    assert project.run_ids() == []  # refused before any record (and any GPU time)
