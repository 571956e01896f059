"""Data order that resumes exactly: a seeded sampler and a loader that counts consumption.

:class:`ResumableSampler` draws each epoch's permutation from its own generator seeded
with ``seed + epoch`` (never the global RNG) and can start mid-epoch.
:class:`ResumableLoader` wraps a ``DataLoader`` over such a sampler and counts the batches
handed to the training loop, in the main process: the sampler runs ahead by
``num_workers * prefetch_factor`` batches, so only the consumer knows what was consumed.
Its ``state_dict()`` goes into the checkpoint with the model::

    sampler = ResumableSampler(dataset, seed=0)
    batches = ResumableLoader(DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2))
    stream = batches.infinite()
    for step in range(start, total):
        batch = next(stream)
        ...
        staged = stage({"model": model, "optimizer": opt, "loader": batches})

One limit: randomness inside worker processes (random augmentation) restarts with the
workers, which are seeded per epoch, not per batch. For a bit-exact resume with workers
the dataset must derive its randomness from the sample index (for example
``torch.Generator().manual_seed(hash((seed, epoch, index)))``), or use none.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Generator, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler

from acceptrun.errors import AcceptrunValueError

__all__ = ["ResumableLoader", "ResumableSampler"]


class ResumableSampler(Sampler[int]):
    """Indices of one epoch in a seeded order, from ``start`` on.

    The permutation of epoch ``e`` comes from ``torch.Generator().manual_seed(seed + e)``,
    so it is the same in every process and after every restart, and iterating never
    draws from the global torch RNG.

    >>> sampler = ResumableSampler(dataset, seed=0); sampler.set_epoch(3)
    """

    def __init__(self, data_source_or_len: Sized | int, *, shuffle: bool = True, seed: int = 0):
        super().__init__()
        n = data_source_or_len if isinstance(data_source_or_len, int) else len(data_source_or_len)
        if n < 0:
            raise AcceptrunValueError(
                f"ResumableSampler: length {n} is negative; pass a dataset or a size"
            )
        self.num_samples = n
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.start = 0
        """Index into this epoch's order of the first sample to yield."""

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Yield epoch ``epoch``'s order from its ``start``-th sample on."""
        if epoch < 0 or not 0 <= start <= self.num_samples:
            raise AcceptrunValueError(
                f"ResumableSampler.set_epoch({epoch}, start={start}): need epoch >= 0 and "
                f"0 <= start <= {self.num_samples}"
            )
        self.epoch, self.start = epoch, start

    def order(self) -> list[int]:
        """The whole order of the current epoch."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        # The order is computed here, when the DataLoader's iterator is created, so a
        # later set_epoch() cannot change an epoch already being served.
        return iter(self.order()[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "start": self.start,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position; refuse a state from another seed, order or data size."""
        for key in ("seed", "shuffle", "num_samples"):
            if key in state and state[key] != getattr(self, key):
                raise AcceptrunValueError(
                    f"ResumableSampler: the checkpoint has {key}={state[key]!r}, this sampler "
                    f"{key}={getattr(self, key)!r}; resuming would serve a different order. "
                    f"Build the sampler with {key}={state[key]!r} (and the same dataset)"
                )
        self.set_epoch(int(state["epoch"]), int(state.get("start", 0)))


def _find_sampler(loader: DataLoader[Any]) -> tuple[ResumableSampler, int, bool]:
    """The loader's ResumableSampler, its batch size and drop_last."""
    if isinstance(loader.sampler, ResumableSampler):
        if loader.batch_size is None:  # automatic batching off: one sample per item
            return loader.sampler, 1, False
        return loader.sampler, loader.batch_size, loader.drop_last
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, BatchSampler) and isinstance(
        batch_sampler.sampler, ResumableSampler
    ):
        return batch_sampler.sampler, batch_sampler.batch_size, batch_sampler.drop_last
    raise AcceptrunValueError(
        "ResumableLoader needs a DataLoader over a ResumableSampler, e.g. "
        "DataLoader(dataset, batch_size=32, sampler=ResumableSampler(dataset, seed=0)); "
        f"this one has sampler={type(loader.sampler).__name__}, "
        f"batch_sampler={type(batch_sampler).__name__}"
    )


def _loader_seed(seed: int, epoch: int) -> int:
    # Distinct from the sampler's seed + epoch, so worker seeds and the order are unrelated.
    digest = hashlib.blake2b(f"acceptrun.loader:{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class ResumableLoader:
    """A DataLoader that resumes at the first batch the training loop has not consumed.

    ``state_dict()`` is ``{"epoch", "batches_consumed", "sampler"}``. Iterating yields
    the rest of the current epoch; running to its end advances the epoch. The
    DataLoader gets its own ``torch.Generator`` (or its own is reseeded) from
    ``(seed, epoch)``, so creating an iterator never draws from the global torch RNG:
    without it the DataLoader draws its workers' base seed from the global RNG, and a
    resumed run's dropout masks would differ from the uninterrupted run's.
    """

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self.sampler, self.batch_size, self.drop_last = _find_sampler(loader)
        if loader.generator is None:
            loader.generator = torch.Generator()
        self._generator: torch.Generator = loader.generator
        self.epoch = 0
        self.batches_consumed = 0
        """Batches of ``epoch`` handed to the training loop."""
        # A weak reference: a strong one would close a cycle (the generator's frame holds
        # self), and an iterator the loop dropped would keep its worker processes alive
        # until the cyclic GC ran, possibly inside a freshly forked worker.
        self._active: weakref.ref[Generator[Any, None, None]] | None = None

    def __len__(self) -> int:
        """Batches in a whole epoch (also while a resumed epoch is part done)."""
        n = self.sampler.num_samples
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch. A new iterator ends the previous one."""
        self._close_active()
        epoch = self._epoch()
        self._active = weakref.ref(epoch)
        return epoch

    def infinite(self) -> Iterator[Any]:
        """Batches forever, epoch after epoch (for loops counted in steps)."""
        if len(self) == 0:
            raise AcceptrunValueError(
                "ResumableLoader.infinite(): an epoch has no batch (empty data)"
            )
        while True:
            yield from self

    def _epoch(self) -> Generator[Any, None, None]:
        epoch, consumed = self._position()
        self.epoch, self.batches_consumed = epoch, consumed
        self.sampler.set_epoch(epoch, start=consumed * self.batch_size)
        self._generator.manual_seed(_loader_seed(self.sampler.seed, epoch))
        # Creating the iterator starts the workers (num_workers > 0: ~0.1 s per worker,
        # blocks the training loop) and draws their base seed from self._generator.
        for batch in iter(self.loader):
            self.batches_consumed += 1  # counted when handed over, not when prefetched
            yield batch
        # Reached only when the epoch ran out, not when this iterator was closed early.
        self.epoch, self.batches_consumed = epoch + 1, 0

    def _position(self) -> tuple[int, int]:
        # All batches of the epoch consumed (saved right after its last batch): the
        # position is the start of the next epoch.
        if self.batches_consumed >= len(self):
            return self.epoch + 1, 0
        return self.epoch, self.batches_consumed

    def _close_active(self) -> None:
        active = self._active() if self._active is not None else None
        if active is not None:
            # Ends the DataLoader iterator it holds, which shuts its workers down.
            active.close()
        self._active = None

    def state_dict(self) -> dict[str, Any]:
        epoch, consumed = self._position()
        sampler = self.sampler.state_dict()
        return {
            "epoch": epoch,
            "batches_consumed": consumed,
            # Checked on load: another seed or data size would serve another order.
            "sampler": {k: sampler[k] for k in ("seed", "shuffle", "num_samples")},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position; the next iteration starts at the first unconsumed batch."""
        epoch, consumed = int(state["epoch"]), int(state["batches_consumed"])
        if epoch < 0 or not 0 <= consumed <= len(self):
            raise AcceptrunValueError(
                f"ResumableLoader: epoch {epoch}, batches_consumed {consumed} is not a "
                f"position in an epoch of {len(self)} batches; was the dataset or batch "
                "size changed?"
            )
        if "sampler" in state:
            self.sampler.load_state_dict({**state["sampler"], "epoch": epoch})
        self._close_active()
        self.epoch, self.batches_consumed = epoch, consumed
