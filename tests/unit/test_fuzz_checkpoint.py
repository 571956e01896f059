"""Fuzzing committed checkpoints: every flipped byte and every truncation is detected.

A real checkpoint (a small model's weights and its Adam state through ``stage`` and
``write_staged``, the optimizer in its own ``optimizer/`` files) is committed twice; the
newer one is then damaged file by file: random byte flips, truncations, emptied files,
deleted files. For every case ``verify`` must fail, ``latest_verified`` must quarantine
the damaged step and hand back the older good one (which loads), and nothing may raise
anything but the documented errors (AcceptrunError: RecordError for a damaged file). The counts are printed
(run with ``-s``) and ``detected == tried`` is asserted.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import settings

from acceptrun.checkpoint.restore import load_into
from acceptrun.checkpoint.staging import stage, write_staged
from acceptrun.checkpoint.store import MANIFEST, QUARANTINE, CheckpointStore
from acceptrun.checkpoint.writer import CheckpointWriter
from acceptrun.errors import AcceptrunError

# Cases per file and kind of damage: the Hypothesis profile sets the scale (ci: a few
# seconds in all; HYPOTHESIS_PROFILE=deep: thousands of cases).
CASES = max(4, settings.default.max_examples // 8)
FUZZ_COUNTS: dict[str, int] = {"tried": 0, "detected": 0, "restored": 0}


class _Prefixed:
    def __init__(self, writer: CheckpointWriter, prefix: str) -> None:
        self.writer, self.prefix = writer, prefix

    def open(self, name: str) -> Any:
        return self.writer.open(self.prefix + name)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    return model, opt


def _save(store: CheckpointStore, step: int, model: Any, opt: Any) -> None:
    w = store.begin(step)
    write_staged(stage({"model": model}, rng=False), w)
    write_staged(stage({"optimizer": opt}, rng=False), _Prefixed(w, "optimizer/"))
    store.commit(w, metrics={"loss": 1.0 / (step + 1)}, meta={"epoch": step})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt") / "store"
    model, opt = _model()
    store = CheckpointStore(root, keep_last=3)
    _save(store, 1, model, opt)
    _save(store, 2, model, opt)
    assert store.verify(2).ok and store.verify(1).ok
    return root


def _files(step_dir: Path) -> list[str]:
    return sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file())


def _flip(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    i = rng.randrange(len(data))
    data[i] ^= rng.randrange(1, 256)  # never 0: the byte always changes
    path.write_bytes(bytes(data))
    return f"flip byte {i}"


def _truncate(path: Path, rng: random.Random) -> str:
    size = path.stat().st_size
    keep = rng.randrange(size)  # strictly shorter
    with path.open("r+b") as f:
        f.truncate(keep)
    return f"truncate to {keep} of {size}"


def _empty(path: Path, rng: random.Random) -> str:
    path.write_bytes(b"")
    return "empty"


def _delete(path: Path, rng: random.Random) -> str:
    path.unlink()
    return "delete"


def _junk(path: Path, rng: random.Random) -> str:
    size = path.stat().st_size
    path.write_bytes(rng.randbytes(size))
    return "same size, random bytes"


DAMAGE: dict[str, tuple[Callable[[Path, random.Random], str], int]] = {
    "flip": (_flip, CASES),
    "truncate": (_truncate, CASES),
    "junk": (_junk, max(1, CASES // 4)),
    "empty": (_empty, 1),
    "delete": (_delete, 1),
}


def _load_good(step_dir: Path) -> None:
    model, opt = _model()
    load_into(step_dir, {"model": model}, rng=False)
    load_into(step_dir / "optimizer", {"optimizer": opt}, rng=False)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_damaged_file_is_detected_and_restore_falls_back(
    pristine: Path, tmp_path: Path, kind: str
) -> None:
    damage, cases = DAMAGE[kind]
    rng = random.Random(f"ckpt-{kind}")
    names = _files(pristine / "step-2")
    assert {MANIFEST, "tensors.safetensors", "state.json", "optimizer/state.json"} <= set(names)
    tried = detected = restored = 0
    missed: list[str] = []
    for name in names:
        for case in range(cases):
            root = tmp_path / f"{name.replace('/', '_')}-{case}"
            shutil.copytree(pristine, root)
            what = damage(root / "step-2" / name, rng)
            tried += 1
            store = CheckpointStore(root, keep_last=3)
            # Loading the damaged step directly: a documented error or (bytes of a tensor
            # changed, which only the hashes can tell) a load; never anything else.
            with contextlib.suppress(AcceptrunError):
                _load_good(root / "step-2")
            result = store.verify()
            if not result.ok and result.problems:
                detected += 1
            else:
                missed.append(f"{name}: {what}")
            good = store.latest_verified()
            if good is not None and good.step == 1:
                _load_good(good.path)
                assert (root / "LATEST").read_text() == "step-1\n"
                assert any(p.name.startswith("step-2") for p in (root / QUARANTINE).iterdir())
                restored += 1
    FUZZ_COUNTS["tried"] += tried
    FUZZ_COUNTS["detected"] += detected
    FUZZ_COUNTS["restored"] += restored
    print(
        f"\ncheckpoint damage {kind!r}: {tried} tried, {detected} detected, "
        f"{restored} restored from the previous good step ({len(names)} files)"
    )
    assert missed == [], missed
    assert detected == tried
    assert restored == tried


def test_an_edited_manifest_value_is_caught_by_its_digest(pristine: Path, tmp_path: Path) -> None:
    """Metrics and meta are not hashed files: the manifest's own digest covers them."""
    root = tmp_path / "store"
    shutil.copytree(pristine, root)
    path = root / "step-2" / MANIFEST
    doc = json.loads(path.read_text())
    doc["metrics"]["loss"] = 0.0001  # a better-looking checkpoint, written by hand
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    result = CheckpointStore(root).verify(2)
    assert not result.ok
    assert any("does not match its digest" in p for p in result.problems), result.problems
    assert CheckpointStore(root).get(2) is None  # not listed as a checkpoint either
