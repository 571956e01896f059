"""Ranks for the sharded-checkpoint tests: a tiny FSDP2 model on CPU/gloo, saved and loaded.

``python sharded_worker.py MODE ROOT WORLD OUT RANK`` (one process per rank), MODE one of:

- ``save``: train 2 steps, save step 1 and step 2 (sharded.save); rank 0 writes the full
  (gathered) model and optimizer tensors of each step to OUT/ref-<step>.safetensors;
- ``load``: a fresh model, sharded.load with pickle.loads/load/Unpickler and torch.load patched
  to raise, then set_state_dict; rank 0 writes OUT/loaded.safetensors and OUT/loaded.json;
- ``kill``: save step 1, then during the save of step 2 rank 1 SIGKILLs itself after
  writing its first tensor; rank 0 writes its error to OUT/rank0-error.txt.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

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

from acceptrun.checkpoint import CheckpointStore, sharded

GROUP_TIMEOUT_S = 300  # seconds; see init_group


def rank_argv() -> tuple[str, str, int, str, int]:
    """``MODE ROOT WORLD OUT RANK`` from the command line (one thread per rank)."""
    torch.set_num_threads(1)
    return sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])


def init_group(mode: str, world: int, out: str, rank: int) -> None:
    """The gloo group of ``world`` ranks over a FileStore in OUT.

    The timeout covers the wait for the last rank to arrive: on a loaded machine one
    rank's torch import can take a minute longer than another's.
    """
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/pg-{mode}-{world}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=GROUP_TIMEOUT_S),
    )


def build(seed: int, world: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8)
    )  # 3,000 parameters
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(8, 16, generator=g)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def full_tensors(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the model and optimizer, gathered whole (all ranks take part)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_state_dict(model, opt, options=opts)
    out = {f"model.{k}": v.clone() for k, v in msd.items()}
    for fqn, state in osd.get("state", {}).items():  # empty but on rank 0 (cpu_offload)
        for name, value in state.items():
            out[f"optim.{fqn}.{name}"] = torch.as_tensor(value).clone()
    return out


def state(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "train": {"step": step, "rng": random.getstate()}}


class KillAfterFirstTensor(sharded.JsonSavePlanner):
    """Rank 1 dies (SIGKILL, no cleanup) between two writes of its shard file."""

    written = 0

    def resolve_data(self, write_item: Any) -> Any:
        if dist.get_rank() == 1 and self.written == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        self.written += 1
        return super().resolve_data(write_item)


def no_unpickling(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("something was unpickled on the sharded load path")


def worker(rank: int, mode: str, root: str, world: int, out: str) -> None:
    init_group(mode, world, out, rank)
    store = CheckpointStore(root, keep_last=3)
    random.seed(7)
    if mode in ("save", "kill"):
        model, opt = build(0, world)
        for step in (1, 2):
            train_step(model, opt, step)
            if mode == "kill" and step == 2:
                try:
                    sharded.save(
                        store, step, state(model, opt, step), planner=KillAfterFirstTensor()
                    )
                except Exception as exc:
                    if rank == 0:
                        Path(out, "rank0-error.txt").write_text(f"{type(exc).__name__}: {exc}")
                    os._exit(3)
            else:
                info = sharded.save(store, step, state(model, opt, step), metrics={"step": step})
                assert info.step == step
            full = full_tensors(model, opt)
            if rank == 0:
                save_file(full, str(Path(out, f"ref-{step}.safetensors")))
    else:  # load
        model, opt = build(1234, world)
        train_step(model, opt, 0)  # a different state, and the optimizer has its tensors
        sd = state(model, opt, 0)
        saved = (pickle.loads, pickle.load, pickle.Unpickler, torch.load)
        pickle.loads = pickle.load = pickle.Unpickler = torch.load = no_unpickling  # type: ignore
        try:
            info = sharded.load(store, sd)
        finally:
            pickle.loads, pickle.load, pickle.Unpickler, torch.load = saved  # type: ignore
        assert info is not None
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        full = full_tensors(model, opt)
        if rank == 0:
            save_file(full, str(Path(out, "loaded.safetensors")))
            doc = {"step": info.step, "train": sd["train"], "rng_ok": None}
            random.setstate((sd["train"]["rng"][0], tuple(sd["train"]["rng"][1]), None))
            doc["rng_ok"] = True
            Path(out, "loaded.json").write_text(json.dumps(doc))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, root, world, out, rank = rank_argv()
    worker(rank, mode, root, world, out)
