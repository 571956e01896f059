"""A rank of an FSDP2 training script: a tiny model (CPU, gloo) with sharded checkpoints.

The script of the multi-node tests (started through srun and torchrun, one rank per
node), of the sharded-mirror tests and of the drills on sharded scripts (torchrun, two
ranks on one machine). It is written as a user would write one: the client API, a store
from ``run.checkpoint_store()`` (checkpoints, retention and the mirror), ``sharded.save``
and ``sharded.load``. Environment:

- ``TOTAL`` steps, ``EVERY``: a sharded checkpoint after every EVERY-th step;
- ``HOLD_AT``: in attempt 1 only, after that step (and its checkpoint, if any) every
  rank writes ``OUT/held-<rank>`` and waits for a stop (its SIGTERM handler wakes it
  through a pipe): a point mid-run where the test kills a node, signals the job or stops
  the run, without guessing how fast the machine is;
- ``OUT`` (default: the working directory): where every rank writes ``rank-<rank>.json``
  (its node) and rank 0, when the run completes, ``final.safetensors`` (every model and
  optimizer tensor, gathered), registered as the output ``final`` (copied into the record).

A stop (SIGTERM, forwarded by torchrun) sets a flag; at each step boundary the ranks
agree on it (all_reduce MAX), save a sharded checkpoint of the last finished step on
every rank and exit as stopped (143), as docs/multi-node.md describes. A resumed attempt
loads the newest checkpoint every rank committed and continues after its step.
"""

from __future__ import annotations

import json
import os
import select
import signal
import types
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import acceptrun
from acceptrun.checkpoint import sharded

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
run = acceptrun.init()
out = Path(os.environ.get("OUT", "."))
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{rank}.json").write_text(
    json.dumps(
        {"node": os.environ.get("SLURMD_NODENAME"), "attempt": run.attempt, "pid": os.getpid()}
    )
)

stop = {"asked": False}
wake_r, wake_w = os.pipe()  # the handler writes a byte: a rank held mid-run wakes on it


def on_stop(signum: int, frame: types.FrameType | None) -> None:
    stop["asked"] = True  # acted on at the end of the step, by every rank together
    os.write(wake_w, b"\0")


signal.signal(signal.SIGTERM, on_stop)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
mesh = init_device_mesh("cpu", (world,))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
store = run.checkpoint_store()


def state(step: int) -> dict[str, object]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "train": {"step": step}}


loading = state(-1)
info = sharded.load(store, loading)
if info is not None:
    set_state_dict(model, opt, model_state_dict=loading["model"], optim_state_dict=loading["optim"])
start = int(loading["train"]["step"]) + 1 if info is not None else 0  # type: ignore[index]

total, every = int(os.environ["TOTAL"]), int(os.environ["EVERY"])
hold_at = int(os.environ.get("HOLD_AT", "-1")) if run.attempt == 1 else -1
saved = start - 1 if info is not None else None
for step in run.steps(start, total):
    flag = torch.tensor([1 if stop["asked"] else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same boundary
    if flag.item():
        if step > 0 and saved != step - 1:  # the last finished step, unless already saved
            sharded.save(store, step - 1, state(step - 1))
            saved = step - 1
        dist.barrier()
        run.exit_stopped(step, checkpoint=saved)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 + step))
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    run.log(step, loss=loss.item())
    if (step + 1) % every == 0:
        sharded.save(store, step, state(step), metrics={"loss": loss.item()})
        saved = step
    if step == hold_at:
        (out / f"held-{rank}").write_text(str(step))
        while not stop["asked"]:
            # Woken by the handler's byte; the timeout lets the handler run when the
            # signal was taken by another thread (Python runs handlers in this one).
            select.select([wake_r], [], [], 1.0)

opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
msd, osd = get_state_dict(model, opt, options=opts)
if rank == 0:
    tensors = {f"model.{k}": v.clone() for k, v in msd.items()}
    for fqn, values in osd.get("state", {}).items():
        for name, value in values.items():
            tensors[f"optim.{fqn}.{name}"] = torch.as_tensor(value).clone()
    final = out / "final.safetensors"
    save_file(tensors, str(final))
    run.output("final", final, copy=True)
    run.metric("final/loss", loss.item())
dist.barrier()
dist.destroy_process_group()
