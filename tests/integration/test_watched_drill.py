"""The restore drill of a script's own (watched) checkpoints, and `acceptrun drill` on it.

Real ``acceptrun run`` / ``acceptrun ckpt drill`` processes over tests/watched_train.py, a
nanoGPT-shaped loop that knows nothing of acceptrun: it rewrites ``out/ckpt.pt`` and
resumes from it with ``--init_from=resume``. The drill puts the captured checkpoint back
into a scratch copy, resumes the script there and must see a step after the
checkpoint's; the user's working directory and outputs are hashed before and after.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from acceptrun.verdict.decide import compute_verdict
from conftest import PYTHON, Project

TRAIN = Path(__file__).with_name("watched_train.py")
PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)"
ITERS = 100  # the script saves at 25, 50, 75: the newest capture is dated 74 or a little earlier


def _spec(project: Project, *, resume: str = "--init_from=resume", progress: bool = True) -> Path:
    shutil.copy(TRAIN, project.root / "train.py")
    pattern = f"[progress]\npattern = {json.dumps(PATTERN)}\n" if progress else ""
    return project.spec(
        command=[PYTHON, "train.py", "--iters", str(ITERS), "--sleep", "0.03"],
        extra=f"""
[checkpoint]
watch = ["out/ckpt.pt"]
resume_args = [{json.dumps(resume)}]
settle = "0.3s"
[outputs]
weights = "out/weights.sha256"
{pattern}""",
    )


def _tree_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (the user's working directory)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _drill_events(record: RunRecord) -> list[dict[str, Any]]:
    return [e for e in record.events("drill") if e.get("drill") == "restore"]


def _check(record: RunRecord, name: str) -> dict[str, Any]:
    checks = json.loads((record.path / "verdict.json").read_text())["checks"]
    return next(c for c in checks if c["name"] == name)


@pytest.mark.slow
def test_drill_resumes_a_watched_checkpoint_in_a_scratch_copy(project: Project) -> None:
    spec = _spec(project)
    text = spec.read_text() + '[acceptance]\ndrills = ["restore"]\n'
    spec.write_text(text)
    # The spec check accepts a required restore drill here: watch, resume_args, a pattern.
    project.cli("spec", "check", str(spec), check_rc=0)
    # Closed without a drill result: the required drill is not recorded, the run rejected.
    run = project.cli("run", "-q", str(spec), timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    record = project.only_record()
    closed = _check(record, "drill restore")
    assert closed["status"] == "not_recorded" and "acceptrun ckpt drill" in closed["fix"]
    info = CheckpointStore(record.checkpoints_dir).latest()
    assert info is not None and 0 < info.step < ITERS
    before = _tree_hashes(project.root)
    outputs = {e["name"]: e["hash"] for e in record.events("output")}
    assert "weights" in outputs

    drill = project.cli("ckpt", "drill", record.run_id, timeout=300)
    assert drill.returncode == 0, drill.stdout + drill.stderr
    assert f"restore drill PASSED: restored step {info.step} (out/ckpt.pt)" in drill.stdout
    (event,) = _drill_events(record)
    assert event["ok"] and event["step"] == info.step and event["source"] == "watched"
    assert "--init_from=resume" in event["evidence"]
    # It resumed from the stored step: the first step the drill saw is the one after the
    # state the checkpoint holds (nanoGPT saves at the top of iteration 75), not step 0.
    log_dir = record.path / "drills" / "1"
    steps = [e["step"] for e in RunRecord(log_dir).events("step")]
    assert steps and info.step < steps[0] <= info.step + 25 and steps[0] % 25 == 0
    assert f"resuming from out/ckpt.pt at iter {steps[0]}" in (log_dir / "stdout.log").read_text()
    assert f"step {steps[0]} after" in event["evidence"]
    # Nothing of the user's changed, and the run's own events hold no step of the drill.
    assert _tree_hashes(project.root) == before
    assert {e["name"]: e["hash"] for e in record.events("output")} == outputs
    assert max(e["step"] for e in record.events("step")) == ITERS - 1
    assert not (log_dir / "workdir").exists()
    assert json.loads((log_dir / "result.json").read_text())["ok"] is True
    # The required drill now passes.
    verdict = compute_verdict(record)
    (check,) = [c for c in verdict.checks if c.name == "drill restore"]
    assert check.status == "pass", check
    assert verdict.accepted, [c for c in verdict.checks if c.status != "pass" and c.required]


@pytest.mark.slow
def test_drill_fails_a_script_that_ignores_its_resume_flag(project: Project) -> None:
    """``--init_from=scratch`` is accepted by the script and resumes nothing: step 0 again."""
    spec = _spec(project, resume="--init_from=scratch")
    project.cli("run", "-q", str(spec), timeout=300, check_rc=0)
    record = project.only_record()
    info = CheckpointStore(record.checkpoints_dir).latest()
    assert info is not None and info.step > 0
    before = _tree_hashes(project.root)
    drill = project.cli("ckpt", "drill", record.run_id, timeout=300)
    assert drill.returncode == 1, drill.stdout + drill.stderr
    (event,) = _drill_events(record)
    assert not event["ok"]
    assert "the first step it showed was 0 (it trained from scratch)" in event["evidence"]
    assert "--init_from=scratch" in event["evidence"]
    assert "restore drill FAILED" in drill.stdout
    assert _tree_hashes(project.root) == before
    assert compute_verdict(record).accepted  # no restore drill required: the run still is


@pytest.mark.slow
def test_drill_of_a_watched_run_without_progress_is_refused(project: Project) -> None:
    spec = _spec(project, progress=False)
    # Refused before anything runs, so any run with a captured checkpoint will do: this
    # train.py writes its checkpoint and its output and exits (the final pass captures it).
    (project.root / "train.py").write_text(
        "import os\nos.makedirs('out', exist_ok=True)\n"
        "open('out/ckpt.pt', 'wb').write(b'x' * 4096)\n"
        "open('out/weights.sha256', 'w').write('0' * 64)\n"
    )
    project.cli("run", "-q", str(spec), timeout=300, check_rc=0)
    record = project.only_record()
    assert CheckpointStore(record.checkpoints_dir).latest() is not None
    drill = project.cli("ckpt", "drill", record.run_id, timeout=60)
    assert drill.returncode == 2, drill.stdout + drill.stderr
    assert "reads no progress" in drill.stderr and "progress.pattern" in drill.stderr
    assert not (record.path / "drills").exists()  # refused before anything ran
    assert _drill_events(record) == []


def test_a_required_restore_drill_without_a_progress_source_is_an_error(
    project: Project,
) -> None:
    spec = _spec(project, progress=False)
    spec.write_text(spec.read_text() + '[acceptance]\ndrills = ["restore"]\n')
    for args in (("spec", "check", str(spec)), ("run", str(spec))):
        proc = project.cli(*args, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "acceptance.drills" in proc.stderr and "progress.pattern" in proc.stderr
    assert project.run_ids() == []


@pytest.mark.slow
def test_operations_drill_kills_a_watched_script_and_skips_its_preemption(
    project: Project,
) -> None:
    spec = _spec(project)
    spec.write_text(
        spec.read_text()
        + '[limits]\nmax_restarts = 1\nrestart_backoff = "0s"\n'
        + '[acceptance]\ndrills = ["kill", "preempt"]\n'
    )
    check = project.cli("spec", "check", str(spec), check_rc=0)
    assert 'warning: acceptance.drills: "preempt" is required' in check.stderr
    proc = project.cli("drill", str(spec), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "operations drill PASSED (kill only)" in proc.stdout
    assert "preempt  skip not applicable" in proc.stdout
    reference, drilled = (RunRecord(project.runs_dir / i) for i in project.run_ids())
    report = json.loads(drilled.file("drill.json").read_text())
    assert report["ok"] and report["reference_run"] == reference.run_id
    assert len(report["faults"]) == 1
    assert report["faults"][0].startswith("kill@step=")
    kill, preempt = report["drills"]
    assert kill["ok"] and "bitwise equal" in kill["evidence"], kill
    assert preempt["skipped"] and preempt["ok"] is None
    assert "nothing checkpoints on SIGTERM" in preempt["evidence"]
    (restart,) = report["restarts"]
    # The killed attempt resumed from its own captured checkpoint, not from scratch.
    assert restart["resume_step"] is not None
    assert restart["resume_step"] <= restart["first_step"] <= restart["last_step"] + 1
    assert restart["recovery_s"] >= restart["gap_s"] >= 0
    # The verdict: kill passed; preempt is required but could not apply: not recorded, with
    # the reason, never a failure of the script and never a pass.
    checks = {c["name"]: c for c in json.loads(drilled.file("verdict.json").read_text())["checks"]}
    assert checks["drill kill"]["status"] == "pass"
    assert checks["drill preempt"]["status"] == "not_recorded"
    assert "not applicable" in checks["drill preempt"]["evidence"]
    assert "remove" in checks["drill preempt"]["fix"]


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_a_watched_checkpoint_outside_the_workdir_is_refused_before_anything_runs(
    project: Project, tmp_path: Path, where: str
) -> None:
    """A restart (and the drill) writes a watched checkpoint back where it was declared:
    one outside the workdir would be written outside it, so the spec refuses it (exit 2)."""
    outside = tmp_path / "elsewhere" / "ckpt.pt"
    watch = str(outside) if where == "absolute" else "../elsewhere/ckpt.pt"
    spec = project.spec(
        "open('started', 'w').close()",
        extra=f"""
[checkpoint]
watch = [{json.dumps(watch)}]
resume_args = ["--resume"]
""",
    )
    run = project.cli("run", "-q", str(spec), timeout=120, check_rc=2)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(f"SpecError: {spec}: checkpoint.watch: {watch!r}"), run.stderr
    assert "inside the workdir" in run.stderr, run.stderr
    assert project.run_ids() == [] and not (project.root / "started").exists()
