"""Sharded checkpoints: an FSDP2 model on CPU/gloo saved by 2 ranks, loaded by 1 and 4.

The ranks are real processes (tests/integration/sharded_worker.py, one per rank, gloo
over a FileStore). FSDP2's ``fully_shard`` runs on CPU with gloo in torch 2.13, so the
state is real DTensor shards, not a simulation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from rank_procs import finish_ranks, start_ranks
from safetensors.numpy import load_file

from acceptrun.checkpoint import CheckpointStore, sharded
from acceptrun.checkpoint.store import LATEST, MANIFEST
from acceptrun.errors import UserError

WORKER = Path(__file__).with_name("sharded_worker.py")


def run_ranks(mode: str, root: Path, world: int, out: Path) -> list[int]:
    """Run ``world`` rank processes of the worker to their end; their exit codes."""
    what = f"{mode} on {world} ranks"
    codes, log = finish_ranks(start_ranks(WORKER, mode, root, world, out), what)
    if mode != "kill" and any(codes):
        pytest.fail(f"{what} exited {codes}:\n" + log[-6000:])
    return codes


def same_bits(a: Path, b: Path) -> None:
    left, right = load_file(str(a)), load_file(str(b))
    assert sorted(left) == sorted(right)
    for key in left:
        assert left[key].dtype == right[key].dtype, key
        assert left[key].shape == right[key].shape, key
        assert left[key].tobytes() == right[key].tobytes(), f"{key} differs"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Steps 1 and 2 of a 2-rank FSDP2 run, with the gathered full tensors of each."""
    base = tmp_path_factory.mktemp("sharded")
    run_ranks("save", base / "ckpt", 2, base / "out")
    return base / "ckpt", base / "out"


@pytest.mark.slow
def test_two_rank_save_commits_every_shard_with_json_metadata(saved: tuple[Path, Path]) -> None:
    root, out = saved
    store = CheckpointStore(root)
    assert (root / LATEST).read_text() == "step-2\n"
    for step in (1, 2):
        info = store.get(step)
        assert info is not None
        assert sorted(info.files) == [sharded.METADATA, "shard-0.bin", "shard-1.bin"]
        assert info.meta["format"] == sharded.FORMAT and info.meta["world_size"] == 2
        assert store.verify(step).ok
        doc = json.loads((info.path / sharded.METADATA).read_text())
        assert doc["kind"] == sharded.FORMAT
        weight = doc["entries"]["model.0.weight"]
        assert weight["size"] == [64, 16] and len(weight["chunks"]) == 2  # one per rank
        assert doc["entries"]["train.step"] == {"type": "bytes"}
    assert not [p for p in root.iterdir() if p.name.startswith(".staging")]
    assert (out / "ref-2.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("world", [pytest.param(1, id="1-rank"), pytest.param(4, id="4-ranks")])
def test_load_on_other_rank_counts_is_bitwise_and_never_unpickles(
    saved: tuple[Path, Path], tmp_path: Path, world: int
) -> None:
    # The worker replaces pickle.loads, pickle.load, pickle.Unpickler and torch.load with ones that
    # raise during sharded.load: a load that unpickled anything would fail the ranks.
    root, out = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(root, copy)
    run_ranks("load", copy, world, tmp_path / "out")
    same_bits(out / "ref-2.safetensors", tmp_path / "out" / "loaded.safetensors")
    doc = json.loads((tmp_path / "out" / "loaded.json").read_text())
    assert doc["step"] == 2 and doc["train"]["step"] == 2 and doc["rng_ok"]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_flipped_byte_in_one_shard_falls_back_to_previous(
    saved: tuple[Path, Path], tmp_path: Path, world: int
) -> None:
    # One process hashes every shard; with 2 ranks rank 1 finds its own shard bad as it
    # reads it, and every rank moves on to step 1 before any tensor was loaded.
    root, out = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(root, copy)
    shard = copy / "step-2" / "shard-1.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    run_ranks("load", copy, world, tmp_path / "out")
    doc = json.loads((tmp_path / "out" / "loaded.json").read_text())
    assert doc["step"] == 1
    same_bits(out / "ref-1.safetensors", tmp_path / "out" / "loaded.safetensors")
    quarantined = list((copy / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].name.startswith("step-2-")
    assert "shard-1.bin: wrong hash" in (quarantined[0] / "REASON.txt").read_text()
    assert (copy / LATEST).read_text() == "step-1\n"


@pytest.mark.slow
def test_rank_killed_mid_save_commits_nothing(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    codes = run_ranks("kill", root, 2, out)
    assert codes[1] == -9, codes  # SIGKILL between two writes of its shard file
    assert codes[0] == 3, codes  # rank 0's save raised
    error = (out / "rank0-error.txt").read_text()
    assert "step 2" in error and "Nothing was committed" in error
    assert (root / LATEST).read_text() == "step-1\n"
    assert not (root / "step-2").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".staging")]  # rank 0 aborted
    assert CheckpointStore(root).verify(1).ok


def test_one_process_round_trip_and_refused_object(tmp_path: Path) -> None:
    """Without torch.distributed: plain tensors and JSON values; an object is refused."""
    store = CheckpointStore(tmp_path / "ckpt")
    w = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    sharded.save(store, 5, {"w": w, "meta": {"epoch": 3, "name": "x", "ids": [1, 2]}})
    with pytest.raises(UserError, match=r"'meta.loader' is a object.*never pickled"):
        sharded.save(store, 6, {"w": w, "meta": {"loader": object()}})
    with pytest.raises(UserError, match=r"'blob' is a bytes"):
        sharded.save(store, 6, {"blob": b"\x80\x04pickled"})
    assert [i.step for i in store.list()] == [5]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".staging")]
    state = {
        "w": torch.zeros(3, 4, dtype=torch.bfloat16),
        "meta": {"epoch": 0, "name": "", "ids": []},
    }
    info = sharded.load(store, state)
    assert info is not None and info.step == 5
    assert torch.equal(state["w"], w) and state["meta"] == {"epoch": 3, "name": "x", "ids": [1, 2]}


def test_metadata_edit_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    sharded.save(store, 1, {"w": torch.ones(4)})
    info = store.get(1)
    assert info is not None
    path = info.path / sharded.METADATA
    path.write_text(path.read_text().replace('"float32"', '"float64"'))
    with pytest.raises(Exception, match="does not match its manifest hash"):
        sharded.DCPReader(info).read_metadata()
    assert sharded.load(store, {"w": torch.zeros(4)}) is None  # quarantined, nothing older
    assert not (info.path / MANIFEST).exists()
