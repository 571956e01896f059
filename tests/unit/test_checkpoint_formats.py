"""checkpoint/formats.py: a checkpoint file proves itself whole by its own format, and a
torn one (cut anywhere) or one of an unknown format proves nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from acceptrun.checkpoint.formats import whole, whole_dir


def _written(tmp_path: Path) -> dict[str, Path]:
    out = {}
    out["torch"] = tmp_path / "ckpt.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32), "step": 7}, out["torch"])
    out["savez"] = tmp_path / "state.npz"
    np.savez(out["savez"], a=np.arange(500), b=np.ones(3))
    out["npy"] = tmp_path / "w.npy"
    np.save(out["npy"], np.arange(4000, dtype=np.float64))
    out["safetensors"] = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(100), "b": torch.ones(7, 3)}, str(out["safetensors"]))
    out["json"] = tmp_path / "snapshot.json"
    out["json"].write_text(json.dumps({"epoch": 3, "weights": list(range(300))}))
    return out


def test_every_known_format_is_whole_and_says_which_test_it_passed(tmp_path: Path) -> None:
    tests = {kind: whole(path) for kind, path in _written(tmp_path).items()}
    assert tests["torch"] is not None and tests["torch"].startswith("zip: central directory")
    assert tests["savez"] is not None and tests["savez"].startswith("zip:")
    assert tests["npy"] == "npy: header and array bytes match the size"
    assert tests["safetensors"] == "safetensors: header and 2 tensors end at the file's end"
    assert tests["json"] == "json: parses"


@pytest.mark.parametrize("kind", ["torch", "savez", "npy", "safetensors", "json"])
def test_a_file_cut_anywhere_is_not_whole(tmp_path: Path, kind: str) -> None:
    path = _written(tmp_path)[kind]
    data = path.read_bytes()
    cut = tmp_path / ("cut" + path.suffix)
    for at in sorted({1, 9, len(data) // 3, len(data) // 2, len(data) - 2, len(data) - 1}):
        cut.write_bytes(data[:at])
        assert whole(cut) is None, (kind, at, len(data))


def test_an_unknown_format_proves_nothing(tmp_path: Path) -> None:
    raw = tmp_path / "state.bin"
    raw.write_bytes(b"\x80\x04" + b"x" * 100)  # a pickle's opening, or anything
    assert whole(raw) is None
    assert whole(tmp_path / "missing.pt") is None


def test_a_directory_is_whole_when_every_file_is(tmp_path: Path) -> None:
    d = tmp_path / "checkpoint-500"
    d.mkdir()
    (d / "config.json").write_text("{}")
    torch.save({"x": 1}, d / "optimizer.pt")
    by, names = whole_dir(d)
    assert by == "directory: all 2 files whole (1 json, 1 zip)"
    assert names == ["config.json", "optimizer.pt"]
    (d / "rng_state.bin").write_bytes(b"\x00" * 10)
    assert whole_dir(d)[0] is None
