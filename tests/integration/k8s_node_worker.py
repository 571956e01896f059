"""A rank of the Kubernetes pod tests: a tiny model, gathered checkpoints, one gate mid-run.

Started by torchrun on each "pod" (pod 0 under the supervisor, the others under the node
agent). Environment: ``TOTAL`` steps, ``EVERY`` (checkpoint after every EVERY-th step),
``OUT`` (files for the test) and ``HOLD_AT``: in attempt 1 only, after that step every
rank writes ``OUT/held-<rank>`` and then polls, together with the other ranks (one
all_reduce each 50 ms), whether any rank got SIGTERM. A SIGTERM to one node (its pod
preempted) thus stops every rank at the same step: checkpoint, ``stopped``, exit 143.
"""

from __future__ import annotations

import os
import signal
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

import acceptrun

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
run = acceptrun.init()
out = Path(os.environ["OUT"])
stop = {"asked": False}


def on_stop(signum: int, frame: types.FrameType | None) -> None:
    stop["asked"] = True  # acted on by every rank together, at the gate


signal.signal(signal.SIGTERM, on_stop)
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = run.restore(model=model, optimizer=opt)
total, every = int(os.environ["TOTAL"]), int(os.environ["EVERY"])
hold_at = int(os.environ.get("HOLD_AT", "-1")) if run.attempt == 1 else -1
for step in run.steps(start, total):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
    loss = model(x).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)  # the ranks meet across "nodes" every step
        p.grad /= world
    opt.step()
    opt.zero_grad()
    run.log(step, loss=loss.item())
    if (step + 1) % every == 0:
        run.checkpoint(step, block=True)
    if step == hold_at:
        (out / f"held-{rank}").write_text(str(step))
        while True:
            flag = torch.tensor([1 if stop["asked"] else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                run.checkpoint(step, block=True)
                run.exit_stopped(step, checkpoint=step)
            time.sleep(0.05)  # polling a signal flag; no timing assumption
if rank == 0:
    run.metric("final/weight_sum", float(model.weight.sum()))
dist.barrier()
dist.destroy_process_group()
