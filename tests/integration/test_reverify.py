"""A restart re-verifies what preflight verified: a real `acceptrun run` whose data file,
or whose package's version, changes between attempts is not restarted, and says what
changed (capture/reverify.py).

The change is made by the faults the campaign uses (``datachange``, ``pkgchange``), on
files of the test's own marked as scratch, then the workload kills itself after a
checkpoint; the restart must refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acceptrun.capture import data as datamod
from acceptrun.record.view import RecordView
from acceptrun.workload.inject import SCRATCH_MARKER, SCRATCH_PACKAGE, SCRATCH_VERSIONS
from conftest import Project, toml_str

# A client loop of 12 steps checkpointed every 2 (the faults fire at a step, not a time).
SCRIPT = """
import acceptrun

run = acceptrun.init()
start = run.restore(state={"x": 0})
for step in run.steps(start, 12):
    run.log(step, loss=1.0 / (step + 1))
    run.maybe_checkpoint(step)
"""


def _run(project: Project, extra: str, fault: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = project.spec(
        SCRIPT,
        extra="[checkpoint]\nevery_steps = 2\n[limits]\nmax_restarts = 3\n"
        "restart_backoff = 0\n" + extra,
    )
    proc = project.cli("run", "--inject", fault, str(spec), timeout=120)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = project.only_record()
    exits = [e for e in RecordView(rec).all_events if e["kind"] == "attempt_exit"]
    verdict = json.loads(rec.file("verdict.json").read_text())
    return verdict, [*exits, *(e for e in rec.events("reverify"))]


def _check(verdict: dict[str, Any], group: str, name: str) -> dict[str, Any]:
    found = [c for c in verdict["checks"] if c["group"] == group and c["name"] == name]
    assert found, [(c["group"], c["name"]) for c in verdict["checks"]]
    return found[-1]


def test_a_data_file_changed_between_attempts_stops_the_run(project: Project) -> None:
    scratch = project.root / "scratch"
    data = scratch / "data"
    data.mkdir(parents=True)
    (scratch / SCRATCH_MARKER).write_text("test\n")
    (data / "a.bin").write_bytes(b"\x01" * 4096)
    (data / "b.bin").write_bytes(b"\x02" * 4096)
    datamod.write_manifest(project.root / "data.manifest.json", datamod.snapshot(data))
    extra = f'[data]\npath = {toml_str(str(data))}\nmanifest = "data.manifest.json"\n'
    verdict, events = _run(project, extra, "datachange@step=3:after=checkpoint")

    exits = [e for e in events if e["kind"] == "attempt_exit"]
    assert [e["class"] for e in exits] == ["killed", "setup_changed"], exits
    refused = exits[-1]
    assert refused["outcome"] == "not_started" and refused["attempt"] == 2
    assert any("a.bin: hash" in line for line in refused["evidence"]), refused
    (check,) = [e for e in events if e["kind"] == "reverify"]
    assert check["ok"] is False and check["data"]["changed"][0]["path"] == "a.bin"
    # b.bin was not changed: it verified again (by its stat, or hashed when too fresh)
    assert check["data"]["files"] == 2
    data_check = _check(verdict, "data", "data verified")
    assert data_check["status"] == "fail" and "a.bin" in data_check["evidence"]
    assert "restore the data" in data_check["fix"]
    assert not verdict["accepted"]


def test_a_package_version_changed_between_attempts_stops_the_run(project: Project) -> None:
    site = project.root / "site"
    name = SCRATCH_PACKAGE.replace("-", "_")
    info = site / f"{name}-{SCRATCH_VERSIONS[0]}.dist-info"
    info.mkdir(parents=True)
    (site / SCRATCH_MARKER).write_text("test\n")
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {SCRATCH_PACKAGE}\nVersion: {SCRATCH_VERSIONS[0]}\n\n"
    )
    extra = f"[env]\nPYTHONPATH = {toml_str(str(site))}\n"
    verdict, events = _run(project, extra, "pkgchange@step=3:after=checkpoint")

    exits = [e for e in events if e["kind"] == "attempt_exit"]
    assert [e["class"] for e in exits] == ["killed", "setup_changed"], exits
    old, new = SCRATCH_VERSIONS
    line = f"{SCRATCH_PACKAGE} {old} -> {new}"
    assert any(line in e for e in exits[-1]["evidence"]), exits[-1]
    (check,) = [e for e in events if e["kind"] == "reverify"]
    assert check["environment"]["changed"] == [line]
    setup = _check(verdict, "setup", "environment")
    assert setup["status"] == "fail" and line in setup["evidence"]
    assert not verdict["accepted"]


def _data_spec(project: Project, limits: str) -> tuple[Path, Path]:
    """A spec whose [data] is one 4 KiB file with its manifest: (the data folder, the spec)."""
    data = project.root / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"\x01" * 4096)
    datamod.write_manifest(project.root / "data.manifest.json", datamod.snapshot(data))
    spec = project.spec(
        SCRIPT,
        extra=f"[checkpoint]\nevery_steps = 2\n[limits]\n{limits}"
        '[data]\npath = "data"\nmanifest = "data.manifest.json"\n',
    )
    return data, spec


def test_an_unchanged_restart_is_re_verified_and_goes_on(project: Project) -> None:
    _, spec = _data_spec(project, "max_restarts = 3\nrestart_backoff = 0\n")
    proc = project.cli("run", "--inject", "kill@step=3:after=checkpoint", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = project.only_record()
    (check,) = list(rec.events("reverify"))
    assert check["ok"] is True and check["attempt"] == 2
    assert check["data"]["files"] == 1 and check["environment"]["ok"] is True
    exits = [e["class"] for e in RecordView(rec).all_events if e["kind"] == "attempt_exit"]
    assert exits == ["killed", "success"]


def test_a_resume_after_the_data_changed_is_refused(project: Project) -> None:
    data, spec = _data_spec(project, "max_restarts = 0\n")
    proc = project.cli("run", "--inject", "kill@step=3:after=checkpoint", str(spec), timeout=120)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rec = project.only_record()
    (data / "a.bin").write_bytes(b"\x01" * 4095)  # between the run and its resume
    proc = project.cli("resume", rec.run_id, timeout=120)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exits = [e for e in RecordView(rec).all_events if e["kind"] == "attempt_exit"]
    assert [e["class"] for e in exits] == ["killed", "setup_changed"], exits
    assert "a.bin: size 4096 expected, 4095 found" in exits[-1]["evidence"]
