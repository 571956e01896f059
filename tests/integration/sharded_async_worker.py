"""Ranks for the asynchronous sharded-save tests: the FSDP2 model of sharded_worker.py.

``python sharded_async_worker.py MODE ROOT WORLD OUT RANK`` (one process per rank), MODE:

- ``save``: train step 1, async-save it and wait. Train step 2, gather its full tensors
  to OUT/ref-2.safetensors, async-save step 2 with each rank's background write held at
  its first item until the training thread has trained step 3 and added 1000 to every
  parameter (OUT/after.safetensors: the state then). Then step 3 is async-saved with
  rank 1's file-size limit at 1 KiB, so its shard write fails (EFBIG) in the background;
  each rank writes what ``wait()`` raised to OUT/step3-error-rank<r>.txt.
- ``kill``: step 1 saved; during the async save of step 2 rank 1's background write
  blocks after its first item; both ranks train step 3 and write OUT/rank<r>-ready; the
  test SIGKILLs rank 1. Rank 0 writes its error to OUT/rank0-error.txt and exits 3.
- ``overlap``: step 1 trained, its full tensors to OUT/ref-1.safetensors, async-saved
  with ``overlap=opt``; the background copy is held until an optimizer step begins (a
  step pre-hook registered before acceptrun's), and step 2 is trained at once, so only
  acceptrun's hook can keep that step from changing the tensors before they are copied.
  Then step 2 is async-saved and a parameter changed in place outside the optimizer
  before the copy is let go: that save must fail on every rank. OUT/overlap-rank<r>.json
  says whether the copy was still held when the step began, and step 2's error.
- ``exit`` (one process, no process group): an async save into ROOT and one into a
  directory that cannot exist (ROOT/blocker is a file), then exit without waiting.

Every rank appends its store's events to OUT/events-rank<r>.jsonl.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from sharded_worker import build, full_tensors, init_group, rank_argv, state, train_step

from acceptrun.checkpoint import CheckpointStore, sharded
from acceptrun.checkpoint.sharded import saving as sharded_save
from acceptrun.errors import RecordError

HOLD_S = 120  # seconds a held background write waits for the training thread at most


class HeldPlanner(sharded.JsonSavePlanner):
    """Holds the background write before item ``at`` until ``release`` is set.

    ``reached`` is set when the write gets there, so the training thread knows the save
    is in flight. ``forever``: never let go (the test kills the process).
    """

    def __init__(self, at: int, *, forever: bool = False) -> None:
        super().__init__()
        self.at, self.forever, self.resolved = at, forever, 0
        self.reached, self.release = threading.Event(), threading.Event()

    def resolve_data(self, write_item: Any) -> Any:
        if self.resolved == self.at:
            self.reached.set()
            if self.forever:
                threading.Event().wait()
            if not self.release.wait(HOLD_S):
                raise RuntimeError(f"the training thread did not release the write in {HOLD_S} s")
        self.resolved += 1
        return super().resolve_data(write_item)


def events_to(path: Path) -> Any:
    def on_event(kind: str, fields: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")

    return on_event


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def save_mode(rank: int, store: CheckpointStore, world: int, out: Path) -> None:
    model, opt = build(0, world)
    train_step(model, opt, 1)
    first = sharded.async_save(store, 1, state(model, opt, 1), metrics={"step": 1})
    assert first.wait().step == 1
    train_step(model, opt, 2)
    ref = full_tensors(model, opt)  # collective: before the save, like the save's view
    if rank == 0:
        save_file(ref, str(out / "ref-2.safetensors"))
    held = HeldPlanner(at=0)
    pending = sharded.async_save(store, 2, state(model, opt, 2), planner=held)
    assert held.reached.wait(HOLD_S), "the background write never started"
    assert not pending.done()
    train_step(model, opt, 3)  # training goes on, with its own collectives
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1000.0)  # in place, as an optimizer step does
    after = full_tensors(model, opt)
    held.release.set()
    info = pending.wait()
    assert info.step == 2 and pending.done() and sharded.wait(store) == info
    if rank == 0:
        save_file(after, str(out / "after.safetensors"))
        doc = {"stall_s": pending.stall_s, "nbytes": pending.nbytes, "persist_s": pending.persist_s}
        (out / "save-2.json").write_text(json.dumps(doc))
    # A failure in the background: rank 1 may write no file over 1 KiB.
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 1:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limits[1]))
    failing = sharded.async_save(store, 3, state(model, opt, 3))
    try:
        failing.wait()
        message = "no error"
    except RecordError as exc:
        message = error_text(exc)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    (out / f"step3-error-rank{rank}.txt").write_text(message)


def kill_mode(rank: int, store: CheckpointStore, world: int, out: Path) -> None:
    model, opt = build(0, world)
    train_step(model, opt, 1)
    sharded.async_save(store, 1, state(model, opt, 1)).wait()
    train_step(model, opt, 2)
    held = HeldPlanner(at=1, forever=rank == 1)
    held.release.set()  # rank 0 writes through; rank 1 stops after its first item
    pending = sharded.async_save(store, 2, state(model, opt, 2), planner=held)
    train_step(model, opt, 3)
    assert held.reached.wait(HOLD_S), "the background write never got to its second item"
    (out / f"rank{rank}-ready").write_text("in flight\n")
    try:
        pending.wait()
    except RecordError as exc:
        if rank == 0:
            (out / "rank0-error.txt").write_text(error_text(exc))
        os._exit(3)
    os._exit(4)  # the save cannot have committed with rank 1 gone


def overlap_mode(rank: int, store: CheckpointStore, world: int, out: Path) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    model, opt = build(0, world)
    train_step(model, opt, 1)
    ref = full_tensors(model, opt)  # collective: the state the save must hold
    if rank == 0:
        save_file(ref, str(out / "ref-1.safetensors"))
    go, stepped, held_at_step = threading.Event(), threading.Event(), []
    real_run = sharded_save._Deferred.run

    def held_run(self: Any, handle: Any) -> None:
        # Let go by the step's first pre-hook, the copy still waits until acceptrun's hook
        # waits for it, or else until the step is over: without that wait the copy comes
        # after the step's changes, every time.
        if not go.wait(HOLD_S):
            raise RuntimeError(f"the held copy was not let go in {HOLD_S} s")
        while self.overlap.wait_from is None and not stepped.wait(0.001):
            pass  # both are set by the training thread: poll the two
        real_run(self, handle)

    sharded_save._Deferred.run = held_run  # type: ignore[method-assign]

    def let_go(*_args: Any) -> None:
        held_at_step.append(not go.is_set())
        go.set()

    register_optimizer_step_pre_hook(let_go)  # before acceptrun's: it runs first
    opt.register_step_post_hook(lambda *_args: stepped.set())
    pending = sharded.async_save(store, 1, state(model, opt, 1), overlap=opt)
    train_step(model, opt, 2)  # forward, backward and the step, right after the call
    assert pending.wait().step == 1
    go.clear()
    stepped.set()  # no step comes: the copy runs as soon as it is let go
    pending = sharded.async_save(store, 2, state(model, opt, 2), overlap=opt)
    with torch.no_grad():
        next(iter(model.parameters())).to_local().mul_(2.0)  # outside any optimizer
    go.set()
    try:
        pending.wait()
        message = "no error"
    except RecordError as exc:
        message = error_text(exc)
    doc = {"held_at_step": held_at_step, "step2_error": message}
    (out / f"overlap-rank{rank}.json").write_text(json.dumps(doc))


def exit_mode(root: str, out: Path) -> None:
    good = CheckpointStore(root, on_event=events_to(out / "events-rank0.jsonl"))
    sharded.async_save(good, 7, {"w": torch.arange(1000, dtype=torch.float32), "step": 7})
    blocker = Path(root, "blocker")
    blocker.write_text("a file where the second store's directory would be\n")
    bad = CheckpointStore(blocker / "ckpt")
    sharded.async_save(bad, 7, {"w": torch.ones(4)})
    # No wait: the exit waits for both, commits the first and reports the second.


def worker(rank: int, mode: str, root: str, world: int, out: str) -> None:
    out_dir = Path(out)
    if mode == "exit":
        exit_mode(root, out_dir)
        return
    init_group(mode, world, out, rank)
    store = CheckpointStore(
        root, keep_last=3, on_event=events_to(out_dir / f"events-rank{rank}.jsonl")
    )
    if mode == "save":
        save_mode(rank, store, world, out_dir)
    elif mode == "overlap":
        overlap_mode(rank, store, world, out_dir)
    else:
        kill_mode(rank, store, world, out_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, root, world, out, rank = rank_argv()
    worker(rank, mode, root, world, out)
