"""Checkpoint benchmark: async stall, persist throughput and restore time vs torch.save/load.

One run, one JSON line on stdout (details on stderr):

    .venv/bin/python bench/checkpoint.py [--mb 500] [--device cpu|cuda] [--dir DIR]

State: a stack of square Linear layers plus AdamW's two moments, sized to about --mb MB
(500 MB by default: ~42M parameters x 3 fp32 tensors). Figures:

- stall_ratio: the time acceptrun's save call blocks (``stall_s``; the first save is left
  out, it pays buffer allocation) divided by a synchronous ``torch.save`` of the same
  state (to the page cache, no fsync: the baseline most scripts use). Target <= 0.05.
  With ``[checkpoint] staging = "overlap"`` (the default) the call copies only what a
  forward may change; the parameters and optimizer state are copied in the background
  and the next optimizer step waits for that copy if it comes first. Two more figures
  say what the loop pays in all: ``stall_next_step_at_once_s``, the optimizer step
  called right after the save (nothing to overlap: call + the whole copy, ``copy_s``),
  and ``stall_overlapped_s``, a forward and backward of about twice the copy's time
  (``fwd_bwd_s``) between the call and the step. Both are the ``checkpoint_stage``
  event's ``stall_s``, what the run's telemetry and interval advice read.
- persist_ratio: bytes / time of the background persist (write + xxh3 hashing + fsync of
  every file + manifest + renames) divided by a raw sequential write + fsync of the same
  number of bytes on the same disk. Target >= 0.8.
- restore_ratio: verify + load + load_state_dict through acceptrun (the tensors hashed as
  they load, as a resume reads them: one pass), divided by
  ``torch.load(weights_only=True)`` + load_state_dict of the same state. Target <= 1.0.
- against PyTorch DCP on the same state in the same run (one process, a gloo group of
  one; ``dcp`` in the output; its saves interleaved with acceptrun's and the raw write,
  the three taking turns going first, and each DCP load right after acceptrun's
  restore, so every side meets the same page cache): ``stall_vs_dcp_async`` (acceptrun's
  save call / the time ``dcp.async_save`` blocks; ``stall_next_step_at_once_vs_dcp_async``
  and ``stall_overlapped_vs_dcp_async`` the loop's whole stall in the two cases above), ``persist_vs_dcp_async`` (acceptrun's persist / DCP's, until
  its future is done; DCP hashes and verifies nothing) and ``restore_vs_dcp`` (acceptrun's
  verify + load / ``dcp.load``). Targets (issue 32): at most 0.1, 0.8 and 0.8.

Each ratio is the median over ``--repeats`` rounds and comes with its spread
(``spread``: min/median/max of every timing and of the per-round ratios) and the
conditions it was measured in (``conditions``: load average before and after, CPUs, the
file system's free space). A figure that is not physically possible, such as a persist
(which writes, hashes and fsyncs the same bytes) faster than a raw write and fsync of them
by more than 10%, or a negative duration, is listed under ``suspect`` with the likely
cause, and a warning goes to stderr: rerun on a quiet machine with more repeats. A
timing whose max is over 3x its min across the rounds is listed under ``unstable``: its
ratio says little. For a stable figure: more ``--repeats``, a state larger than the page
cache can absorb (``--mb`` above the free memory's share the disk's write-back holds),
and, where permitted (root), ``sync; echo 3 > /proc/sys/vm/drop_caches`` before a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from acceptrun.checkpoint.restore import load_into
from acceptrun.checkpoint.saver import Checkpointer
from acceptrun.checkpoint.state import TENSORS
from acceptrun.checkpoint.store import CheckpointStore


def build(mb: float, device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    width = 2048
    per_layer = width * width + width  # parameters
    layers = max(1, round(mb * 1e6 / 4 / 3 / per_layer))  # params + 2 Adam moments, fp32
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, width, device=device)
    model(x).square().mean().backward()
    opt.step()  # materialise the moments
    return model, opt


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max, rounded: how far one figure moved over the repeats."""
    return {
        "min": round(min(values), 4),
        "median": round(statistics.median(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def conditions(root: Path) -> dict[str, object]:
    usage = os.statvfs(root)
    return {
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "free_disk_gb": round(usage.f_bavail * usage.f_frsize / 1e9, 1),
    }


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class AgainstDcp:
    """DCP's async_save (stall, persist) and load of the same state, a round at a time.

    One process in a gloo group of one, as a single-GPU job using DCP runs. Its rounds
    are interleaved with acceptrun's (a DCP save right after each acceptrun save, a DCP
    load right after each acceptrun restore), so both meet the same page cache and the
    same memory: in a VM the first touch of fresh pages can cost more than the disk
    write, and a side measured after the other had warmed them up looked twice as fast.
    The first round pays DCP's one-off costs (its executor, staging buffers) and is left
    out, as acceptrun's first round is. ``available`` is False without torch.distributed.
    """

    def __init__(self, root: Path, model: nn.Module, opt: torch.optim.Optimizer, device: str):
        import torch.distributed as dist

        self.root, self.model, self.opt, self.device = root, model, opt, device
        self.rows: dict[str, list[float]] = {
            "async_stall_s": [], "async_persist_s": [], "load_s": []
        }  # fmt: skip
        self.available = dist.is_available()
        self.last: int | None = None
        if self.available:
            dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=0, world_size=1)

    def save(self, i: int) -> None:
        if not self.available:
            return
        import shutil

        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        state = {"model": model_sd, "optimizer": optim_sd}
        sync(self.device)
        t0 = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=str(self.root / f"dcp-{i}"))
        stalled = time.perf_counter() - t0
        future.result()
        persisted = time.perf_counter() - t0
        if i >= 1:
            self.rows["async_stall_s"].append(stalled)
            self.rows["async_persist_s"].append(persisted)
        if i >= 2:  # two kept on disk, as acceptrun's retention keeps two
            shutil.rmtree(self.root / f"dcp-{i - 2}", ignore_errors=True)
        self.last = i

    def load(self) -> None:
        if not self.available or self.last is None:
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        t0 = time.perf_counter()
        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        target = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(target, checkpoint_id=str(self.root / f"dcp-{self.last}"))
        set_state_dict(
            self.model, self.opt, model_state_dict=target["model"],
            optim_state_dict=target["optimizer"],
        )  # fmt: skip
        sync(self.device)
        self.rows["load_s"].append(time.perf_counter() - t0)

    def close(self) -> dict[str, list[float]]:
        if not self.available:
            return {}
        import shutil

        import torch.distributed as dist

        dist.destroy_process_group()
        for path in self.root.glob("dcp-*"):
            shutil.rmtree(path, ignore_errors=True)
        (self.root / "pg").unlink(missing_ok=True)
        return self.rows


def overlap_rounds(
    saver: Checkpointer,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    events: list[tuple[str, dict]],
    copy_s: float,
    args: argparse.Namespace,
) -> tuple[list[float], list[float]]:
    """Saves with a forward and backward between the call and the optimizer step, the
    batch sized so that they take about twice the background copy: the loop's stall
    (the ``checkpoint_stage`` event's ``stall_s``) and each forward + backward time."""
    width = 2048
    x = torch.randn(8, width, device=args.device)
    sync(args.device)
    t0 = time.perf_counter()
    model(x).square().mean().backward()
    sync(args.device)
    per_row = (time.perf_counter() - t0) / 8
    rows = max(8, min(4096, int(2 * copy_s / max(per_row, 1e-6)) + 1))
    x = torch.randn(rows, width, device=args.device)
    stalls, fwd_bwd = [], []
    for i in range(args.repeats):
        step = 1000 + i
        saver.save(step, {"model": model, "optimizer": opt})
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        sync(args.device)
        fwd_bwd.append(time.perf_counter() - t0)
        opt.step()
        saver.wait()
        stalls += [f["stall_s"] for k, f in events if k == "checkpoint_stage" and f["step"] == step]
    return stalls, fwd_bwd


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mb", type=float, default=500.0, help="approximate state size in MB")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dir", default=None, help="directory on the disk to measure (default: a temp dir)"
    )
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="acceptrun-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    model, opt = build(args.mb, args.device)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v)
    )
    log(f"state: {nbytes / 1e6:.0f} MB on {args.device}, disk {root}")
    before = conditions(root)

    # Baseline 1: synchronous torch.save (what the loop would block on).
    ts_path = root / "torch_save.pt"
    save_times = []
    for _ in range(args.repeats):
        sync(args.device)
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ts_path)
        save_times.append(time.perf_counter() - t0)
    torch_save = statistics.median(save_times)

    # Baseline 2 and acceptrun's async save, interleaved so both meet the same memory
    # and disk state. Raw: a sequential write + fsync of the same number of bytes into a
    # new file, the two before it kept (as retention keeps two checkpoints): both sides
    # pay for fresh page-cache pages, which in a VM can cost more than the disk write.
    # Stall = the staging copy; persist = the commit event's duration (write, hashing,
    # fsyncs, manifest, renames).
    blob = torch.empty(nbytes, dtype=torch.uint8).numpy()
    blob[:] = 7
    events: list[tuple[str, dict]] = []
    store = CheckpointStore(root / "ckpt", keep_last=2, on_event=lambda k, f: events.append((k, f)))
    saver = Checkpointer(store, on_event=lambda k, f: events.append((k, f)))
    objects = {"model": model, "optimizer": opt}
    raw_times, stalls = [], []
    dcp_side = AgainstDcp(root, model, opt, args.device)

    def raw(i: int) -> None:
        path = root / f"raw-{i}.bin"
        t0 = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            view = memoryview(blob)
            for start in range(0, nbytes, 16 << 20):  # 16 MiB writes, as the store's
                f.write(view[start : start + (16 << 20)])
            os.fsync(f.fileno())
        raw_times.append(time.perf_counter() - t0)
        (root / f"raw-{i - 2}.bin").unlink(missing_ok=True)

    def ours(i: int) -> None:
        # The save call, then the next optimizer step at once: with staging = "overlap"
        # the step waits for the background copy (the worst case: nothing to overlap).
        sync(args.device)
        stalls.append(saver.save(i, objects))
        opt.step()
        saver.wait()

    # The three writers take turns going first: whichever goes first in a round meets the
    # page cache the round before left (fresh pages cost more in a VM), so the order
    # rotates and each side's median holds rounds of every position.
    sides = [raw, ours, dcp_side.save]
    for i in range(args.repeats + 1):
        for side in sides[i % 3 :] + sides[: i % 3]:
            side(i)
    for path in root.glob("raw-*.bin"):
        path.unlink()
    commits = [f["seconds"] for k, f in events if k == "checkpoint_commit"]
    staged = [f for k, f in events if k == "checkpoint_stage"]
    at_once = [f["stall_s"] for f in staged[1:]]  # call + the step's wait for the copy
    copies = [f.get("copy_s", 0.0) for f in staged[1:]]
    overlapped, fwd_bwd = overlap_rounds(saver, model, opt, events, statistics.median(copies), args)
    # The first round pays one-off costs (buffer allocation, pinned memory): skipped.
    raw_write = statistics.median(raw_times[1:])
    stall = statistics.median(stalls[1:])
    persist = statistics.median(commits[1:])

    # Restore: acceptrun (verify + load) vs torch.load(weights_only=True), both into objects.
    latest = store.latest()
    assert latest is not None
    ours, theirs = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        # As a resume does: the store checks every file but the tensors, which are hashed
        # as they load (one read of their bytes).
        assert store.verify(latest.step, defer=[TENSORS]).ok
        load_into(latest.path, objects, device=args.device, expect=latest.files[TENSORS]["hash"])
        sync(args.device)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sd = torch.load(ts_path, weights_only=True, map_location=args.device)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optimizer"])
        sync(args.device)
        theirs.append(time.perf_counter() - t0)
        dcp_side.load()
    restore, torch_load = statistics.median(ours), statistics.median(theirs)
    dcp_rows = dcp_side.close()
    # Per-round ratios (round 0 skipped, as above): their spread says how much one run of
    # this bench can be trusted.
    persist_ratios = [r / c for r, c in zip(raw_times[1:], commits[1:], strict=True)]
    suspect = []
    if statistics.median(persist_ratios) > 1.1:
        suspect.append(
            "persist_ratio > 1.1: the persist writes, hashes and fsyncs the same bytes as the "
            "raw baseline, so it cannot be faster; the baseline was slowed (page-cache "
            "allocation, other load on the disk or the CPUs). Rerun on a quiet machine with "
            "--repeats 7."
        )
    timings = save_times + raw_times + stalls + commits + ours + theirs
    if any(t < 0 for t in timings):
        suspect.append("a negative duration was measured: the clock or the events are wrong")
    for line in suspect:
        log(f"warning: {line}")
    series = {
        "torch_save_s": save_times, "stall_s": stalls[1:], "persist_s": commits[1:],
        "raw_write_fsync_s": raw_times[1:], "restore_s": ours, "torch_load_s": theirs,
        **{f"dcp_{k}": v for k, v in dcp_rows.items()},
    }  # fmt: skip
    unstable = sorted(
        name for name, values in series.items() if values and min(values) > 0
        and max(values) / min(values) > 3
    )  # fmt: skip
    if unstable:
        log(
            f"warning: unstable across rounds (max > 3x min): {', '.join(unstable)}; rerun "
            "with more --repeats, a larger --mb, on a quiet machine (see the docstring)"
        )
    dcp_figures: dict[str, object] = {}
    if dcp_rows:
        med = {k: statistics.median(v) for k, v in dcp_rows.items()}
        dcp_figures = {
            "async_stall_s": round(med["async_stall_s"], 4),
            "async_persist_s": round(med["async_persist_s"], 4),
            "load_s": round(med["load_s"], 4),
            "stall_vs_dcp_async": round(stall / med["async_stall_s"], 3),
            "stall_next_step_at_once_vs_dcp_async": round(
                statistics.median(at_once) / med["async_stall_s"], 3
            ),
            "stall_overlapped_vs_dcp_async": round(
                statistics.median(overlapped) / med["async_stall_s"], 3
            ),
            "persist_vs_dcp_async": round(persist / med["async_persist_s"], 3),
            "restore_vs_dcp": round(restore / med["load_s"], 3),
            "targets": {"stall_vs_dcp_async": "<= 0.1", "persist_vs_dcp_async": "<= 0.8",
                        "restore_vs_dcp": "<= 0.8"},
            "spread": {k: spread(v) for k, v in dcp_rows.items()},
            # the same ratios round by round (each pair met the same conditions)
            "ratio_spread": {
                name: spread([a / b for a, b in zip(ours_, theirs_, strict=False)])
                for name, ours_, theirs_ in (
                    ("stall_vs_dcp_async", stalls[1:], dcp_rows["async_stall_s"]),
                    ("stall_next_step_at_once_vs_dcp_async", at_once, dcp_rows["async_stall_s"]),
                    ("stall_overlapped_vs_dcp_async", overlapped, dcp_rows["async_stall_s"]),
                    ("persist_vs_dcp_async", commits[1:], dcp_rows["async_persist_s"]),
                    ("restore_vs_dcp", ours, dcp_rows["load_s"]),
                )
            },
        }  # fmt: skip

    result = {
        "bench": "checkpoint",
        "device": args.device,
        "state_mb": round(nbytes / 1e6, 1),
        "stall_s": round(stall, 4),
        "stall_next_step_at_once_s": round(statistics.median(at_once), 4),
        "copy_s": round(statistics.median(copies), 4),
        "stall_overlapped_s": round(statistics.median(overlapped), 4),
        "fwd_bwd_s": round(statistics.median(fwd_bwd), 4),
        "first_stall_s": round(stalls[0], 4),
        "torch_save_s": round(torch_save, 4),
        "stall_ratio": round(stall / torch_save, 4),
        "persist_s": round(persist, 4),
        "raw_write_fsync_s": round(raw_write, 4),
        "persist_ratio": round(raw_write / persist, 3),
        "restore_s": round(restore, 4),
        "torch_load_s": round(torch_load, 4),
        "restore_ratio": round(restore / torch_load, 3),
        "targets": {"stall_ratio": "<= 0.05", "persist_ratio": ">= 0.8", "restore_ratio": "<= 1.0"},
        "spread": {
            "torch_save_s": spread(save_times),
            "stall_s": spread(stalls[1:]),
            "stall_next_step_at_once_s": spread(at_once),
            "copy_s": spread(copies),
            "stall_overlapped_s": spread(overlapped),
            "fwd_bwd_s": spread(fwd_bwd),
            "persist_s": spread(commits[1:]),
            "raw_write_fsync_s": spread(raw_times[1:]),
            "persist_ratio": spread(persist_ratios),
            "stall_ratio": spread([a / b for a, b in zip(stalls[1:], save_times, strict=False)]),
            "restore_ratio": spread([a / b for a, b in zip(ours, theirs, strict=True)]),
            "restore_s": spread(ours),
            "torch_load_s": spread(theirs),
        },
        "dcp": dcp_figures or "not measured (torch.distributed unavailable)",
        "conditions": {"before": before, "after": conditions(root)},
        "suspect": suspect,
        "unstable": unstable,
    }
    print(json.dumps(result), flush=True)
    if not args.dir:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
