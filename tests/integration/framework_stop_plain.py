"""A plain loop of 2 DDP ranks (gloo, CPU) that stops with run.handle_stops() + run.should_stop().

Run by test_framework_stop_ddp.py under ``acceptrun run`` with ``resources.processes = 2``.
Step s trains on a batch drawn from a generator seeded by (s, rank), so a resumed run
sees the batches the uninterrupted one saw. Environment:

- ``TOTAL``: steps (default 12);
- ``HOLD_AT``: in attempt 1, after that step every rank writes ``held-<rank>`` and waits
  for the file ``gate`` (the test writes it once the stop reached rank 0): the stop is
  decided at that step's boundary, whatever the machine's speed;
- ``MISCOUNT_RANK``: that rank passes step + 1 to ``should_stop`` (a broken contract: the
  ranks must fail together, not wait for each other).

Each rank writes ``exit-<rank>-a<attempt>`` with the status it exits with (SystemExit),
and rank 0 ``weights.sha256`` at the end.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import acceptrun

total = int(os.environ.get("TOTAL", "12"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

run = acceptrun.init()
run.handle_stops()  # SIGTERM outside run.steps(): a stop request, not death
start = run.restore(model=model.module, optimizer=opt)
hold = int(os.environ.get("HOLD_AT", "-1")) if run.attempt == 1 else -1
miscount = 1 if os.environ.get("MISCOUNT_RANK") == str(rank) else 0
try:
    for step in range(start, total):
        g = torch.Generator().manual_seed(step * world + rank)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(step, loss=loss.item(), samples=8 * world)
        if step == hold:
            Path(f"held-{rank}").write_text(str(step))
            deadline = time.monotonic() + 600  # seconds; the test opens the gate long before
            while not Path("gate").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if run.should_stop(step + miscount):  # once a step, every rank: True on all at once
            run.checkpoint(step, block=True)
            run.exit_stopped(step, checkpoint=step)
        run.maybe_checkpoint(step)
except SystemExit as end:
    Path(f"exit-{rank}-a{run.attempt}").write_text(str(end.code))
    raise
if rank == 0:
    params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    Path("weights.sha256").write_text(hashlib.sha256(params).hexdigest())
run.finish()
