"""Data order that resumes exactly, in-process: the sampler and epoch loops resumed mid-epoch,
the batch sampler's form, loaders it cannot resume refused (workers and bit-exact
training: tests/integration/test_resumable_loader.py)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from acceptrun.checkpoint.loader import ResumableLoader, ResumableSampler
from loader_data import Indexed, make_loader, take


def test_epoch_loops_resume_mid_epoch() -> None:
    straight = make_loader()
    epochs = [[b["index"].tolist() for b in straight] for _ in range(3)]
    assert [len(e) for e in epochs] == [7, 7, 7] and straight.state_dict()["epoch"] == 3

    first = make_loader()
    for _ in first:
        break  # a for loop left after one batch keeps the position
    part = [b["index"].tolist() for b in itertools.islice(first, 2)]
    assert part == epochs[0][1:3]
    resumed = make_loader()
    resumed.load_state_dict(first.state_dict())
    assert resumed.state_dict() == {
        "epoch": 0,
        "batches_consumed": 3,
        "sampler": {"seed": 7, "shuffle": True, "num_samples": 20},
    }
    assert [b["index"].tolist() for b in resumed] == epochs[0][3:]
    assert [b["index"].tolist() for b in resumed] == epochs[1]


def test_state_after_the_last_batch_points_at_the_next_epoch() -> None:
    batches = make_loader()
    stream = batches.infinite()
    take(stream, len(batches))
    assert batches.state_dict()["epoch"] == 1 and batches.state_dict()["batches_consumed"] == 0
    take(stream, 1)  # state_dict() did not move the live position
    assert batches.epoch == 1 and batches.batches_consumed == 1


def test_a_given_generator_is_reseeded_per_epoch() -> None:
    data = Indexed(10)
    own = torch.Generator()
    loader = DataLoader(data, batch_size=5, sampler=ResumableSampler(data), generator=own)
    batches = ResumableLoader(loader)
    assert loader.generator is own
    take(iter(batches), 1)
    after_epoch0 = own.get_state()
    batches.load_state_dict({"epoch": 0, "batches_consumed": 0})
    take(iter(batches), 1)
    assert torch.equal(own.get_state(), after_epoch0)


def test_sampler_order_is_seeded_per_epoch_and_resumable() -> None:
    sampler = ResumableSampler(10, seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(10)) and len(sampler) == 10
    assert list(ResumableSampler(10, seed=3)) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(1, start=4)
    assert list(sampler) == sampler.order()[4:] and len(sampler) == 6
    assert list(ResumableSampler(range(5), shuffle=False)) == [0, 1, 2, 3, 4]

    other = ResumableSampler(10, seed=3)
    other.load_state_dict(sampler.state_dict())
    assert list(other) == list(sampler)
    with pytest.raises(ValueError, match="seed=3"):
        ResumableSampler(10, seed=4).load_state_dict(sampler.state_dict())


def test_batch_sampler_form_and_len() -> None:
    data = Indexed(20)
    sampler = ResumableSampler(data, seed=1)
    loader = DataLoader(data, batch_sampler=BatchSampler(sampler, batch_size=6, drop_last=False))
    batches = ResumableLoader(loader)
    assert len(batches) == len(loader) == 4
    batches.load_state_dict({"epoch": 0, "batches_consumed": 2})
    assert [b["index"].tolist() for b in batches] == [
        sampler.order()[12:18],
        sampler.order()[18:],
    ]
    assert len(make_loader(n=20, batch_size=3, drop_last=True)) == 6


def test_rejects_loaders_it_cannot_resume() -> None:
    with pytest.raises(ValueError, match="ResumableSampler"):
        ResumableLoader(DataLoader(Indexed(4), batch_size=2, shuffle=True))
    batches = make_loader()
    with pytest.raises(ValueError, match="not a position"):
        batches.load_state_dict({"epoch": 0, "batches_consumed": 99})
    with pytest.raises(ValueError, match="num_samples"):
        batches.load_state_dict(make_loader(n=21).state_dict())


# ---------------------------------------------------------------------------------------
# the whole thing: dropout model, 2 workers, state through stage/load_into
