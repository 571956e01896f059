"""The memory tier's own logic on real files: where it lives, its saves, the copy a restart
takes, what it refuses (checkpoint/memtier.py; the killed run: tests/integration/
test_memory_tier.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from acceptrun.checkpoint.memtier import PREFIX, MemoryTier, memory_dir, remove_memory_dir
from acceptrun.checkpoint.restore import load_into
from acceptrun.checkpoint.staging import stage, write_staged
from acceptrun.checkpoint.state import STATE, TENSORS
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.errors import SpecError
from acceptrun.spec.load import parse_spec


def _trained(steps: int, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


Events = list[tuple[str, dict[str, Any]]]


def _saved(
    root: Path, steps: list[int], durable_step: int | None = None
) -> tuple[MemoryTier, Events, nn.Module]:
    """A tier that saved a model trained one more step before each of ``steps``."""
    events: Events = []
    tier = MemoryTier(root, on_event=lambda kind, fields: events.append((kind, fields)))
    model, opt = _trained(1)
    for step in steps:
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        tier.save(step, {"model": model, "optimizer": opt}, durable_step=durable_step)
    tier.close()
    return tier, events, model


def test_the_directory_is_made_in_shared_memory_this_users_only_and_removed(
    tmp_path: Path,
) -> None:
    shm, run_dir = tmp_path / "shm", tmp_path / "run"
    shm.mkdir()
    run_dir.mkdir()
    path, note = memory_dir(run_dir, "r1", shm=shm)
    assert (path, note) == (shm / f"{PREFIX}r1", None)
    assert path.stat().st_mode & 0o777 == 0o700
    assert memory_dir(run_dir, "r1", shm=shm) == (path, None)  # the next attempt's: the same
    (path / "step-3").mkdir()
    assert remove_memory_dir(run_dir, "r1", shm=shm) == [path]
    assert not path.exists() and remove_memory_dir(run_dir, "r1", shm=shm) == []


@pytest.mark.parametrize("shm_state", ["absent", "taken"])
def test_without_usable_shared_memory_the_record_serves_with_a_note(
    tmp_path: Path, shm_state: str
) -> None:
    shm, run_dir = tmp_path / "shm", tmp_path / "run"
    run_dir.mkdir()
    if shm_state == "taken":  # the run's name there is a file, not its directory
        shm.mkdir()
        (shm / f"{PREFIX}r1").write_text("someone else's")
    path, note = memory_dir(run_dir, "r1", shm=shm)
    assert path == run_dir / "memory" and path.is_dir()
    assert note is not None and str(path) in note and "--shm-size" in note
    why = "is not a writable directory" if shm_state == "absent" else "is not a directory"
    assert why in note, note
    assert remove_memory_dir(run_dir, "r1", shm=shm) == [path]
    if shm_state == "taken":
        assert (shm / f"{PREFIX}r1").read_text() == "someone else's"  # never removed


def test_saves_keep_the_newest_copy_which_restores_bitwise(tmp_path: Path) -> None:
    _, events, saved = _saved(tmp_path / "mem", [3, 4, 5], durable_step=None)
    assert sorted(p.name for p in (tmp_path / "mem").iterdir()) == ["LATEST", "step-5"]
    ((kind, figures),) = events
    assert kind == "memory_saves" and figures["saves"] == 3 and figures["last_step"] == 5
    assert figures["bytes"] > 0 and "error" not in figures
    found = MemoryTier(tmp_path / "mem").candidate(None, defer=TENSORS)
    assert found.info is not None and found.info.step == 5 and found.rejected == []
    assert found.info.meta["tier"] == "memory" and found.expect is not None
    model, opt = _trained(0, seed=1)
    load_into(found.info.path, {"model": model, "optimizer": opt}, expect=found.expect)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), saved.parameters(), strict=True)
    )


def test_a_copy_is_taken_at_or_after_the_resume_point_and_kept_when_older(tmp_path: Path) -> None:
    _saved(tmp_path / "mem", [12], durable_step=9)
    tier = MemoryTier(tmp_path / "mem")
    assert tier.candidate(9).info.step == 12  # type: ignore[union-attr]
    assert tier.candidate(12).info.step == 12  # type: ignore[union-attr]
    older = tier.candidate(19)  # the disk holds a newer step: it is read instead
    assert older.info is None and older.rejected == []
    assert (tmp_path / "mem" / "step-12").is_dir()  # a later save replaces it


@pytest.mark.parametrize("resume_step", [None, 4])
def test_a_copy_of_a_rolled_back_line_is_removed_not_restored(
    tmp_path: Path, resume_step: int | None
) -> None:
    """Built on durable step 9, which a rollback set aside: the resume point is older."""
    _saved(tmp_path / "mem", [12], durable_step=9)
    found = MemoryTier(tmp_path / "mem").candidate(resume_step)
    assert found.info is None
    (why,) = found.rejected
    assert "builds on durable step 9" in why and "rollback" in why, why
    assert not (tmp_path / "mem" / "step-12").exists()


@pytest.mark.parametrize("name", [STATE, TENSORS])
def test_a_damaged_copy_is_removed_with_the_reason(tmp_path: Path, name: str) -> None:
    _saved(tmp_path / "mem", [7])
    target = tmp_path / "mem" / "step-7" / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    found = MemoryTier(tmp_path / "mem").candidate(None)  # every file hashed
    assert found.info is None
    (why,) = found.rejected
    assert why.startswith("memory copy of step 7 failed verification") and name in why, why
    assert not (tmp_path / "mem" / "step-7").exists()


def test_a_durable_commit_is_copied_in_with_its_hashes(tmp_path: Path) -> None:
    disk = CheckpointStore(tmp_path / "disk")
    model, opt = _trained(2)
    writer = disk.begin(9)
    write_staged(stage({"model": model, "optimizer": opt}), writer)
    info = disk.commit(writer, metrics={"loss": 0.5}, meta={"run_id": "r1"})
    tier = MemoryTier(tmp_path / "mem")
    tier.adopt(info, durable_step=9)
    copy = tier.store.get(9)
    assert copy is not None and copy.files == info.files and copy.metrics == {"loss": 0.5}
    assert copy.meta["durable_step"] == 9 and copy.meta["adopted_from"] == str(info.path)
    assert tier.store.verify(9).ok and tier.figures.adopted == 1
    assert tier.candidate(9).info.step == 9  # type: ignore[union-attr]


def test_a_failed_save_turns_the_tier_off_and_says_so_once(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    events: list[tuple[str, dict[str, Any]]] = []
    tier = MemoryTier(tmp_path / "file" / "mem", on_event=lambda k, f: events.append((k, f)))
    model, opt = _trained(1)
    for step in (0, 1):
        tier.save(step, {"model": model, "optimizer": opt}, durable_step=None)
        tier.wait()
    tier.close()
    assert tier.off
    ((kind, fields),) = events
    assert kind == "memory_saves" and fields["saves"] == 0
    assert fields["error"].startswith("step 0: ") and os.strerror(20) in fields["error"]


def test_the_spec_refuses_the_tier_in_a_run_of_several_processes() -> None:
    base = 'name = "t"\ncommand = ["python", "t.py"]\n[checkpoint]\nmemory_every = 1\n'
    assert parse_spec(base).checkpoint.memory_every == 1
    assert parse_spec('name = "t"\ncommand = ["python", "t.py"]\n').checkpoint.memory_every is None
    with pytest.raises(SpecError) as err:
        parse_spec(base + "[resources]\nprocesses = 2\n")
    assert "checkpoint.memory_every" in str(err.value) and "one process" in str(err.value)
