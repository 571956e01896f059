"""Data-parallel training (DDP) of a small regression model, one process per rank.

acceptrun starts it through torchrun when the spec asks for more than one process
(``resources.processes = 2`` in spec.toml), so the same script runs alone or as N ranks:

    acceptrun run spec.toml                 # 2 ranks on CPU (gloo), supervised
    DDP_STEPS=40 acceptrun run spec.toml    # a short run, for tests

Each rank trains on its own shard of the data and DDP averages the gradients: gloo on
CPU, NCCL when every rank has a GPU of its own. The model and the optimizer are the same
on every rank, so rank 0 saves them; each rank's data position and RNG states are its
own and saved per rank (``per_rank=``). The run is deterministic: the same settings give
a byte-identical out/model.safetensors, also after a kill and a resume.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, TensorDataset

import acceptrun


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=int(os.environ.get("DDP_STEPS", "300")))
    p.add_argument("--batch-size", type=int, default=32, help="samples per step on each rank")
    p.add_argument("--hidden", type=int, default=256, help="width of the two hidden layers")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="out", help="where model.safetensors goes")
    return p.parse_args()


def make_data(seed: int, n: int = 8192) -> TensorDataset:
    """A fixed regression task: y = sin(x . w) plus a little noise, 16 features."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = 0.3 * torch.randn(16, 1, generator=g)
    y = torch.sin(x @ w) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= world_env
    if gpu:
        torch.cuda.set_device(local_rank)
    # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; alone, a group of one.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl" if gpu else "gloo", rank=int(os.environ.get("RANK", "0")),
                            world_size=world_env)  # fmt: skip
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}") if gpu else torch.device("cpu")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one core per rank; sums split over threads round differently

    run = acceptrun.init()
    data = make_data(args.seed)
    # Rank r trains on samples r, r + world, r + 2 world, ...: its own shard, in its own
    # seeded order, which the checkpoint keeps per rank.
    shard = Subset(data, range(rank, len(data), world))
    sampler = acceptrun.ResumableSampler(shard, seed=args.seed + rank)
    loader = acceptrun.ResumableLoader(
        DataLoader(shard, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    )

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = nn.Sequential(
        nn.Linear(16, args.hidden),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 1),
    ).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    torch.manual_seed(args.seed + 1 + rank)  # dropout masks differ between ranks

    # Shared state (the same on every rank) by keyword; each rank's own in per_rank. The
    # RNG states are always saved per rank.
    start = run.restore(model=model, optimizer=optimizer, per_rank={"loader": loader})
    if start and rank == 0:
        print(f"resumed from the checkpoint of step {start - 1}")

    batches = loader.infinite()
    for step in run.steps(start, args.steps):
        with run.data_wait():
            x, y = next(batches)
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        # Rank 0 records the step: the loss of its shard, the samples of all ranks.
        run.log(step, loss=loss.item(), samples=x.shape[0] * world)
        run.maybe_checkpoint(step)  # every checkpoint.every_steps; every rank takes part

    if rank == 0:
        with torch.no_grad():
            model.eval()
            x, y = data.tensors
            mse = F.mse_loss(model(x.to(device)), y.to(device)).item()
        run.metric("eval/mse", mse)
        out = Path(args.out_dir) / "model.safetensors"
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.cpu() for k, v in model.state_dict().items()}, str(out))
        run.output("model", out)
        print(f"ddp: {world} ranks ({'nccl' if gpu else 'gloo'}), {args.steps} steps, "
              f"mse {mse:.4f}, weights {out}")  # fmt: skip
    dist.barrier()  # rank 0's output is registered before any rank leaves
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
