"""``acceptrun bench comm``: all-reduce bandwidth, a DDP bucket sweep, scaling 1..N processes.

N worker processes (``python -m acceptrun.tune.comm``) join one torch.distributed group
on 127.0.0.1 (gloo on CPUs, nccl on GPUs, one GPU per process) and measure:

- all-reduce of float32 messages of each size: the median over ``iters`` of the slowest
  rank's time t, then, with the definitions of nccl-tests (doc/PERFORMANCE.md in
  github.com/NVIDIA/nccl-tests)::

      algbw = S / t                       S: message size in bytes
      busbw = algbw * 2 (n - 1) / n       what each link carries in a ring all-reduce,
                                          comparable with the hardware's bandwidth

- DDP training steps of a small MLP for each ``bucket_cap_mb`` (gradient buckets: small
  ones start communication early, large ones make fewer calls);
- the same DDP step on 1, 2, ..., N processes (subgroups of the world group), with the
  scaling efficiency throughput(k) / (k * throughput(1)).

Rank 0 writes the figures as JSON; the parent prints them.

Across nodes (``nodes`` > 1, inside a Slurm allocation of that many nodes, e.g.
``sbatch -N 2 --wrap "acceptrun bench comm --nodes 2 --procs 1"``) the workers are one
``srun`` step of ``nodes x procs`` tasks, ranked by Slurm (``SLURM_PROCID``), meeting on
the node that runs the command; the scaling rows then run on the first k ranks, which
cross the node boundary once k exceeds the processes per node.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun._util.net import free_port
from acceptrun._util.units import format_bytes_exact
from acceptrun.errors import UserError

__all__ = ["CommOptions", "busbw", "format_comm", "run_comm"]

_log = get_logger(__name__)

CPU_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
GPU_SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
NCCL_TESTS = (
    "nccl-tests doc/PERFORMANCE.md: algbw = size / time; busbw = algbw * 2(n-1)/n for all-reduce"
)


def busbw(algbw: float, n: int) -> float:
    """Bus bandwidth of an all-reduce over ``n`` ranks (nccl-tests' definition).

    >>> busbw(10.0, 2)
    10.0
    """
    return algbw * 2 * (n - 1) / n


@dataclass(kw_only=True)
class CommOptions:
    """What `acceptrun bench comm` measures."""

    backend: str | None = None
    """gloo or nccl; None: nccl when the machine has NVIDIA GPUs, else gloo."""
    procs: int | None = None
    """Processes (per node); None: one per GPU for nccl, 2 for gloo."""
    nodes: int = 1
    """Nodes; more than 1 runs the workers through srun inside a Slurm allocation."""
    sizes: list[int] = field(default_factory=list)
    """All-reduce message sizes in bytes; empty: a default per backend."""
    buckets_mb: list[float] = field(default_factory=lambda: [1.0, 5.0, 25.0, 100.0])
    """DDP bucket_cap_mb values to sweep."""
    iters: int = 10
    """Timed all-reduces per size."""
    warmup: int = 3
    """Untimed all-reduces (and DDP steps) first."""
    ddp_steps: int = 8
    """Timed DDP steps per setting."""
    timeout: float = 300.0
    """Seconds for the whole benchmark; the workers are killed after it."""


def _gpu_count() -> int:
    from acceptrun.capture.provenance import _gpus_part

    part = _gpus_part()
    return int(part.get("count", 0)) if not part.get("absent") else 0


def run_comm(options: CommOptions) -> dict[str, Any]:
    """Start the workers, wait for them, return rank 0's figures."""
    gpus = _gpu_count()
    backend = options.backend or ("nccl" if gpus else "gloo")
    procs = options.procs or (max(gpus, 1) if backend == "nccl" else 2)
    if procs < 1:
        raise UserError(f"--procs is {procs}; use 1 or more")
    if backend == "nccl" and procs > gpus:
        raise UserError(
            f"--backend nccl with --procs {procs}: this machine has {gpus} NVIDIA GPU(s) and "
            "nccl needs one per process; lower --procs or use --backend gloo"
        )
    if options.nodes < 1:
        raise UserError(f"--nodes is {options.nodes}; use 1 or more")
    sizes = options.sizes or (GPU_SIZES if backend == "nccl" else CPU_SIZES)
    world = procs * options.nodes
    job = {**asdict(options), "backend": backend, "procs": world, "sizes": sizes}
    if options.nodes > 1:
        return _run_across_nodes(options, job, procs)
    workdir = Path(tempfile.mkdtemp(prefix="acceptrun-comm-"))
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    job_path.write_text(json.dumps(job))
    port = free_port("127.0.0.1")
    _log.info(f"bench comm: {procs} processes, {backend}, {len(sizes)} sizes")
    workers = []
    deadline = time.monotonic() + options.timeout
    for rank in range(procs):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(procs),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        log = open(workdir / f"rank{rank}.log", "wb")  # noqa: SIM115 (closed below)
        workers.append((subprocess.Popen(
            [sys.executable, "-m", "acceptrun.tune.comm", str(job_path), str(result_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        ), log))  # fmt: skip
    failed = []
    for rank, (proc, log) in enumerate(workers):
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p, _ in workers:
                p.kill()
            code = proc.wait()
            failed.append(f"rank {rank} timed out after {options.timeout:.0f} s")
        log.close()
        if code != 0 and not failed:
            tail = (workdir / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
            failed.append(f"rank {rank} exited {code}: {tail[-1] if tail else 'no output'}")
    if failed or not result_path.exists():
        raise UserError(
            f"bench comm failed ({'; '.join(failed) or 'no result'}); logs in {workdir}"
        )
    result: dict[str, Any] = json.loads(result_path.read_text())
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when it failed: its logs
    return result


def _run_across_nodes(options: CommOptions, job: dict[str, Any], per_node: int) -> dict[str, Any]:
    """The workers as one srun step over ``options.nodes`` nodes of this Slurm allocation."""
    allocated = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
    srun = shutil.which("srun")
    if not allocated or srun is None:
        raise UserError(
            f"--nodes {options.nodes}: not inside a Slurm allocation (no SLURM_JOB_NUM_NODES"
            f"{'' if srun else ', no srun on PATH'}); run it in one, e.g. sbatch -N "
            f'{options.nodes} --wrap "acceptrun bench comm --nodes {options.nodes}"'
        )
    if int(allocated) < options.nodes:
        raise UserError(
            f"--nodes {options.nodes}: this Slurm allocation has {allocated} node(s); ask "
            f"for {options.nodes} (sbatch -N {options.nodes}) or lower --nodes"
        )
    workdir = Path(tempfile.mkdtemp(prefix="acceptrun-comm-", dir=os.getcwd()))  # shared
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    job_path.write_text(json.dumps(job))
    from acceptrun.workload.distributed import ENV_RDZV_HOST  # the same override as runs

    host = os.environ.get(ENV_RDZV_HOST) or socket.gethostname()
    env = {**os.environ, "MASTER_ADDR": host, "MASTER_PORT": str(free_port("127.0.0.1"))}
    argv = [
        srun, f"--nodes={options.nodes}", f"--ntasks-per-node={per_node}",
        f"--ntasks={options.nodes * per_node}", "--kill-on-bad-exit=1",
        f"--output={workdir}/rank%t.log",
        sys.executable, "-m", "acceptrun.tune.comm", str(job_path), str(result_path),
    ]  # fmt: skip
    _log.info(f"bench comm: {options.nodes} nodes x {per_node} processes, {job['backend']}")
    try:
        proc = subprocess.run(
            argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=options.timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(
            f"bench comm across {options.nodes} nodes timed out after {options.timeout:.0f} s; "
            f"logs in {workdir}"
        ) from None
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise UserError(
            f"bench comm across {options.nodes} nodes failed (srun exited {proc.returncode}: "
            f"{tail[-1] if tail else 'no output'}); logs in {workdir}"
        )
    result: dict[str, Any] = json.loads(result_path.read_text())
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when it failed: its logs
    return result


def format_comm(result: dict[str, Any]) -> str:
    """The three tables as plain text."""
    n = result["procs"]
    where = result.get("hosts")
    nodes = (
        f" over {result['nodes']} nodes ({', '.join(where)})"
        if result.get("nodes", 1) > 1 and where
        else ""
    )
    lines = [f"bench comm: {result['backend']}, {n} processes{nodes} on {result['device']}"]
    lines += [f"  note: {note}" for note in result.get("notes", [])]
    lines.append(f"all-reduce (float32; {result['definition']})")
    lines.append(f"  {'size':>10} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
    for row in result["allreduce"]:
        lines.append(f"  {format_bytes_exact(row['bytes']):>10} {row['time_s'] * 1e6:>10.1f} "
                     f"{row['algbw_gbps']:>11.3f} {row['busbw_gbps']:>11.3f}")  # fmt: skip
    lines.append(f"DDP bucket sweep ({result['model']})")
    lines.append(f"  {'bucket MB':>10} {'step ms':>10} {'samples/s':>10}")
    for row in result["buckets"]:
        lines.append(
            f"  {row['bucket_cap_mb']:>10g} {row['step_s'] * 1e3:>10.2f} {row['samples_per_s']:>10.1f}"
        )
    lines.append("scaling (DDP, bucket 25 MB)")
    lines.append(f"  {'procs':>5} {'step ms':>10} {'samples/s':>10} {'efficiency':>10}")
    for row in result["scaling"]:
        lines.append(f"  {row['procs']:>5} {row['step_s'] * 1e3:>10.2f} {row['samples_per_s']:>10.1f} "
                     f"{row['efficiency']:>10.1%}")  # fmt: skip
    if any(row["efficiency"] > 1.0 for row in result["scaling"]):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        lines.append(
            "  note: an efficiency above 100% is no real speed-up: the 1-process baseline "
            "ran while the other ranks waited on the same machine (load average "
            f"{load:.1f}); measure on an idle machine"
        )
    return "\n".join(lines) + "\n"


# ---- the worker --------------------------------------------------------------------------


@dataclass(slots=True)
class _Rank:
    """This worker's place in the group: its rank, the group's size, its device."""

    rank: int
    world: int
    device: Any  # torch.device
    nccl: bool

    def sync(self) -> None:
        """Wait for the device's queued work (a GPU's; nothing to wait for on a CPU)."""
        import torch

        if self.nccl:
            torch.cuda.synchronize(self.device)

    def slowest(self, times: list[float]) -> list[float]:
        """Per-iteration max over ranks: a collective ends when its slowest rank does."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(x) for x in t.cpu()]


def _worker(job: dict[str, Any], result_path: str) -> None:
    """One rank of the benchmark: join the group, measure, rank 0 writes the figures."""
    import torch
    import torch.distributed as dist

    me = _join(job)
    out: dict[str, Any] = {"backend": job["backend"], "procs": me.world, "definition": NCCL_TESTS,
                           "device": torch.cuda.get_device_name(me.device) if me.nccl else "cpu",
                           "notes": [], "allreduce": [], "buckets": [], "scaling": []}  # fmt: skip
    hosts: list[Any] = [None] * me.world
    dist.all_gather_object(
        hosts, socket.gethostname() + ":" + os.environ.get("SLURMD_NODENAME", "")
    )
    out["nodes"] = job.get("nodes", 1)
    out["hosts"] = sorted({h.split(":")[1] or h.split(":")[0] for h in hosts})
    if me.world == 1:
        out["notes"].append(
            "one process: an all-reduce crosses no device (busbw is 0 by definition); the "
            "times are the collective's fixed cost and, for DDP, its bucketing overhead"
        )
    out["allreduce"] = _allreduce_rows(job, me)
    width, depth, batch = (4096, 8, 64) if me.nccl else (512, 6, 32)
    out["model"] = f"MLP {depth} x {width}, batch {batch} per process"
    out["buckets"], out["scaling"] = _ddp_rows(job, me, (width, depth, batch))
    if me.rank == 0:
        from acceptrun._util.durable import write_json_atomic

        write_json_atomic(result_path, out)
    dist.destroy_process_group()


def _join(job: dict[str, Any]) -> _Rank:
    """Find this process's rank and device and join the process group."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # Started by run_comm (RANK, WORLD_SIZE) or as an srun task across nodes (SLURM_*).
    rank = int(os.environ.get("RANK") or os.environ["SLURM_PROCID"])
    world = int(os.environ.get("WORLD_SIZE") or os.environ["SLURM_NTASKS"])
    local, on_node = rank, world  # one node: every rank on this one
    if "RANK" not in os.environ:  # an srun task: Slurm says where it sits
        local = int(os.environ.get("SLURM_LOCALID", "0"))
        on_node = int(os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)
    nccl = job["backend"] == "nccl"
    if nccl:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # Share the cores: N processes with all threads each would fight over them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // on_node))
    dist.init_process_group(
        job["backend"], rank=rank, world_size=world, timeout=timedelta(seconds=job["timeout"]),
        device_id=device if nccl else None,
    )  # fmt: skip
    return _Rank(rank, world, device, nccl)


def _allreduce_rows(job: dict[str, Any], me: _Rank) -> list[dict[str, float]]:
    """All-reduce of each message size: the median slowest-rank time and its bandwidths."""
    import torch
    import torch.distributed as dist

    rows = []
    for size in job["sizes"]:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=me.device)
        for _ in range(job["warmup"]):
            dist.all_reduce(x)
        me.sync()
        times = []
        for _ in range(job["iters"]):
            me.sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            me.sync()
            times.append(time.perf_counter() - t0)
        t = statistics.median(me.slowest(times))
        alg = x.numel() * 4 / t
        rows.append({"bytes": x.numel() * 4, "time_s": t, "algbw_gbps": alg / 1e9,
                     "busbw_gbps": busbw(alg, me.world) / 1e9})  # fmt: skip
        del x
    return rows


def _ddp_rows(
    job: dict[str, Any], me: _Rank, shape: tuple[int, int, int]
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The DDP bucket sweep's rows, then the scaling rows on the first 1..N ranks."""
    import torch.distributed as dist

    batch = shape[2]
    buckets = []
    for bucket in job["buckets_mb"]:
        t = statistics.median(me.slowest([_ddp_step_time(job, me, shape, bucket, None)]))
        buckets.append(
            {"bucket_cap_mb": bucket, "step_s": t, "samples_per_s": me.world * batch / t}
        )
    # Subgroups for 1..N processes; every rank must create every group, in the same order.
    groups = [dist.new_group(list(range(k))) for k in range(1, me.world + 1)]
    base = None
    scaling = []
    for k, group in zip(range(1, me.world + 1), groups, strict=True):
        t = _ddp_step_time(job, me, shape, 25.0, group) if me.rank < k else 0.0
        t = max(me.slowest([t]))
        total = k * batch / t
        base = base or total
        scaling.append(
            {"procs": k, "step_s": t, "samples_per_s": total, "efficiency": total / (k * base)}
        )
        dist.barrier()
    return buckets, scaling


def _ddp_step_time(
    job: dict[str, Any], me: _Rank, shape: tuple[int, int, int], bucket_mb: float, group: Any
) -> float:
    """The median time of a DDP training step of the MLP ``shape`` (width, depth, batch)."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    width, depth, batch = shape
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers).to(me.device)
    ddp = DDP(
        model, device_ids=[me.rank] if me.nccl else None, bucket_cap_mb=bucket_mb,
        process_group=group,
    )  # fmt: skip
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    data = torch.randn(batch, width, device=me.device)
    times = []
    for i in range(job["warmup"] + job["ddp_steps"]):
        me.sync()
        t0 = time.perf_counter()
        ddp(data).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        me.sync()
        if i >= job["warmup"]:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m acceptrun.tune.comm JOB.json RESULT.json (RANK, WORLD_SIZE, "
              "MASTER_ADDR, MASTER_PORT in the environment)", file=sys.stderr)  # fmt: skip
        return 2
    _worker(json.loads(Path(args[0]).read_text()), args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
