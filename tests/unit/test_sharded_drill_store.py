"""The hooks a restore drill's store gives ``sharded.load``, in one process (no torch.distributed).

``restore_source``: the load reads the run's checkpoints (verified, never quarantined);
``on_sharded_load``: told of each load (the drill's proof of the restore). Saves on the
drill's store commit into its own root, never the run's. The 2-rank version, through
``acceptrun ckpt drill``, is tests/integration/test_sharded_drill.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from acceptrun.checkpoint import CheckpointStore, sharded
from acceptrun.checkpoint.store import LATEST, QUARANTINE
from acceptrun.run.drills.restore import _silent_ranks
from acceptrun.spec.model import load_spec


def tree(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry under ``root``: size, inode and a file's bytes."""
    return {
        p.relative_to(root).as_posix(): (
            p.stat().st_size,
            p.stat().st_ino,
            p.read_bytes() if p.is_file() else None,
        )
        for p in sorted(root.rglob("*"))
    }


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def run_store(tmp_path: Path) -> CheckpointStore:
    """A run's store with sharded steps 1 and 2 (w = 1s, then 2s)."""
    store = CheckpointStore(tmp_path / "run-ckpt", keep_last=2)
    for step in (1, 2):
        sharded.save(store, step, {"w": torch.full((64,), float(step)), "train": {"step": step}})
    return store


def drill_store(tmp_path: Path, source: CheckpointStore, loads: list[Any]) -> Any:
    store: Any = CheckpointStore(tmp_path / "scratch", keep_last=2)
    store.restore_source = source
    store.on_sharded_load = lambda info, seconds, rank, world: loads.append(
        (info.step, seconds, rank, world)
    )
    return store


def test_a_drill_load_reads_the_run_s_checkpoint_and_reports_it(
    tmp_path: Path, run_store: CheckpointStore
) -> None:
    before = tree(run_store.root)
    loads: list[Any] = []
    scratch = drill_store(tmp_path, run_store, loads)
    state: dict[str, Any] = {"w": torch.zeros(64), "train": {"step": -1}}
    info = sharded.load(scratch, state)
    assert info is not None and info.step == 2 and info.path.parent == run_store.root
    assert torch.equal(state["w"], torch.full((64,), 2.0)) and state["train"] == {"step": 2}
    ((step, seconds, rank, world),) = loads
    assert (step, rank, world) == (2, 0, 1) and seconds >= 0
    # The drill's step saves: the commit lands in the scratch root, the run's is untouched.
    saved = sharded.save(scratch, 3, state)
    assert saved.path == scratch.root / "step-3"
    assert (scratch.root / LATEST).read_text() == "step-3\n"
    assert tree(run_store.root) == before


def test_a_drill_load_skips_a_bad_checkpoint_without_quarantining_it(
    tmp_path: Path, run_store: CheckpointStore
) -> None:
    flip_a_bit(run_store.root / "step-2" / "shard-0.bin")  # step 2 no longer verifies
    before = tree(run_store.root)
    loads: list[Any] = []
    state: dict[str, Any] = {"w": torch.zeros(64), "train": {"step": -1}}
    info = sharded.load(drill_store(tmp_path, run_store, loads), state)
    assert info is not None and info.step == 1 and [s for s, *_ in loads] == [1]
    assert torch.equal(state["w"], torch.ones(64))
    assert tree(run_store.root) == before and not (run_store.root / QUARANTINE).exists()


def test_a_plain_store_s_load_reports_nothing_and_quarantines(
    tmp_path: Path, run_store: CheckpointStore
) -> None:
    flip_a_bit(run_store.root / "step-2" / "shard-0.bin")
    info = sharded.load(run_store, {"w": torch.zeros(64), "train": {"step": -1}})
    assert info is not None and info.step == 1  # as before: the bad one set aside
    assert (run_store.root / QUARANTINE).is_dir()


@pytest.mark.parametrize(
    ("processes", "ranks", "silent"),
    [
        pytest.param(2, [0, 1], [], id="every-rank"),
        pytest.param(2, [0], [1], id="rank-1-silent"),
        pytest.param(4, [1, 3], [0, 2], id="two-of-four"),
        pytest.param(1, [], [], id="one-process"),
    ],
)
def test_silent_ranks_names_the_ranks_without_a_drill_event(
    tmp_path: Path, processes: int, ranks: list[int], silent: list[int]
) -> None:
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        f'name = "s"\ncommand = ["python", "train.py"]\n[resources]\nprocesses = {processes}\n'
    )
    reported = [{"kind": "drill", "ok": True, "rank": r} for r in ranks]
    assert _silent_ranks(load_spec(spec_path), reported) == silent


def test_a_drill_load_restores_the_step_the_drill_verified(
    tmp_path: Path, run_store: CheckpointStore
) -> None:
    loads: list[Any] = []
    scratch = drill_store(tmp_path, run_store, loads)
    scratch.restore_step = 1  # ACCEPTRUN_RESUME_FROM named step-1, though step 2 is newer
    state: dict[str, Any] = {"w": torch.zeros(64), "train": {"step": -1}}
    info = sharded.load(scratch, state)
    assert info is not None and info.step == 1 and [s for s, *_ in loads] == [1]
    assert torch.equal(state["w"], torch.ones(64)) and state["train"] == {"step": 1}
