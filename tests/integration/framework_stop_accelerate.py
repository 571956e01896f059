"""An Accelerate loop with ``track(accelerator)`` on 2 CPU ranks (gloo), for graceful stops.

Run by test_framework_stop_ddp.py under ``acceptrun run`` with ``resources.processes = 2``
(torchrun starts the ranks; Accelerate finds them in its environment). A small MLP with
dropout on a shuffled DataLoader (80 samples, 8 a batch: 5 batches an epoch on each
rank), AdamW, a step scheduler, ``save_state`` every 4 steps. Environment as for
framework_stop_plain.py: ``TOTAL``, ``HOLD_AT`` (held until the file ``gate`` exists),
``exit-<rank>-a<attempt>`` and ``weights.sha256``.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acceptrun.integrations.accelerate import track

total = int(os.environ.get("TOTAL", "12"))
torch.set_num_threads(1)
set_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(80, 8, generator=g), torch.randn(80, 1, generator=g))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)
accelerator = Accelerator(cpu=True)
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
rank = accelerator.process_index

tracker = track(accelerator)
hold = int(os.environ.get("HOLD_AT", "-1")) if tracker.run.attempt == 1 else -1
try:
    for step, (x, y) in tracker.steps(loader, total):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        tracker.log(step, loss=loss.item(), samples=len(x) * accelerator.num_processes)
        if (step + 1) % 4 == 0:
            accelerator.save_state(f"ckpt/step_{step}")
        if step == hold:
            Path(f"held-{rank}").write_text(str(step))
            deadline = time.monotonic() + 600  # seconds; the test opens the gate long before
            while not Path("gate").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
except SystemExit as end:
    Path(f"exit-{rank}-a{tracker.run.attempt}").write_text(str(end.code))
    raise
if accelerator.is_main_process:
    params = b"".join(
        p.detach().numpy().tobytes() for p in accelerator.unwrap_model(model).parameters()
    )
    Path("weights.sha256").write_text(hashlib.sha256(params).hexdigest())
