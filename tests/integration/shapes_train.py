"""A training script in one of three shapes users bring, each with its own checkpoint (tests only).

``--report lines`` prints ``iter N: loss X``; ``--report tensorboard`` writes the loss with
torch's SummaryWriter and prints nothing per step; ``--report client`` calls only
``run.log(step, loss=...)`` of acceptrun's client, in a loop of its own (started through
tests/shapes_client.py). In every shape the
script saves ``out/ckpt.pt`` in place with ``torch.save`` every ``--every`` iterations,
resumes from it with ``--init_from=resume``, and writes ``out/model.pt`` at the end.

In attempt 1 the script saves once and waits until acceptrun has recorded the capture of
that save (it reads the run's events), then goes on slowly, and at the end
waits to be killed: an injected ``kill@step=N`` past the first save always finds a
captured checkpoint and some steps after it, however slow the machine (a ``kill@time``
came before the first save when the start-up took longer than its time).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--report", choices=["lines", "tensorboard", "client"], required=True)
p.add_argument("--init_from", default="scratch")
p.add_argument("--iters", type=int, default=200)
p.add_argument("--every", type=int, default=10)
p.add_argument("--slow", type=float, default=0.2)  # seconds per step in attempt 1, after the save
# seconds attempt 1 waits at the end for the injected kill, then fails (it never came)
p.add_argument("--hold", type=float, default=600.0)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
os.makedirs("out", exist_ok=True)
iter_num = 0
if args.init_from == "resume":
    ckpt = torch.load("out/ckpt.pt", weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    iter_num = int(ckpt["iter_num"])
    print(f"resuming from out/ckpt.pt at iter {iter_num}", flush=True)

writer = run = None
if args.report == "tensorboard":
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter("tb")
elif args.report == "client":
    # Started through tests/shapes_client.py, which imports acceptrun where a reader of the
    # command's script sees it; here the import is dynamic so the other shapes stay black boxes.
    run = importlib.import_module("acceptrun").init()

first_attempt = os.environ.get("ACCEPTRUN_ATTEMPT") == "1"
events = Path(os.environ.get("ACCEPTRUN_RUN_DIR", ".")) / "events.jsonl"


def captured() -> bool:
    """Whether acceptrun has committed a watched checkpoint of this run."""
    if not events.exists():
        return False
    for line in events.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("kind") == "checkpoint_commit" and ev.get("source") == "watched":
            return True
    return False


saved = False
while iter_num < args.iters:
    # Attempt 1 saves once: however late the kill comes, it resumes from that save.
    if iter_num > 0 and iter_num % args.every == 0 and not (first_attempt and saved):
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": iter_num}
        torch.save(state, "out/ckpt.pt")
        saved = True
        if first_attempt:
            while not captured():
                time.sleep(0.05)
    g = torch.Generator().manual_seed(1000 + iter_num)
    x = torch.randn(16, 8, generator=g)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True).sin())
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.report == "lines":
        print(f"iter {iter_num}: loss {loss.item():.6f}", flush=True)
    elif writer is not None:
        writer.add_scalar("train/loss", loss.item(), iter_num)
        writer.flush()
    elif run is not None:
        run.log(iter_num, loss=loss.item())
    iter_num += 1
    if first_attempt and saved:
        time.sleep(args.slow)

if first_attempt:
    # The injected kill ends attempt 1: it may come later than the last step when the
    # supervisor reads the steps from the output or TensorBoard files on a busy machine.
    time.sleep(args.hold)
    sys.exit(f"attempt 1 was not killed within --hold {args.hold:g} s of its last step")
torch.save(model.state_dict(), "out/model.pt")
