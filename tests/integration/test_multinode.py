"""Multi-node runs on a real two-node Slurm on localhost (tools/slurm_local.py --nodes 2).

One cluster (nodes n1 and n2) serves the module. Each run is a 2-node x 1-process FSDP2
job (gloo, CPU; fsdp2_worker.py) submitted with ``acceptrun.backends.slurm.submit``:
one supervisor on the first node, one srun step per attempt with one torchrun per node.
The reference run goes to ACCEPTED; a run whose node n2 loses its processes (SIGKILL,
found by SLURMD_NODENAME in /proc/<pid>/environ) is classified ``node_lost`` and
resumes bitwise; a time-limit signal checkpoints on both nodes, requeues and resumes.
The workers wait at a gate file mid-run, so no test depends on the machine's speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from acceptrun.backends.slurm import ACTIVE_STATES, cancel, jobs, submit
from acceptrun.cost.ledger import build_ledger
from acceptrun.record.workspace import RunRecord, Workspace
from conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from slurm_local import LocalSlurm  # noqa: E402

WORKER = Path(__file__).resolve().parent / "fsdp2_worker.py"
WAIT_S = 420.0  # seconds a 2-node job may take on a loaded 2-core machine (torch per rank)
TOTAL, EVERY, HOLD_AT = 14, 4, 9  # checkpoints after steps 3, 7 and 11; the gate after 9

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    missing = [t for t in ("slurmctld", "slurmd", "munged", "sbatch", "srun") if not _which(t)]
    if missing:
        why = f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    with LocalSlurm(tmp_path_factory.mktemp("slurm2"), cpus=4, nodes=2) as slurm:
        yield slurm


def submit_run(cluster: LocalSlurm, root: Path, *, hold: bool) -> tuple[str, RunRecord, Path]:
    """Submit a 2-node job from its own workspace; (job id, its record, the worker's OUT)."""
    os.environ["SLURM_CONF"] = str(cluster.conf)  # restored by conftest's clean_environ
    root.mkdir(parents=True)
    shutil.copy(WORKER, root / "fsdp2_worker.py")
    out = root / "out"
    hold_env = f', HOLD_AT = "{HOLD_AT}"' if hold else ""
    spec = root / "spec.toml"
    spec.write_text(
        f'name = "fsdp2"\ncommand = ["{sys.executable}", "fsdp2_worker.py"]\n'
        f'env = {{ TOTAL = "{TOTAL}", EVERY = "{EVERY}", OUT = "{out}"{hold_env} }}\n'
        "[resources]\nnodes = 2\n"
        '[limits]\ngrace_period = "60s"\n'
        '[slurm]\nsignal_grace = "120s"\n'
    )
    ws = Workspace.create(root / ".acceptrun")
    job = submit(spec, ws)
    assert job.run_id is not None
    return job.job_id, RunRecord(ws.runs_dir / job.run_id), out


def wait_closed(
    record: RunRecord, attempts: int, cluster: LocalSlurm | None = None
) -> dict[str, Any]:
    def closed() -> dict[str, Any] | None:
        if not record.exists("run.json"):
            return None
        state = record.state
        done = state.get("status") == "finished" and state.get("attempts") == attempts
        return state if done else None

    explain = explainer(cluster, record) if cluster is not None else None
    what = f"{record.path} closed after {attempts} attempts"
    return wait_for(closed, WAIT_S, 0.5, what=what, explain=explain)


def tensors(out: Path) -> dict[str, Any]:
    return load_file(str(out / "final.safetensors"))


def assert_bitwise(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    assert len(a) > 6  # 4 model tensors, optimizer moments and steps
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert (
            a[name]
            .view(-1)
            .view(dtype=_raw(a[name]))
            .equal(b[name].view(-1).view(dtype=_raw(b[name])))
        ), name


def _raw(t: Any) -> Any:
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def rank_nodes(out: Path) -> list[str]:
    return sorted(json.loads(p.read_text())["node"] for p in out.glob("rank-*.json"))


def held(out: Path) -> bool:
    return all((out / f"held-{r}").exists() for r in (0, 1))


def explainer(cluster: LocalSlurm, record: RunRecord) -> Any:
    """What a failed wait shows: the queue, the record's last events, the attempt's stderr."""

    def explain() -> str:
        queue = subprocess.run(
            ["squeue", "-o", "%i %T %R"], env=cluster.env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        lines = [f"squeue:\n{queue.stdout}{queue.stderr}"]
        events = record.path / "events.jsonl"
        if events.exists():
            tail = [e for e in events.read_text().splitlines() if '"kind":"step"' not in e]
            lines.append("events (steps left out):\n" + "\n".join(t[:400] for t in tail[-15:]))
        for err in sorted(record.path.glob("attempts/*/stderr.log")):
            lines.append(f"{err}:\n" + "\n".join(err.read_text().splitlines()[-20:]))
        return "\n".join(lines)

    return explain


# ---- the cluster --------------------------------------------------------------------------


def test_two_node_cluster_runs_one_task_on_each_node(cluster: LocalSlurm, tmp_path: Path) -> None:
    assert cluster.nodes == ["n1", "n2"]
    out = tmp_path / "who.txt"
    proc = subprocess.run(
        ["sbatch", "-N", "2", "--ntasks-per-node", "1", f"--output={out}", "--wrap",
         "srun bash -c 'echo node=$SLURMD_NODENAME procid=$SLURM_PROCID'"],
        env=cluster.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    def both() -> list[str] | None:
        lines = sorted(out.read_text().split()) if out.exists() else []
        return lines if len(lines) == 4 else None

    assert wait_for(both, WAIT_S, 0.2, what="both tasks' lines") == [
        "node=n1", "node=n2", "procid=0", "procid=1"
    ]  # fmt: skip
    text = out.read_text()
    assert "node=n1 procid=0" in text and "node=n2 procid=1" in text


# ---- runs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(
    cluster: LocalSlurm, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, RunRecord, Path]:
    """A 2-node FSDP2 run that nothing interrupts; read by several tests."""
    job, record, out = submit_run(cluster, tmp_path_factory.mktemp("ref") / "job", hold=False)
    wait_closed(record, attempts=1, cluster=cluster)
    return job, record, out


def test_two_node_fsdp2_run_is_accepted(reference: tuple[str, RunRecord, Path]) -> None:
    _, record, out = reference
    state = record.state
    assert state["verdict"] == "accepted", state
    assert rank_nodes(out) == ["n1", "n2"]  # one rank on each node
    script = (record.path.parents[1] / "slurm" / record.run_id / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    start = next(record.events("attempt_start"))
    assert start["attempt"] == 1
    commits = sorted(e["step"] for e in record.events("checkpoint_commit"))
    assert commits == [3, 7, 11]
    steps = [e["step"] for e in record.events("step")]
    assert steps == list(range(TOTAL))
    stderr = record.file("attempts/1/stderr.log").read_text()
    for node, task in (("n1", 0), ("n2", 1)):
        assert f"acceptrun-node: node={node} task={task} torchrun exited 0" in stderr
    manifest = record.read_json("checkpoints/step-11/MANIFEST.json")
    assert {"shard-0.bin", "shard-1.bin"} <= set(_manifest_files(manifest))
    assert tensors(out)  # the final state, gathered by rank 0


def _manifest_files(manifest: dict[str, Any]) -> list[str]:
    return list(manifest["files"])  # path -> size and hash


def node_processes(run_id: str, node: str) -> list[int]:
    """Live processes of the run on ``node``: their environment names both."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            f"ACCEPTRUN_RUN_ID={run_id}".encode() in env
            and f"SLURMD_NODENAME={node}".encode() in env
        ):
            found.append(int(entry.name))
    return found


def test_node_lost_mid_run_is_classified_and_resumes_bitwise(
    cluster: LocalSlurm, tmp_path: Path, reference: tuple[str, RunRecord, Path]
) -> None:
    _, record, out = submit_run(cluster, tmp_path / "job", hold=True)
    wait_for(
        lambda: held(out), WAIT_S, 0.2, what="both ranks at the gate after step 9",
        explain=explainer(cluster, record),
    )  # fmt: skip
    # Rank 0 (on either node) writes the step events; its held ones are written within
    # AppendLog.FLUSH_S even while it waits at the gate. Kill only once they are on disk.
    wait_for(
        lambda: any(e["step"] == HOLD_AT - 1 for e in record.events("step")),
        WAIT_S, 0.2, what=f"the step event of step {HOLD_AT - 1} in the record",
    )  # fmt: skip
    victims = node_processes(record.run_id, "n2")
    assert victims, "no process of the run on node n2"
    survivors = node_processes(record.run_id, "n1")
    assert survivors and not set(victims) & set(survivors)
    for pid in victims:  # node n2 dies: its task wrapper, torchrun agent and rank at once
        with contextlib.suppress(ProcessLookupError):  # it ended with its parent
            os.kill(pid, signal.SIGKILL)
    state = wait_closed(record, attempts=2, cluster=cluster)
    assert state["verdict"] == "accepted", state
    first = record.read_json("attempts/1/exit.json")
    assert first["class"] == "node_lost", first
    assert "node n2 lost" in first["class_reason"], first
    evidence = "\n".join(first["evidence"])
    assert "srun: error: n2: task 1: Killed" in evidence, evidence
    assert "srun: error: n1: task 0" in evidence, evidence  # how the other node ended too
    work = first["work"]
    # Step 9 was in flight at the gate, step 7 the last saved. Step 9 still ends on n1 when
    # Slurm's SIGTERM to the survivors (--kill-on-bad-exit) releases its rank from the gate
    # before the step is torn down; either way the steps after 7 are lost.
    assert work["checkpoint_after"] == 7 and work["last_step"] in (HOLD_AT - 1, HOLD_AT)
    assert work["steps_lost"] == work["last_step"] - 7
    assert work["seconds_lost"] > 0
    assert work["node_seconds_lost"] == pytest.approx(2 * work["seconds_lost"], abs=0.01)
    ledger = build_ledger(record)  # both nodes were held for the wall time, lost work too
    assert ledger["nodes"] == 2
    assert ledger["node_seconds"] == pytest.approx(2 * ledger["billed_s"], abs=0.01)
    wasted = ledger["compute"]["split_s"]["wasted"]
    assert wasted > 0 and ledger["node_seconds_wasted"] == pytest.approx(2 * wasted, abs=0.01)
    start2 = next(e for e in record.events("attempt_start") if e["attempt"] == 2)
    assert start2["resume_step"] == 7
    steps2 = [e["step"] for e in record.events("step") if e.get("attempt") == 2]
    assert steps2 == list(range(8, TOTAL))  # the whole job restarted from step 7's checkpoint
    assert_bitwise(tensors(out), tensors(reference[2]))


def test_time_limit_signal_checkpoints_on_both_nodes_requeues_and_resumes(
    cluster: LocalSlurm, tmp_path: Path, reference: tuple[str, RunRecord, Path]
) -> None:
    """--signal=B:USR1@grace, delivered now: what Slurm sends before the time limit."""
    job, record, out = submit_run(cluster, tmp_path / "job", hold=True)
    wait_for(
        lambda: held(out), WAIT_S, 0.2, what="both ranks at the gate after step 9",
        explain=explainer(cluster, record),
    )  # fmt: skip
    sent = subprocess.run(
        ["scancel", "--batch", "--signal=USR1", job], env=cluster.env, timeout=300
    )
    assert sent.returncode == 0
    state = wait_closed(record, attempts=2, cluster=cluster)
    assert state["verdict"] == "accepted", state
    first = record.read_json("attempts/1/exit.json")
    assert first["outcome"] == "stopped", first
    work = first["work"]  # stopped after step 9 with a checkpoint of step 9: nothing lost
    assert work["last_step"] == work["checkpoint_after"] == HOLD_AT and work["steps_lost"] == 0
    assert work["node_seconds_lost"] == pytest.approx(2 * work["seconds_lost"], abs=0.01)
    assert work["seconds_lost"] < first["duration_s"] - work["startup_s"]
    stopped = list(record.events("stopped"))
    assert sorted(e.get("rank") for e in stopped if e["attempt"] == 1) == [0, 1]
    assert {e["checkpoint"] for e in stopped if e["attempt"] == 1} == {HOLD_AT}
    manifest = record.read_json(f"checkpoints/step-{HOLD_AT}/MANIFEST.json")
    # Both nodes wrote their shards of the stop checkpoint, committed once.
    assert {"shard-0.bin", "shard-1.bin"} <= set(_manifest_files(manifest))
    (resume,) = [e for e in record.events("audit") if e["action"] == "resume"]
    assert resume["from_step"] == HOLD_AT
    assert resume["reason"] == f"slurm job {job} requeued (restart 1)"
    steps2 = [e["step"] for e in record.events("step") if e.get("attempt") == 2]
    assert steps2 == list(range(HOLD_AT + 1, TOTAL))
    out_text = record.file(f"slurm-{job}.out").read_text()
    assert "SIGUSR1 from Slurm: time limit near" in out_text
    assert f"requeueing slurm job {job}" in out_text
    assert_bitwise(tensors(out), tensors(reference[2]))


def sbatch_two_nodes(cluster: LocalSlurm, chdir: Path, command: str, log: Path) -> None:
    """Submit ``command`` as a batch job of both nodes, one task each."""
    proc = subprocess.run(
        ["sbatch", "-N", "2", "--ntasks-per-node", "1", f"--chdir={chdir}",
         f"--output={log}", "--wrap", command],
        env=cluster.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_scaling_across_nodes_prints_the_efficiency(cluster: LocalSlurm, tmp_path: Path) -> None:
    """``acceptrun scaling --layouts 1x2,2x1`` inside a 2-node allocation: both layouts run."""
    root = tmp_path / "job"
    root.mkdir()
    shutil.copy(WORKER, root / "fsdp2_worker.py")
    (root / "spec.toml").write_text(
        f'name = "fsdp2"\ncommand = ["{sys.executable}", "fsdp2_worker.py"]\n'
        f'env = {{ TOTAL = "{TOTAL}", EVERY = "{EVERY}", OUT = "{root / "out"}" }}\n'
        '[limits]\ngrace_period = "60s"\n'
    )
    report = tmp_path / "scaling.json"
    command = (
        f"{sys.executable} -m acceptrun --workspace {root / '.acceptrun'} scaling spec.toml "
        f"--layouts 1x2,2x1 --steps 6 --json > {report}"
    )
    sbatch_two_nodes(cluster, root, command, tmp_path / "slurm.out")
    text = wait_for(
        lambda: report.exists() and report.read_text().rstrip().endswith("]") and report.read_text(),
        WAIT_S, 0.5, what=f"{report} (slurm output: {tmp_path / 'slurm.out'})",
    )  # fmt: skip
    points = json.loads(text)
    assert [(p["nodes"], p["processes"]) for p in points] == [(1, 2), (2, 2)]
    for p in points:
        assert p["steps"] == 6 and p["throughput"] > 0 and p["unit"] == "steps/s", p
    assert points[0]["efficiency"] == 1.0
    assert points[1]["efficiency"] == pytest.approx(
        points[1]["throughput"] / points[0]["throughput"]
    )


def test_bench_comm_across_nodes_measures_every_rank_on_both_nodes(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    """``acceptrun bench comm --nodes 2`` inside a 2-node allocation: one srun step, 2 ranks."""
    report = tmp_path / "comm.json"
    command = (
        f"{sys.executable} -m acceptrun bench comm --nodes 2 --procs 1 --sizes 4KiB,64KiB "
        f"--buckets 1 --iters 3 --warmup 1 --ddp-steps 2 --out {report} --timeout 600"
    )
    sbatch_two_nodes(cluster, tmp_path, command, tmp_path / "slurm.out")
    result = wait_for(
        lambda: report.exists() and json.loads(report.read_text()),
        WAIT_S, 0.5, what=f"{report} (slurm output: {tmp_path / 'slurm.out'})",
    )  # fmt: skip
    assert result["procs"] == 2 and result["nodes"] == 2
    assert result["hosts"] == ["n1", "n2"]  # one rank on each node, named by slurmd
    assert [r["bytes"] for r in result["allreduce"]] == [4 << 10, 64 << 10]
    assert all(r["busbw_gbps"] > 0 for r in result["allreduce"])
    assert [r["procs"] for r in result["scaling"]] == [1, 2]


def test_bench_comm_across_nodes_outside_an_allocation_says_how() -> None:
    from acceptrun.errors import UserError
    from acceptrun.tune.comm import CommOptions, run_comm

    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        os.environ.pop(name, None)  # restored by conftest's clean_environ
    with pytest.raises(UserError, match=r"--nodes 2: not inside a Slurm allocation.*sbatch -N 2"):
        run_comm(CommOptions(backend="gloo", procs=1, nodes=2))


def test_cancel_of_a_running_two_node_job_checkpoints_on_both_nodes(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    """`acceptrun cancel` signals the batch shell only: srun never sees a SIGTERM."""
    job, record, out = submit_run(cluster, tmp_path / "job", hold=True)
    ws = Workspace(record.path.parents[1])
    wait_for(
        lambda: held(out), WAIT_S, 0.2, what="both ranks at the gate after step 9",
        explain=explainer(cluster, record),
    )  # fmt: skip
    cancel(ws, job)
    state = wait_closed(record, attempts=1, cluster=cluster)
    assert state["verdict"] == "rejected", state
    first = record.read_json("attempts/1/exit.json")
    assert first["outcome"] == "stopped", first
    assert first["reason"].startswith("stopped on request (acceptrun stop by "), first
    assert first["work"]["checkpoint_after"] == HOLD_AT and first["work"]["steps_lost"] == 0
    stopped = [e for e in record.events("stopped") if e["attempt"] == 1]
    assert sorted(e.get("rank") for e in stopped) == [0, 1]
    manifest = record.read_json(f"checkpoints/step-{HOLD_AT}/MANIFEST.json")
    assert {"shard-0.bin", "shard-1.bin"} <= set(_manifest_files(manifest))

    def ended() -> str | None:
        row = next(r for r in jobs(ws) if r["job"] == job)
        return row["state"] if row["state"] not in ACTIVE_STATES else None

    assert wait_for(ended, WAIT_S, 0.5, what=f"slurm job {job} to end") == "CANCELLED"
    out_text = record.file(f"slurm-{job}.out").read_text()
    assert f"cancelling slurm job {job}" in out_text
    assert "(restart 1)" not in out_text  # cancelled, not requeued
