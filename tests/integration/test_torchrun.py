"""Multi-process runs through torchrun: launch, rank-aware events and checkpoints, resume.

Real torchrun agents and real gloo ranks on CPU (2 processes) run examples/ddp/train.py:
a run to completion with one step event per step and both ranks' state in every
checkpoint; a rank SIGKILLed mid-run, restarted by the supervisor for the whole group and
resumed bit for bit; a graceful stop that checkpoints the same step on both ranks; and the
commands that cannot be launched through torchrun.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from acceptrun.tune.scaling import (
    median_throughput,
)
from conftest import PYTHON, Project, toml_str, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp"


# ---- the launch command (no process) --------------------------------------------------------


def test_a_rank_dies_with_its_parent(tmp_path: Path) -> None:
    """torchrun starts ranks in sessions of their own: a SIGKILLed agent must take them along."""
    pidfile = tmp_path / "child.pid"
    child = (
        "import os, sys, time; from acceptrun.workload.distributed import die_with_parent; "
        "assert die_with_parent(); open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [PYTHON, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
         f"{child!r}, sys.argv[1]], start_new_session=True); time.sleep(60)", str(pidfile)]
    )  # fmt: skip
    try:
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 30, what="child"))
    finally:
        parent.kill()
        parent.wait()

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 60, what=f"rank stand-in {pid} to die with its parent")


def test_bad_command_is_a_spec_error_for_run_and_scaling(project: Project) -> None:
    (project.root / "train.sh").write_text("#!/bin/sh\necho hi\n")
    (project.root / "train.sh").chmod(0o755)
    spec = project.spec(command=["./train.sh"], extra="[resources]\nprocesses = 2\n")
    proc = project.cli("scaling", str(spec), check_rc=2)
    assert "SpecError" in proc.stderr and "'./train.sh' is not a Python interpreter" in proc.stderr
    assert project.run_ids() == []  # refused before any run
    proc = project.cli("run", str(spec), check_rc=2)  # bad input: found before any record
    assert "cannot be launched with resources.processes = 2" in proc.stderr
    assert project.run_ids() == []


# ---- real runs: 2 gloo ranks on CPU ----------------------------------------------------------


def ddp_job(project: Project, name: str, *, steps: int, every: int, env: str = "") -> Path:
    """A copy of examples/ddp with a spec for a short run of 2 ranks."""
    job = project.root / name
    shutil.copytree(EXAMPLE, job, ignore=shutil.ignore_patterns("out", "spec.toml"))
    (job / "spec.toml").write_text(
        f"name = {toml_str(name)}\n"
        f"command = [{toml_str(PYTHON)}, \"train.py\", \"--hidden\", \"32\"]\n"
        f'env = {{ DDP_STEPS = "{steps}"{env} }}\n'
        "[resources]\nprocesses = 2\n"
        f"[checkpoint]\nevery_steps = {every}\nkeep_last = 2\n"
        '[limits]\nmax_restarts = 2\nrestart_backoff = 0\ngrace_period = "60s"\n'
    )  # fmt: skip
    return job / "spec.toml"


def record_of(project: Project, name: str) -> RunRecord:
    (run_id,) = [r for r in project.run_ids() if f"-{name}-" in r]
    return RunRecord(project.runs_dir / run_id)


def events(record: RunRecord, kind: str) -> list[dict[str, Any]]:
    return list(record.events(kind))


def model_hash(record: RunRecord) -> str:
    (out,) = events(record, "output")
    return str(out["hash"])


@pytest.mark.slow
def test_ddp_run_completes_and_a_killed_rank_resumes_bit_exact(project: Project) -> None:
    steps = 30
    project.cli("run", str(ddp_job(project, "ref", steps=steps, every=5)), timeout=240)
    ref = record_of(project, "ref")
    exits = [json.loads(p.read_text()) for p in sorted(ref.path.glob("attempts/*/exit.json"))]
    assert [e["outcome"] for e in exits] == ["success"], exits
    (start,) = events(ref, "attempt_start")
    assert start["command"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
    # One step event per step for the run (rank 0), not one per rank.
    assert [e["step"] for e in events(ref, "step")] == list(range(steps))
    assert all(e["samples"] == 2 * 32 for e in events(ref, "step"))  # both ranks' samples
    assert len(events(ref, "workload_start")) == 1
    assert events(ref, "workload_start")[0]["world_size"] == 2
    store = CheckpointStore(ref.checkpoints_dir)
    latest = store.latest()
    assert latest is not None and latest.step == steps - 1
    assert latest.meta["world_size"] == 2 and latest.meta["layout"] == "gathered"
    assert {f.split("/")[0] for f in latest.files} == {
        "tensors.safetensors", "state.json", "rank-0", "rank-1",
    }  # fmt: skip
    assert {f for f in latest.files if f.startswith("rank-")} == {
        f"rank-{r}/{n}" for r in (0, 1) for n in ("tensors.safetensors", "state.json")
    }
    assert store.verify(latest.step).ok
    # Each rank saved its own data position: rank 1's loader state is its own shard's.
    rank1 = json.loads((latest.path / "rank-1" / "state.json").read_text())
    assert rank1["ranks"] == {"world_size": 2, "rank": 1, "layout": "gathered"}
    assert rank1["objects"]["loader"]["kind"] == "state_dict" and rank1["rng"] is not None
    rate, unit, counted = median_throughput(ref.path)  # what `acceptrun scaling` reports
    assert unit == "samples/s" and rate is not None and rate > 0 and counted == steps
    # The restore drill starts the run as it ran, 2 ranks, and each restores its share.
    proc = project.cli("ckpt", "drill", ref.run_id, timeout=240, check_rc=0)
    drills = events(ref, "drill")
    assert sorted(e["rank"] for e in drills) == [0, 1] and all(e["ok"] for e in drills)
    assert "on 2 ranks" in proc.stdout + proc.stderr

    # Rank 1 dies by SIGKILL after step 17 (its last checkpoint: step 14); torchrun tears
    # the group down and the supervisor restarts both ranks from that checkpoint.
    killed_spec = ddp_job(
        project, "killed", steps=steps, every=5, env=', ACCEPTRUN_INJECT_RANK = "1"'
    )
    project.cli("run", "--inject", "kill@step=17", str(killed_spec), timeout=300)
    killed = record_of(project, "killed")
    exits = [json.loads(p.read_text()) for p in sorted(killed.path.glob("attempts/*/exit.json"))]
    assert [e["outcome"] for e in exits] == ["failed", "success"], exits
    assert exits[0]["class"] in ("distributed", "killed"), exits[0]
    assert exits[0]["decision"].startswith("restart")
    # Step 14's save may still be in flight when rank 1 dies (a step takes milliseconds):
    # then it fails on both ranks and the resume is from step 9.
    (resumed,) = [e["step"] for e in events(killed, "restored")]
    assert resumed in (9, 14)
    assert [e["resume_step"] for e in events(killed, "attempt_start")] == [None, resumed]
    second = [e["step"] for e in events(killed, "step") if e["attempt"] == 2]
    assert second == list(range(resumed + 1, steps))
    assert model_hash(killed) == model_hash(ref)  # bit for bit: the final weights file


@pytest.mark.slow
def test_stop_checkpoints_the_same_step_on_every_rank(project: Project) -> None:
    spec = ddp_job(project, "stop", steps=10**6, every=10**5)
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(project.workspace), "run", "-q",
         str(spec)],
        cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        record = wait_for(lambda: project.run_ids() and record_of(project, "stop"), 300)
        wait_for(lambda: len(events(record, "step")) >= 30, 120, 0.1, "30 steps")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stopped = events(record, "stopped")
    assert sorted(e["rank"] for e in stopped) == [0, 1], (stopped, err[-3000:])
    (step,) = {e["step"] for e in stopped}  # agreed: the same step boundary on both ranks
    assert {e["checkpoint"] for e in stopped} == {step - 1}
    latest = CheckpointStore(record.checkpoints_dir).latest()
    assert latest is not None and latest.step == step - 1
    assert {"rank-0/state.json", "rank-1/state.json"} <= set(latest.files)
    assert max(e["step"] for e in events(record, "step")) == step - 1  # no step lost
    exit_json = json.loads((record.path / "attempts/1/exit.json").read_text())
    assert exit_json["class"] == "stopped", exit_json
    assert events(record, "kill_sent") == []  # it stopped within the grace period
    # No rank failed on the way out: the one traceback is the agent's, reporting the signal.
    log = (record.path / "attempts/1/stderr.log").read_text()
    assert log.count("Traceback (most recent call last)") == 1, log[-3000:]
    assert log.rstrip().endswith("got signal: 15")
