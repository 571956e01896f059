"""Multi-node launch (no process): the srun/torchrun argv, its refusals, node-loss
classification, scaling layouts across nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from acceptrun.backends.slurm import batch_script
from acceptrun.errors import SpecError, UserError
from acceptrun.record.workspace import Workspace
from acceptrun.spec.model import load_spec
from acceptrun.supervisor.classify import AttemptFacts, classify
from acceptrun.tune.scaling import ScalingPoint, format_scaling, parse_layouts, with_efficiency
from acceptrun.workload.distributed import launch_command

SLURM = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2"}


def spec_of(tmp_path: Path, command: str = '["python", "-u", "train.py", "--lr", "3e-4"]'):  # type: ignore[no-untyped-def]
    path = tmp_path / "spec.toml"
    path.write_text(
        f'name = "mn"\ncommand = {command}\n[resources]\nnodes = 2\nprocesses = 3\n'
        '[limits]\ngrace_period = "20s"\n[slurm]\nsignal_grace = "60s"\n'
    )
    return load_spec(path)


def test_one_srun_step_with_one_torchrun_per_node(tmp_path: Path) -> None:
    env = {
        **SLURM, "ACCEPTRUN_RUN_ID": "r-1", "ACCEPTRUN_ATTEMPT": "3",
        "ACCEPTRUN_RDZV_HOST": "node001", "ACCEPTRUN_RDZV_PORT": "29555",
    }  # fmt: skip
    argv = launch_command(spec_of(tmp_path), env)
    step = ["-m", "acceptrun.workload.slurm_step"]
    assert argv[:6] == [sys.executable, *step, "srun", "--", "srun"]
    srun_end = argv.index("--kill-on-bad-exit=1")
    assert argv[6:srun_end] == ["--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1"]
    task = argv[srun_end + 1 :]
    assert task[:5] == ["python", *step, "task", "--"]
    assert task[5:] == [
        "python", "-u", "-m", "torch.distributed.run", "--nnodes", "2",
        "--nproc-per-node", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node001:29555",
        "--rdzv-id", "r-1-a3", "--max-restarts", "0", "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    # torchrun must not SIGKILL a rank that is still saving, and must forward the stop
    assert env["PET_SHUTDOWN_TIMEOUT"] == "20" and "SIGTERM" in env["PET_SIGNALS_TO_HANDLE"]


@pytest.mark.parametrize(
    ("env", "command", "message"),
    [
        pytest.param({}, None, "SLURM_JOB_ID is not set here", id="outside-slurm"),
        pytest.param(
            {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"},
            None,
            "Slurm job 7 has 1 node",
            id="allocation-too-small",
        ),
        pytest.param(SLURM, '"python train.py"', "must be a list", id="shell-string"),
        pytest.param(
            SLURM,
            '["torchrun", "--nnodes", "2", "train.py"]',
            "starts srun and torchrun itself",
            id="own-torchrun",
        ),
    ],
)
def test_what_cannot_start_on_several_nodes(
    tmp_path: Path, env: dict[str, str], command: str | None, message: str
) -> None:
    spec = spec_of(tmp_path) if command is None else spec_of(tmp_path, command)
    with pytest.raises(SpecError, match=message):
        launch_command(spec, dict(env))


def test_batch_script_asks_for_every_node(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    job_dir = ws.root / "slurm" / "r-1"
    script = batch_script(
        spec_of(tmp_path), workspace=ws, run_id="r-1", spec_file=job_dir / "spec.toml",
        job_dir=job_dir,
    )  # fmt: skip
    options = [
        ln.removeprefix("#SBATCH ") for ln in script.splitlines() if ln.startswith("#SBATCH")
    ]
    assert "--nodes=2" in options and "--ntasks-per-node=1" in options
    assert "--ntasks=1" not in options and "--nodes=1" not in options


SRUN_TAIL = """\
[rank0]: step 9 done
acceptrun-node: node=n1 task=0 torchrun killed by SIGKILL
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=12.0
slurmstepd-n1: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-12-01T17:40:02 ***
srun: error: n1: task 0: Killed
"""


def test_a_node_whose_task_died_by_a_signal_first_is_node_lost() -> None:
    got = classify(AttemptFacts(137, None, None, SRUN_TAIL, []))
    assert got.name == "node_lost" and got.retry
    assert got.reason.startswith("node n2 lost: its task 1 ended by Killed")
    assert got.evidence[0] == "srun: error: n2: task 1: Killed"
    assert "srun: error: n1: task 0: Killed" in got.evidence
    assert "acceptrun-node: node=n1 task=0 torchrun killed by SIGKILL" in got.evidence
    assert got.evidence[-1] == "exit status 137"


def test_a_task_that_exited_with_its_own_status_is_not_a_lost_node() -> None:
    tail = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        "RuntimeError: gloo: Connection closed by peer\n"
        "srun: error: n1: task 0: Exited with exit code 1\n"
        "srun: error: n2: task 1: Killed\n"
    )
    got = classify(AttemptFacts(1, None, None, tail, [{"kind": "step", "step": 0}]))
    assert got.name != "node_lost"


def test_srun_ending_the_step_after_a_tasks_own_failure_is_no_preemption() -> None:
    """srun exits 143 once --kill-on-bad-exit ends the step: a SIGTERM nobody outside sent."""
    tail = (
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection "
        "to the C10d store has failed. See inner exception for details.\n"
        "acceptrun-node: node=n1 task=0 torchrun exited 1\n"
        "srun: error: n1: task 0: Exited with exit code 1\n"
        "srun: error: n2: task 1: Terminated\n"
        "srun: Force Terminated StepId=3.1\n"
    )
    got = classify(AttemptFacts(143, None, None, tail, []))
    assert got.name == "distributed" and got.retry, got
    assert any("RendezvousConnectionError" in line for line in got.evidence), got.evidence
    # Without an error it knows, the task's own failure decides: no kill, no preemption.
    plain = (
        "srun: error: n2: task 1: Exited with exit code 3\nsrun: error: n1: task 0: Terminated\n"
    )
    got = classify(AttemptFacts(143, None, None, plain, []))
    assert (
        got.name == "failed"
        and got.evidence[0] == "srun: error: n2: task 1: Exited with exit code 3"
    )
    assert got.reason.startswith("n2: task 1: Exited with exit code 3, and srun ended the step")
    # A step whose tasks were all told to stop by someone else is still a preemption.
    stopped = "srun: error: n1: task 0: Terminated\nsrun: error: n2: task 1: Terminated\n"
    assert classify(AttemptFacts(143, None, None, stopped, [])).name == "preempted"


def test_scaling_layouts_across_nodes() -> None:
    assert parse_layouts("1x2, 2X1,1x2") == [(1, 2), (2, 1)]
    with pytest.raises(UserError, match="'2' is not NODESxPROCESSES"):
        parse_layouts("1x2,2")
    with pytest.raises(UserError, match="'0x2' is not NODESxPROCESSES"):
        parse_layouts("0x2")
    points = with_efficiency(
        [
            ScalingPoint(2, "a", "accepted", 40, 100.0, "steps/s", nodes=1),
            ScalingPoint(2, "b", "accepted", 40, 80.0, "steps/s", nodes=2),
        ]
    )
    assert [p.efficiency for p in points] == [1.0, 0.8]
    assert [p.layout for p in points] == ["1x2", "2x1"]
    assert points[1].to_dict()["nodes"] == 2
    table = format_scaling(points).splitlines()
    assert table[0].split()[:4] == ["nodes", "x", "procs", "processes"]
    assert table[2].split()[:5] == ["2x1", "2", "80", "steps/s", "0.80"]
