"""Sharded checkpoint: acceptrun's DCP storage vs DCP's own save/async_save/load, 2 ranks.

The same state (float32 DTensors sharded Shard(0) over 2 CPU ranks, gloo, ``--mb`` MB in
all) is saved in the same run, interleaved per repeat:

- acceptrun: ``sharded.save`` (raw shard bytes hashed while written, fsync of files and
  directories, JSON metadata, manifest, LATEST) - blocks until committed;
- dcp: ``dcp.save`` with its FileSystemWriter (pickled metadata, fsync of files);
- dcp async: ``dcp.async_save`` (stall: until it returns; persist: until its future is done);
- acceptrun async: ``sharded.async_save`` (stall: until it returns, the host copy of the
  rank's shards; persist: until ``wait()`` returns the commit), into a store of its own.

Save stall (seconds the training loop waits), persist throughput (MB/s of state until
durable), and restore: ``sharded.load`` (rank 0 re-hashes the checkpoint first) vs
``dcp.load``. Prints min/median/max over ``--repeats`` and the load average.

    python bench/sharded_checkpoint.py --mb 200 --repeats 3
    python bench/sharded_checkpoint.py --smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from acceptrun.checkpoint import CheckpointStore, sharded


def state(mb: float, world: int, seed: int) -> dict[str, Any]:
    """``mb`` MB of float32 in 8 tensors, each sharded by rows over the ranks."""
    mesh = init_device_mesh("cpu", (world,))
    cols = 1024
    rows = max(world, int(mb * 2**20 / 4 / cols / 8) // world * world)
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    tensors = {
        f"layer{i}.weight": DTensor.from_local(
            torch.randn(rows // world, cols, generator=g), mesh, [Shard(0)], run_check=False
        )
        for i in range(8)
    }
    return {"model": tensors, "train": {"step": 1}}


def timed(fn: Any) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def rank_main(rank: int, world: int, args: argparse.Namespace, base: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{base}/pg",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=600),
    )
    warnings.filterwarnings("ignore")
    sharded.background_group()  # made once at start, as a training script would, not timed
    sd = state(args.mb, world, 0)
    target = state(args.mb, world, 99)
    mb = sum(t.numel() * 4 for t in sd["model"].values()) / 2**20
    store = CheckpointStore(Path(base, "acceptrun"), keep_last=args.repeats + 1)
    async_store = CheckpointStore(Path(base, "acceptrun-async"), keep_last=args.repeats + 1)
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    for i in range(args.repeats):
        one_repeat(i, base, (store, async_store), sd, target, add, rank)
    if rank == 0:
        report(rows, mb, world, args)
    dist.barrier()
    dist.destroy_process_group()


def one_repeat(
    i: int, base: str, stores: tuple[CheckpointStore, CheckpointStore], sd: dict[str, Any],
    target: dict[str, Any], add: Any, rank: int,
) -> None:  # fmt: skip
    """Each kind of save and restore once, as checkpoint ``i``."""
    store, async_store = stores
    add("save acceptrun", timed(lambda: sharded.save(store, i, sd)))
    add("save dcp", timed(lambda: dcp.save(sd, checkpoint_id=f"{base}/dcp-{i}")))
    try:
        stall: list[float] = []

        def run_async() -> None:
            t0 = time.perf_counter()
            fut = dcp.async_save(sd, checkpoint_id=f"{base}/dcp-async-{i}")
            stall.append(time.perf_counter() - t0)
            fut.result()

        add("save dcp async (persist)", timed(run_async))
        add("save dcp async (stall)", stall[0])
    except Exception as exc:  # async_save on CPU/gloo: report, compare the rest
        if rank == 0 and i == 0:
            print(f"dcp.async_save failed: {type(exc).__name__}: {exc}")
    stalled: list[float] = []

    def run_acceptrun_async() -> None:
        t0 = time.perf_counter()
        pending = sharded.async_save(async_store, i, sd)
        stalled.append(time.perf_counter() - t0)
        pending.wait()

    add("save acceptrun async (persist)", timed(run_acceptrun_async))
    add("save acceptrun async (stall)", stalled[0])
    add("restore acceptrun", timed(lambda: sharded.load(store, target, step=i)))
    add("restore dcp", timed(lambda: dcp.load(target, checkpoint_id=f"{base}/dcp-{i}")))
    if i >= 1:  # keep the disk use small; outside the timings
        for name in (f"dcp-{i - 1}", f"dcp-async-{i - 1}"):
            shutil.rmtree(Path(base, name), ignore_errors=True)


def report(rows: dict[str, list[float]], mb: float, world: int, args: argparse.Namespace) -> None:
    print(
        f"sharded checkpoint, {world} ranks (CPU, gloo), {mb:.1f} MB of state, {args.repeats} repeats"
    )
    print(f"{'':32} {'min s':>8} {'median s':>9} {'max s':>8} {'MB/s (median)':>14}")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:32} {min(values):8.3f} {med:9.3f} {max(values):8.3f} {mb / med:14.1f}")
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"ratio save acceptrun/dcp (time): {med['save acceptrun'] / med['save dcp']:.2f}")
    if "save dcp async (stall)" in med:
        print(
            f"stall acceptrun/dcp async: {med['save acceptrun'] / med['save dcp async (stall)']:.2f}"
        )
        print(
            "ratio async stall acceptrun/dcp: "
            f"{med['save acceptrun async (stall)'] / med['save dcp async (stall)']:.2f}"
        )
        print(
            "ratio async persist acceptrun/dcp (time): "
            f"{med['save acceptrun async (persist)'] / med['save dcp async (persist)']:.2f}"
        )
    print(
        f"ratio restore acceptrun/dcp (time): {med['restore acceptrun'] / med['restore dcp']:.2f}"
    )
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="MB of state in all ranks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny: 2 MB, 1 repeat")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.repeats = 2.0, 1
    base = tempfile.mkdtemp(prefix="sharded-bench-", dir=args.dir)
    try:
        mp.spawn(rank_main, args=(2, args, base), nprocs=2, join=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
