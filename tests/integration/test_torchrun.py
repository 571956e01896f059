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
from acceptrun.errors import SpecError, UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import parse_spec
from acceptrun.tune.scaling import (
    ScalingPoint,
    format_scaling,
    median_throughput,
    parse_counts,
    with_efficiency,
)
from acceptrun.workload.distributed import launch_command, rank_info
from conftest import PYTHON, Project, toml_str, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp"
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
WRAP = [*TORCHRUN, "--nproc-per-node", "2", "--max-restarts", "0"]


def spec_of(command: str, processes: int = 2, grace: str = "30s") -> Any:
    text = f'name = "t"\ncommand = {command}\n[resources]\nprocesses = {processes}\n'
    text += f'[limits]\ngrace_period = "{grace}"\n'
    return parse_spec(text, source="spec.toml")


# ---- the launch command (no process) --------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param(
            '["python", "train.py", "--lr", "1"]',
            ["python", *WRAP, "train.py", "--lr", "1"],
            id="list",
        ),
        pytest.param(
            '["/venv/bin/python3", "-u", "-m", "pkg.train", "x"]',
            ["/venv/bin/python3", "-u", *WRAP, "--module", "pkg.train", "x"],
            id="module",
        ),
        pytest.param(
            '["torchrun", "--nproc-per-node=2", "train.py"]',
            ["torchrun", "--nproc-per-node=2", "train.py"],
            id="torchrun-kept",
        ),
        pytest.param(
            '["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"]',
            ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"],
            id="module-torchrun-kept",
        ),
        pytest.param(
            "\"SEED='a b' python train.py --x 'y z'\"",
            ["/bin/sh", "-c", "SEED='a b' python " + " ".join(WRAP) + " train.py --x 'y z'"],
            id="string",
        ),
    ],
)
def test_launch_command_wraps_python_in_torchrun(command: str, expected: list[str]) -> None:
    env: dict[str, str] = {}
    assert launch_command(spec_of(command, grace="45s"), env) == expected
    assert env["PET_SHUTDOWN_TIMEOUT"] == "45"  # torchrun waits the grace period for ranks
    assert "SIGUSR2" in env["PET_SIGNALS_TO_HANDLE"]  # forwarded for stack dumps
    one = spec_of(command, processes=1)
    assert launch_command(one, {}) == one.command  # one process: the command as written


@pytest.mark.parametrize(
    ("command", "why"),
    [
        pytest.param('["bash", "train.sh"]', "'bash' is not a Python interpreter", id="bash"),
        pytest.param('["python", "-O", "train.py"]', "interpreter option '-O'", id="flag"),
        pytest.param('"cd src && python train.py"', "a shell list", id="shell-list"),
        pytest.param('["torchrun", "--nproc-per-node", "4", "t.py"]', "starts 4", id="nproc"),
    ],
)
def test_launch_command_refuses_what_torchrun_cannot_start(command: str, why: str) -> None:
    with pytest.raises(SpecError, match=r"resources\.processes = 2") as err:
        launch_command(spec_of(command))
    assert why in str(err.value)


def test_rank_info_reads_torchrun_variables() -> None:
    assert rank_info({}) == rank_info({"WORLD_SIZE": "1"})
    info = rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.distributed) == (3, 4, 1, True)
    with pytest.raises(RuntimeError, match="RANK=4 is not a rank of WORLD_SIZE=4"):
        rank_info({"RANK": "4", "WORLD_SIZE": "4"})


def test_scaling_efficiency_against_the_smallest_count() -> None:
    assert parse_counts("2, 1,4,2") == [1, 2, 4]
    with pytest.raises(UserError, match="'0' is not a process count"):
        parse_counts("1,0")
    points = with_efficiency(
        [
            ScalingPoint(1, "r1", "accepted", 50, 1000.0, "samples/s"),
            ScalingPoint(2, "r2", "accepted", 50, 1500.0, "samples/s"),
            ScalingPoint(4, "r4", "rejected; no timed step events", 0, None, "steps/s"),
        ]
    )
    assert [p.efficiency for p in points] == [1.0, 0.75, None]
    table = format_scaling(points).splitlines()
    assert table[0].split() == ["processes", "throughput", "efficiency", "steps", "run", "verdict"]
    assert table[2].split()[:5] == ["2", "1500", "samples/s", "0.75", "50"]
    assert table[3].split()[:3] == ["4", "-", "-"]


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

    wait_for(gone, 10, what=f"rank stand-in {pid} to die with its parent")


def test_store_commits_files_another_rank_wrote_into_the_save(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    owner = store.begin(7)
    owner.write_bytes("state.json", b"{}")
    joined = store.join(7, owner.path)  # what rank 1 does with the path rank 0 broadcast
    joined.write_bytes("rank-1/state.json", b'{"rank": 1}')
    with pytest.raises(UserError, match="begun by another store"):
        store.commit(joined)  # only the owner commits
    store.abort(joined)  # a rank's failure leaves the save to the owner
    assert owner.path.is_dir()
    with pytest.raises(UserError, match="not a staging directory"):
        store.join(8, owner.path)
    owner.adopt(*joined.written())
    info = store.commit(owner)
    assert set(info.files) == {"state.json", "rank-1/state.json"}
    assert store.verify(7).ok
    (info.path / "rank-1" / "state.json").write_bytes(b'{"rank": 2}')
    assert "rank-1/state.json: wrong hash" in store.verify(7).problems[0]


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
        record = wait_for(lambda: project.run_ids() and record_of(project, "stop"), 60)
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
