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
durable), and restore: ``sharded.load`` (each rank hashes its shard as it maps it, all
agree, then the tensors are copied from the map: one read) vs ``dcp.load`` (which
verifies nothing). A raw write + fsync of each rank's bytes, all ranks at once, is the
floor no save can go below: a save at that floor (DCP's synchronous save is near it
on a fast disk) leaves no room for another to be 0.8x of it. The saves take turns going first and the restores alternate, so no
side always meets the write-back the others left. Prints min/median/max over
``--repeats``, every ratio against DCP with the spread of its per-repeat values and
its target (issue 32), a warning for a timing that moved more than 3x, and the load
average.

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
    # Two kept, as the default retention keeps (DCP's are deleted a repeat later).
    store = CheckpointStore(Path(base, "acceptrun"), keep_last=2)
    async_store = CheckpointStore(Path(base, "acceptrun-async"), keep_last=2)
    overlap_events: list[tuple[str, dict[str, Any]]] = []
    overlap_store = CheckpointStore(
        Path(base, "acceptrun-overlap"), keep_last=2,
        on_event=lambda kind, fields: overlap_events.append((kind, fields)),
    )  # fmt: skip
    # An optimizer over the state's tensors, for async_save(overlap=): its step() is what
    # waits for the background copy (no grads: the step changes nothing, the hook runs).
    opt = torch.optim.SGD(list(sd["model"].values()), lr=0.1)
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    # The floor no save can beat: this rank's bytes written to a new file and fsynced,
    # every rank at once (as a sharded save writes), two files kept (as retention keeps).
    blob = torch.full((int(mb * 2**20) // world,), 7, dtype=torch.uint8).numpy()

    def raw(i: int) -> None:
        path = Path(base, f"raw-{rank}-{i}.bin")

        def write() -> None:
            with open(path, "wb", buffering=0) as f:
                view = memoryview(blob)
                for start in range(0, len(view), 16 << 20):
                    f.write(view[start : start + (16 << 20)])
                os.fsync(f.fileno())

        add("raw write + fsync", timed(write))
        Path(base, f"raw-{rank}-{i - 2}.bin").unlink(missing_ok=True)

    for i in range(args.repeats):
        raw(i)
        one_repeat(i, base, (store, async_store), sd, target, add, rank)
        overlapped(i, overlap_store, overlap_events, sd, opt, add)
    if rank == 0:
        report(rows, mb, world, args)
    dist.barrier()
    dist.destroy_process_group()


def one_repeat(
    i: int, base: str, stores: tuple[CheckpointStore, CheckpointStore], sd: dict[str, Any],
    target: dict[str, Any], add: Any, rank: int,
) -> None:  # fmt: skip
    """Each kind of save and restore once, as checkpoint ``i``.

    The four saves take turns going first (rotated by ``i``): each one leaves dirty pages
    that the kernel writes back while the next one runs, so a save always measured after
    the others pays for their write-back (measured here: the last of four was 2 to 3x
    slower than the same save run first). The two restores alternate the same way.
    """
    store, async_store = stores

    def run_sync() -> None:
        add("save acceptrun", timed(lambda: sharded.save(store, i, sd)))

    def run_dcp() -> None:
        add("save dcp", timed(lambda: dcp.save(sd, checkpoint_id=f"{base}/dcp-{i}")))

    def run_dcp_async() -> None:
        stall: list[float] = []

        def run_async() -> None:
            t0 = time.perf_counter()
            fut = dcp.async_save(sd, checkpoint_id=f"{base}/dcp-async-{i}")
            stall.append(time.perf_counter() - t0)
            fut.result()

        try:
            add("save dcp async (persist)", timed(run_async))
            add("save dcp async (stall)", stall[0])
        except Exception as exc:  # async_save on CPU/gloo: report, compare the rest
            if rank == 0 and i == 0:
                print(f"dcp.async_save failed: {type(exc).__name__}: {exc}")

    def run_acceptrun_async() -> None:
        stalled: list[float] = []

        def run() -> None:
            t0 = time.perf_counter()
            pending = sharded.async_save(async_store, i, sd)
            stalled.append(time.perf_counter() - t0)
            pending.wait()  # the commit: the persist; its pruning is not timed

        add("save acceptrun async (persist)", timed(run))
        add("save acceptrun async (stall)", stalled[0])
        sharded.wait(async_store)  # the pruning, before the next save is timed

    saves = [run_sync, run_dcp, run_dcp_async, run_acceptrun_async]
    for save in saves[i % 4 :] + saves[: i % 4]:
        save()
    restores = [
        lambda: add("restore acceptrun", timed(lambda: sharded.load(store, target, step=i))),
        lambda: add(
            "restore dcp", timed(lambda: dcp.load(target, checkpoint_id=f"{base}/dcp-{i}"))
        ),
    ]
    for restore in restores if i % 2 == 0 else restores[::-1]:
        restore()
    if i >= 1:  # keep the disk use small; outside the timings
        for name in (f"dcp-{i - 1}", f"dcp-async-{i - 1}"):
            shutil.rmtree(Path(base, name), ignore_errors=True)


def busy(seconds: float) -> None:
    """CPU work for ``seconds``: a forward and backward's worth, beside the copy."""
    a = torch.randn(256, 256)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = torch.tanh(a @ a)


def overlapped(
    i: int, store: CheckpointStore, events: list[tuple[str, dict[str, Any]]],
    sd: dict[str, Any], opt: torch.optim.Optimizer, add: Any,
) -> None:  # fmt: skip
    """``async_save(overlap=opt)``: the loop's whole stall (the call, plus the wait of the
    optimizer step for the background copy) with the step called at once (nothing to
    overlap) and after about twice the copy's time of compute (a forward and backward)."""
    copies = [f["copy_s"] for k, f in events if k == "checkpoint_stage" and "copy_s" in f]
    compute = 2 * statistics.median(copies) if copies else 0.05
    for label, work in (("at once", 0.0), ("overlapped", compute)):
        stall: list[float] = []

        def run(work: float = work, stall: list[float] = stall) -> None:
            t0 = time.perf_counter()
            pending = sharded.async_save(store, 2 * i + (work > 0), sd, overlap=opt)
            call = time.perf_counter() - t0
            busy(work)
            t1 = time.perf_counter()
            opt.step()  # waits for the copy if it is not done
            stall.append(call + time.perf_counter() - t1)
            pending.wait()
            sharded.wait(store)  # and its pruning: the next save starts on a settled store

        timed(run)
        add(f"acceptrun overlap stall, step {label}", stall[0])
    copies = [f["copy_s"] for k, f in events if k == "checkpoint_stage" and "copy_s" in f]
    add("acceptrun overlap copy (background)", copies[-1])


RATIOS = [  # (label, acceptrun's row, DCP's row, target)
    ("save acceptrun / raw write + fsync (time)", "save acceptrun", "raw write + fsync", None),
    ("save dcp / raw write + fsync (time)", "save dcp", "raw write + fsync", None),
    ("save acceptrun / dcp.save (time)", "save acceptrun", "save dcp", None),
    ("async stall acceptrun / dcp.async_save", "save acceptrun async (stall)",
     "save dcp async (stall)", "<= 0.1"),
    ("overlap stall (step at once) / dcp.async_save", "acceptrun overlap stall, step at once",
     "save dcp async (stall)", None),
    ("overlap stall (after compute) / dcp.async_save",
     "acceptrun overlap stall, step overlapped", "save dcp async (stall)", "<= 0.1"),
    ("async persist acceptrun / dcp.async_save (time)", "save acceptrun async (persist)",
     "save dcp async (persist)", "<= 0.8"),
    ("restore acceptrun / dcp.load (time)", "restore acceptrun", "restore dcp", "<= 0.8"),
]  # fmt: skip


def report(rows: dict[str, list[float]], mb: float, world: int, args: argparse.Namespace) -> None:
    print(
        f"sharded checkpoint, {world} ranks (CPU, gloo), {mb:.1f} MB of state, {args.repeats} repeats"
    )
    print(f"{'':32} {'min s':>8} {'median s':>9} {'max s':>8} {'MB/s (median)':>14}")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:32} {min(values):8.3f} {med:9.3f} {max(values):8.3f} {mb / med:14.1f}")
    if args.verbose:  # every repeat's figure (repeat i ran the saves rotated by i)
        for name, values in rows.items():
            print(f"  {name}: {' '.join(f'{v:.3f}' for v in values)}")
    # Each ratio: of the medians, and the spread of the per-repeat ratios (the same round's
    # two figures, met in the same conditions): a wide spread says the figure is weak.
    print(f"{'ratio':48} {'of medians':>10} {'per-repeat min / median / max':>30}  target")
    unstable = []
    for label, ours, theirs, target in RATIOS:
        if ours not in rows or theirs not in rows:
            continue
        per = [a / b for a, b in zip(rows[ours], rows[theirs], strict=True)]
        of_medians = statistics.median(rows[ours]) / statistics.median(rows[theirs])
        spread = f"{min(per):.2f} / {statistics.median(per):.2f} / {max(per):.2f}"
        print(f"{label:48} {of_medians:10.2f} {spread:>30}  {target or ''}")
    for name, values in rows.items():
        if min(values) > 0 and max(values) / min(values) > 3:
            unstable.append(name)
    if unstable:
        print(
            f"warning: unstable across repeats (max > 3x min): {', '.join(unstable)}; rerun "
            "with more --repeats, a larger --mb (above what the page cache absorbs), on a "
            "quiet machine, and where permitted `sync; echo 3 > /proc/sys/vm/drop_caches` first"
        )
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="MB of state in all ranks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny: 2 MB, 1 repeat")
    parser.add_argument("--verbose", action="store_true", help="print every repeat's figures")
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
