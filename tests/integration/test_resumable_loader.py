"""Data order that resumes exactly: sampler, consumer-side counting, bit-exact training."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from acceptrun.checkpoint.restore import load_into
from acceptrun.checkpoint.staging import stage, write_staged
from loader_data import Indexed, make_loader, take


@pytest.fixture(autouse=True)
def no_cuda_garbage_for_workers() -> None:
    """Collect garbage before tests that fork DataLoader workers.

    A forked worker that frees an inherited CUDA tensor (garbage left by a GPU test in
    this process) aborts with "CUDA error: initialization error"; collecting first
    leaves it nothing to free.
    """
    gc.collect()


class DirWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        with open(self.path / name, "xb") as f:
            yield f


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True], ids=["keep-last", "drop-last"])
def test_interrupted_run_serves_the_same_batches(workers: int, drop_last: bool) -> None:
    per_epoch = len(make_loader(drop_last=drop_last))
    total = int(per_epoch * 2.5)
    straight = take(make_loader(workers=workers, drop_last=drop_last).infinite(), total)
    assert len({tuple(b) for b in straight}) == total  # epochs differ in order

    for stop in (3, per_epoch, per_epoch + 2):  # mid-epoch, at a boundary, in epoch 2
        first = make_loader(workers=workers, drop_last=drop_last)
        head = take(first.infinite(), stop)
        state = first.state_dict()
        del first
        second = make_loader(workers=workers, drop_last=drop_last)  # a fresh DataLoader
        second.load_state_dict(state)
        assert head + take(second.infinite(), total - stop) == straight, stop


def test_consumed_counts_batches_handed_over_not_prefetched() -> None:
    batches = make_loader(n=64, batch_size=2, workers=2)
    stream = batches.infinite()
    take(stream, 2)
    # The workers have 2 * prefetch_factor batches in flight; only 2 were consumed.
    assert batches.state_dict()["batches_consumed"] == 2


def test_dropping_an_iterator_stops_its_workers_at_once() -> None:
    gc.disable()  # no cyclic collection to tidy up: refcounting alone must end them
    try:
        batches = make_loader(n=64, batch_size=2, workers=2)
        stream = batches.infinite()
        take(stream, 1)
        assert len(multiprocessing.active_children()) == 2
        del stream
        assert multiprocessing.active_children() == []
        take(iter(batches), 1)  # a for loop left early: its workers go with it
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()


@pytest.mark.parametrize("workers", [0, 2])
def test_iterating_never_draws_from_the_global_rng(workers: int) -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    batches = make_loader(workers=workers)
    stream = batches.infinite()
    take(stream, len(batches) + 2)  # crosses an epoch: a second iterator is created
    assert torch.equal(torch.get_rng_state(), before)

    plain = DataLoader(Indexed(20), batch_size=3, num_workers=workers)
    next(iter(plain))  # the control: a DataLoader without a generator does draw
    assert not torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------------------------------
# the whole thing: dropout model, 2 workers, state through stage/load_into


def build(init_seed: int, workers: int) -> dict[str, Any]:
    torch.manual_seed(init_seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    loader = make_loader(n=20, batch_size=4, workers=workers, seed=11)
    return {"model": model, "optimizer": opt, "scheduler": sched, "loader": loader}


def train(objs: dict[str, Any], stream: Iterator[Any], steps: int) -> None:
    for _ in range(steps):
        batch = next(stream)
        loss = (objs["model"](batch["x"]) - batch["y"]).square().mean()
        objs["optimizer"].zero_grad()
        loss.backward()
        objs["optimizer"].step()
        objs["scheduler"].step()


@pytest.mark.parametrize("k", [3, 5, 8])  # 5 batches per epoch: mid, boundary, epoch 2
def test_bit_exact_training_resume_with_workers(tmp_path: Path, k: int) -> None:
    total = 12
    torch.manual_seed(0)
    straight = build(init_seed=1, workers=2)
    train(straight, straight["loader"].infinite(), total)

    torch.manual_seed(0)
    first = build(init_seed=1, workers=2)
    train(first, first["loader"].infinite(), k)
    write_staged(stage({**first, "extra": {"step": k}}), DirWriter(tmp_path / "ckpt"))
    del first

    torch.manual_seed(99)
    resumed = build(init_seed=2, workers=2)
    out = load_into(tmp_path / "ckpt", {**resumed, "extra": None})
    train(resumed, resumed["loader"].infinite(), total - out["values"]["extra"]["step"])

    for a, b in zip(straight["model"].parameters(), resumed["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    assert straight["loader"].state_dict() == resumed["loader"].state_dict()
