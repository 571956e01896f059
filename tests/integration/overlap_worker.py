"""A rank that saves with the Checkpointer and changes its state at once (test_overlapped_save).

``python overlap_worker.py STAGING ROOT WORLD OUT RANK``: STAGING is "overlap" or "block";
WORLD 1 is one process, 2 two gloo ranks (a gathered save: rank 0 writes the replicated
model and optimizer, each rank its own ``loader``).

Before every save the worker writes a reference: the same objects staged synchronously
into fresh memory (``ref-<who>-step<N>.safetensors``, the keys the checkpoint uses). The
background copy of an overlapped save is held until the first step pre-hook of any
optimizer runs (registered before acceptrun's own), so the copy cannot run before the
step that would change its tensors: only acceptrun's hook can make that step wait.

- step 1: the save, then at once a forward in train mode (BatchNorm's running statistics
  change) and an optimizer step with the grads of the step saved (parameters and AdamW's
  moments change);
- step 2: the save, then a whole training step (forward, backward, optimizer step);
- step 3: the save, then a parameter changed in place outside any optimizer (``mul_``)
  before the copy is let go: with overlap the save must fail naming the tensor; with
  block it holds the state of the call.

Writes ``result-rank<r>.json``: the stage events, whether the copy was still held when
each optimizer step began, and the error of each save that failed.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from acceptrun.checkpoint import staging as state_module
from acceptrun.checkpoint.overlap import Overlap
from acceptrun.checkpoint.saver import Checkpointer
from acceptrun.checkpoint.staging import stage
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.workload.distributed import RankGroup, RankInfo

staging, root, world, out, rank = (
    sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
)  # fmt: skip
torch.set_num_threads(1)
if world > 1:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg-{staging}", rank=rank, world_size=world,
        timeout=timedelta(seconds=300),
    )  # fmt: skip

go = threading.Event()  # the held background copy may run
stepped = threading.Event()  # the optimizer step after the save is over
held_at_step: dict[int, bool] = {}  # the first optimizer step after each save: still held?
saved: list[int] = []  # the save the next optimizer step comes after
real_copy = state_module.Staged.copy_pending


def held_copy(self: state_module.Staged) -> float:
    # Let go by the step's first pre-hook, the copy still waits until acceptrun's hook
    # waits for it, or else until the step is over: without that wait the copy comes
    # after the step's changes, every time.
    if self.pending:
        if not go.wait(240):
            raise RuntimeError("the held copy was never let go")
        while not stepped.wait(0.001):  # both are set by the training thread: poll
            if any(o.wait_from is not None for o in list(Overlap._armed)):
                break
    return real_copy(self)


state_module.Staged.copy_pending = held_copy  # type: ignore[method-assign]


def let_go(*_args: Any) -> None:
    if saved:
        held_at_step[saved.pop()] = not go.is_set()
    go.set()


register_optimizer_step_pre_hook(let_go)  # before acceptrun's: it runs first

torch.manual_seed(0)  # the same replica on every rank
model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
data = torch.Generator().manual_seed(100 + rank)


def forward() -> torch.Tensor:
    return model(torch.randn(16, 32, generator=data)).square().mean()


def train() -> None:
    forward().backward()
    opt.step()
    opt.zero_grad()


events: list[dict[str, Any]] = []
saver = Checkpointer(
    CheckpointStore(root, keep_last=3),
    on_event=lambda kind, fields: events.append({"kind": kind, **fields}),
    ranks=RankGroup(RankInfo(rank=rank, world_size=world)) if world > 1 else None,
    overlap=staging == "overlap",
)
objects = {"model": model, "optimizer": opt}
opt.register_step_post_hook(lambda *_args: stepped.set())
errors: dict[int, str] = {}


def save(step: int) -> None:
    own = {"loader": {"position": step * 10 + rank, "order": torch.randperm(8, generator=data)}}
    if world == 1:
        save_file(
            stage({**objects, **own}, rng=False).tensors, out / f"ref-1-step{step}.safetensors"
        )
    else:
        if rank == 0:
            save_file(stage(objects, rng=False).tensors, out / f"ref-shared-step{step}.safetensors")
        save_file(stage(own, rng=False).tensors, out / f"ref-rank{rank}-step{step}.safetensors")
    go.clear()
    stepped.clear()
    saved[:] = [step]
    if world == 1:
        saver.save(step, {**objects, **own})
    else:
        saver.save(step, objects, per_rank=own)


def settle(step: int) -> None:
    try:
        saver.wait()
    except Exception as exc:
        errors[step] = f"{type(exc).__name__}: {exc} | cause: {exc.__cause__!r}"


forward().backward()
opt.step()  # the grads stay: the step right after the save reuses them
save(1)
forward()  # right after the call: BatchNorm's running statistics change in place
opt.step()  # ... and the parameters and AdamW's moments
opt.zero_grad()
settle(1)
train()
save(2)
train()  # the next step, whole
settle(2)
save(3)
with torch.no_grad():
    model[0].weight.mul_(2)  # outside any optimizer, before the copy is let go
stepped.set()  # no step comes: the copy runs as soon as it is let go
go.set()
settle(3)
saver.close()
result = {"held_at_step": held_at_step, "errors": errors, "events": events}
(out / f"result-rank{rank}.json").write_text(json.dumps(result))
if world > 1:
    dist.destroy_process_group()
