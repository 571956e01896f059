"""The Slurm backend against a real single-node Slurm (tools/slurm_local.py).

One cluster is started for the module. Jobs run a tiny torch loop through the client
API with checkpoints; the tests requeue, signal and cancel them with Slurm's own
commands and read the run records the jobs leave behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acceptrun.backends.slurm import batch_script, cancel, jobs, submit
from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.model import load_spec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from slurm_local import LocalSlurm  # noqa: E402

WAIT_S = 180.0  # seconds a job may take on a loaded 2-core machine

TRAIN = """\
import os, time
import torch
import acceptrun

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
total = int(os.environ["TOTAL"])
for step in run.steps(start, total):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
    loss = (model(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.log(step, loss=loss.item())
    run.maybe_checkpoint(step)
    time.sleep(float(os.environ["STEP_S"]))
run.metric("final/loss", loss.item())
"""


def _missing() -> list[str]:
    return [t for t in ("slurmctld", "slurmd", "munged", "sbatch") if not _which(t)]


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    missing = _missing()
    if missing:
        why = f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=8) as slurm:
        yield slurm


@pytest.fixture
def ws(cluster: LocalSlurm, tmp_path: Path) -> Workspace:
    """A workspace whose Slurm commands talk to the module's cluster."""
    os.environ["SLURM_CONF"] = str(cluster.conf)  # restored by conftest's clean_environ
    return Workspace.create(tmp_path / ".acceptrun")


def make_spec(root: Path, *, total: int, step_s: float, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(TRAIN)
    spec = root / "spec.toml"
    spec.write_text(
        f'name = "tiny"\ncommand = ["{sys.executable}", "train.py"]\n'
        f'env = {{ TOTAL = "{total}", STEP_S = "{step_s}" }}\n'
        "[checkpoint]\nevery_steps = 5\n"
        '[limits]\ngrace_period = "90s"\n'
        f'[slurm]\nsignal_grace = "120s"\n{extra}'
    )
    return spec


def scontrol(cluster: LocalSlurm, *args: str) -> str:
    proc = subprocess.run(
        ["scontrol", *args], env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def job_row(ws: Workspace, job: str) -> dict[str, Any]:
    return next(r for r in jobs(ws) if r["job"] == job)


def wait_state(ws: Workspace, job: str, *states: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        row = job_row(ws, job)
        if row["state"] in states:
            return row
        assert time.monotonic() < deadline, f"job {job} still {row} after {WAIT_S} s"
        time.sleep(0.5)


def wait_event(record: RunRecord, kind: str, **match: Any) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        if record.exists("events.jsonl"):
            for ev in record.events(kind):
                if all(ev.get(k) == v for k, v in match.items()):
                    return ev
        assert time.monotonic() < deadline, f"no {kind} {match} in {record.path} after {WAIT_S} s"
        time.sleep(0.2)


def wait_closed(record: RunRecord, attempts: int) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        if record.exists("run.json"):
            state = record.state
            if state.get("status") == "finished" and state.get("attempts") == attempts:
                return state
        assert time.monotonic() < deadline, f"{record.path} not closed after {WAIT_S} s"
        time.sleep(0.3)


def slurm_output(record: RunRecord, job: str) -> str:
    return record.file(f"slurm-{job}.out").read_text() + record.file(f"slurm-{job}.err").read_text()


# ---- the batch script ---------------------------------------------------------------------------


def test_sbatch_script_for_a_gpu_spec(tmp_path: Path) -> None:
    spec_path = make_spec(
        tmp_path / "job", total=1, step_s=0,
        extra='partition = "gpu"\naccount = "ml"\nqos = "high"\nextra_args = ["--constraint=h100"]\n'
        '[resources]\ngpus = 4\ncpus = 32\nmemory_gb = 256\n',
    )  # fmt: skip
    text = spec_path.read_text().replace(
        'grace_period = "90s"', 'grace_period = "30s"\nwall_time = "2h"'
    )
    spec_path.write_text(text.replace('signal_grace = "120s"', 'signal_grace = "5m"'))
    ws = Workspace.create(tmp_path / ".acceptrun")
    job_dir = ws.root / "slurm" / "r-1"
    script = batch_script(
        load_spec(spec_path), workspace=ws, run_id="r-1", spec_file=job_dir / "spec.toml",
        job_dir=job_dir, priority=3,
    )  # fmt: skip
    sbatch = [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]
    for option in (
        "--job-name=tiny", "--gres=gpu:4", "--cpus-per-task=32", "--mem=262144M",
        "--time=0-02:00:00", "--requeue", "--signal=B:USR1@300", "--open-mode=append",
        "--partition=gpu", "--account=ml", "--qos=high", "--constraint=h100", "--nice=-3",
        f"--output={job_dir}/slurm-%j.out", f"--error={job_dir}/slurm-%j.err",
        f"--chdir={tmp_path / 'job'}",
    ):  # fmt: skip
        assert option in sbatch, (option, sbatch)
    assert 'run "$SPEC" --run-id "$RUN_ID"' in script
    assert 'resume "$RUN_ID" --force --from-scratch' in script
    assert "trap 'requeue=1;" in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr


# ---- jobs on the cluster ------------------------------------------------------------------------


@pytest.mark.slow
def test_job_runs_to_completion_and_the_record_holds_slurm_output(
    ws: Workspace, tmp_path: Path
) -> None:
    job = submit(make_spec(tmp_path / "job", total=12, step_s=0.05), ws)
    assert job.script.is_file() and job.run_id is not None
    row = wait_state(ws, job.job_id, "COMPLETED", "FAILED", "CANCELLED")
    assert row["state"] == "COMPLETED", row
    assert row["run_id"] == job.run_id and row["name"] == "tiny" and row["priority"] == 0
    assert row["submitted"].endswith("Z") and row["run_status"] == "finished"
    record = RunRecord(ws.runs_dir / job.run_id)
    assert record.state["verdict"] == "accepted"
    assert record.state["attempts"] == 1
    out = slurm_output(record, job.job_id)
    assert f"slurm job {job.job_id} (restart 0)" in out
    assert f"ACCEPTED  tiny  {job.run_id}" in out
    assert "attempt 1 started" in out


@pytest.mark.slow
def test_scontrol_requeue_mid_run_resumes_from_the_checkpoint(
    ws: Workspace, tmp_path: Path, cluster: LocalSlurm
) -> None:
    job = submit(make_spec(tmp_path / "job", total=30, step_s=0.15), ws)
    assert job.run_id is not None
    record = RunRecord(ws.runs_dir / job.run_id)
    wait_event(record, "checkpoint_commit", step=9)
    scontrol(cluster, "requeue", job.job_id)  # SIGTERM to every process of the job
    # The requeued job waits out the credential lifetime (cred_expire) before it starts
    # again. Forcing StartTime=now instead races with the credential's revocation: a job
    # started too early is killed by Slurm ("Job credential revoked") and never resumes.
    wait_state(ws, job.job_id, "PENDING")
    state = wait_closed(record, attempts=2)
    assert state["verdict"] == "accepted"
    first = record.read_json("attempts/1/exit.json")
    assert first["outcome"] == "stopped"
    checkpointed = first["work"]["checkpoint_after"]
    assert checkpointed is not None and checkpointed >= 9
    (resume,) = [e for e in record.events("audit") if e["action"] == "resume"]
    assert resume["from_step"] == checkpointed
    assert resume["reason"] == f"slurm job {job.job_id} requeued (restart 1)"
    start2 = next(e for e in record.events("attempt_start") if e["attempt"] == 2)
    assert start2["resume_step"] == checkpointed
    steps2 = [e["step"] for e in record.events("step") if e.get("attempt") == 2]
    assert steps2 == list(range(checkpointed + 1, 30))  # continues after the checkpoint
    out = slurm_output(record, job.job_id)
    assert "(restart 0)" in out and "(restart 1)" in out
    assert wait_state(ws, job.job_id, "COMPLETED")["state"] == "COMPLETED"


@pytest.mark.slow
def test_time_limit_signal_checkpoints_requeues_and_resumes(
    ws: Workspace, tmp_path: Path, cluster: LocalSlurm
) -> None:
    """--signal=B:USR1@grace, delivered now: what Slurm sends before the time limit."""
    job = submit(make_spec(tmp_path / "job", total=30, step_s=0.15), ws)
    assert job.run_id is not None
    record = RunRecord(ws.runs_dir / job.run_id)
    wait_event(record, "checkpoint_commit", step=4)
    signal = subprocess.run(
        ["scancel", "--batch", "--signal=USR1", job.job_id], env=cluster.env, timeout=60
    )
    assert signal.returncode == 0
    wait_state(ws, job.job_id, "PENDING")  # the batch script requeued its job
    state = wait_closed(record, attempts=2)
    assert state["verdict"] == "accepted"
    first = record.read_json("attempts/1/exit.json")
    assert first["outcome"] == "stopped" and first["work"]["steps_lost"] == 0
    stopped = next(record.events("stopped"))  # the workload checkpointed where it stopped
    (resume,) = [e for e in record.events("audit") if e["action"] == "resume"]
    assert resume["from_step"] == stopped["checkpoint"] == first["work"]["last_step"]
    out = slurm_output(record, job.job_id)
    assert "SIGUSR1 from Slurm: time limit near" in out
    assert f"requeueing slurm job {job.job_id}" in out


@pytest.mark.slow
def test_cancel_a_pending_and_a_running_job(ws: Workspace, tmp_path: Path) -> None:
    held = submit(
        make_spec(tmp_path / "held", total=5, step_s=0, extra='extra_args = ["--hold"]\n'), ws
    )
    assert wait_state(ws, held.job_id, "PENDING")["reason"] == "JobHeldUser"
    cancel(ws, held.job_id)
    assert wait_state(ws, held.job_id, "CANCELLED")["run_status"] is None  # never ran

    job = submit(make_spec(tmp_path / "job", total=400, step_s=0.1), ws)
    assert job.run_id is not None
    record = RunRecord(ws.runs_dir / job.run_id)
    wait_event(record, "checkpoint_commit", step=4)
    cancel(ws, job.run_id)  # by run id: the same job
    state = wait_closed(record, attempts=1)
    assert state["verdict"] == "rejected"
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["outcome"] == "stopped"
    assert exit1["reason"].startswith("stopped on request (acceptrun stop by ")
    assert exit1["work"]["checkpoint_after"] is not None
    (audit,) = [e for e in record.events("audit") if e["action"] == "cancel"]
    assert audit["job"] == job.job_id
    assert wait_state(ws, job.job_id, "CANCELLED")["run_status"] == "finished"
    assert "(restart 1)" not in slurm_output(record, job.job_id)  # cancelled, not requeued
    with pytest.raises(UserError, match="has already ended"):
        cancel(ws, job.job_id)
    with pytest.raises(UserError, match="no Slurm job '999999' was submitted"):
        cancel(ws, "999999")
