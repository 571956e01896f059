"""A map-style data set and a resumable loader over it, for the data-order tests of both
tiers (torch is imported here; tests/builders.py imports without it)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from acceptrun.checkpoint.loader import ResumableLoader, ResumableSampler

__all__ = ["Indexed", "make_loader", "take"]


class Indexed(Dataset[dict[str, torch.Tensor]]):
    """Sample ``i`` is a function of ``i`` alone (no randomness in workers)."""

    def __init__(self, n: int, dim: int = 4) -> None:
        self.n, self.dim = n, dim

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(self.dim, generator=g)
        return {"index": torch.tensor(index), "x": x, "y": x.sum(0, keepdim=True)}


def make_loader(
    n: int = 20, batch_size: int = 3, *, workers: int = 0, seed: int = 7, drop_last: bool = False
) -> ResumableLoader:
    data = Indexed(n)
    loader = DataLoader(
        data,
        batch_size=batch_size,
        sampler=ResumableSampler(data, seed=seed),
        num_workers=workers,
        drop_last=drop_last,
        **({"prefetch_factor": 2} if workers else {}),
    )
    return ResumableLoader(loader)


def take(batches: Iterator[Any], n: int) -> list[list[int]]:
    return [b["index"].tolist() for b in itertools.islice(batches, n)]
