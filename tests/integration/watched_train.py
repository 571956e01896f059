"""A nanoGPT-shaped training script that knows nothing of acceptrun (tests only).

Prints ``iter N: loss X`` after each step, rewrites ``<out_dir>/ckpt.pt`` in place with
``torch.save`` every ``--every`` iterations (at the top of the iteration, like nanoGPT),
and resumes from it with ``--init_from=resume``. The batch of iteration N is drawn from a
generator seeded with N, so a resumed run is bitwise the uninterrupted one. At the end it
writes the SHA-256 of its weights to ``<out_dir>/weights.sha256``.

With ``--hf`` it saves Hugging Face style instead: ``<out_dir>/checkpoint-<N>/`` holding
``model.pt`` and ``trainer_state.json``, resumed with ``--resume_from_checkpoint DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--init_from", default="scratch")
p.add_argument("--resume_from_checkpoint", default=None)
p.add_argument("--out_dir", default="out")
p.add_argument("--iters", type=int, default=200)
p.add_argument("--every", type=int, default=25)
p.add_argument("--sleep", type=float, default=0.0)  # seconds per step: the shape of a real step
p.add_argument("--hf", action="store_true")
# seconds the save pauses halfway through writing ckpt.pt, holding it open: the shape of
# a checkpoint of hundreds of MB, whose write takes that long
p.add_argument("--save_pause", type=float, default=0.0)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
os.makedirs(args.out_dir, exist_ok=True)
ckpt_path = os.path.join(args.out_dir, "ckpt.pt")

iter_num = 0
resume_dir = args.resume_from_checkpoint
if args.init_from == "resume" or resume_dir:
    path = os.path.join(resume_dir, "model.pt") if resume_dir else ckpt_path
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    iter_num = int(ckpt["iter_num"])
    print(f"resuming from {path} at iter {iter_num}", flush=True)


def save(n: int) -> None:
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": n}
    if args.hf:
        d = os.path.join(args.out_dir, f"checkpoint-{n}")
        os.makedirs(d, exist_ok=True)
        torch.save(state, os.path.join(d, "model.pt"))
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            json.dump({"global_step": n}, f)
    elif args.save_pause:
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        with open(ckpt_path, "wb") as f:  # in place, slowly
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(args.save_pause)
            f.write(data[len(data) // 2 :])
    else:
        torch.save(state, ckpt_path)  # in place, as nanoGPT does


while iter_num < args.iters:
    if iter_num > 0 and iter_num % args.every == 0:
        save(iter_num)
    g = torch.Generator().manual_seed(1000 + iter_num)
    x = torch.randn(16, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"iter {iter_num}: loss {loss.item():.6f}", flush=True)
    iter_num += 1
    if args.sleep:
        time.sleep(args.sleep)

weights = b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values())
with open(os.path.join(args.out_dir, "weights.sha256"), "w") as f:
    f.write(hashlib.sha256(weights).hexdigest())
