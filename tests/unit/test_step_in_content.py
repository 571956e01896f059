"""A checkpoint that says its own step: trainer_state.json, or a JSON sidecar beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from acceptrun.supervisor.dating import SIDECAR_SKEW_S, step_in_content


def test_a_trainer_directory_is_dated_by_its_trainer_state(tmp_path: Path) -> None:
    ckpt = tmp_path / "last"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"x")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 150, "epoch": 1.5}))
    assert step_in_content(ckpt) == (150, "global_step in trainer_state.json")


@pytest.mark.parametrize(
    ("sidecar", "body", "expected"),
    [
        pytest.param("ckpt.json", {"iter_num": 150}, (150, "iter_num in ckpt.json"), id="stem"),
        pytest.param("ckpt.pt.json", {"step": 7}, (7, "step in ckpt.pt.json"), id="name"),
        pytest.param("ckpt.json", {"global_step": 3, "step": 9}, (3, "global_step in ckpt.json"),
                     id="first-key-wins"),
        pytest.param("ckpt.json", {"step": True}, None, id="bool"),
        pytest.param("ckpt.json", {"step": -1}, None, id="negative"),
        pytest.param("ckpt.json", {"step": 1.5}, None, id="fraction"),
        pytest.param("ckpt.json", [150], None, id="not-an-object"),
        pytest.param("other.json", {"step": 150}, None, id="another-file"),
    ],
)  # fmt: skip
def test_a_file_is_dated_by_a_json_sidecar(
    tmp_path: Path, sidecar: str, body: object, expected: tuple[int, str] | None
) -> None:
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    (tmp_path / sidecar).write_text(json.dumps(body))
    assert step_in_content(tmp_path / "ckpt.pt") == expected


def test_a_sidecar_of_another_save_is_not_used(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"weights")
    side = tmp_path / "ckpt.json"
    side.write_text(json.dumps({"iter_num": 100}))
    now = ckpt.stat().st_mtime
    os.utime(side, (now - SIDECAR_SKEW_S - 60, now - SIDECAR_SKEW_S - 60))
    assert step_in_content(ckpt) is None


def test_damaged_or_self_or_missing_sidecars_say_nothing(tmp_path: Path) -> None:
    (tmp_path / "ckpt.pt").write_bytes(b"weights")
    (tmp_path / "ckpt.json").write_text('{"step": ')  # torn
    assert step_in_content(tmp_path / "ckpt.pt") is None
    state = tmp_path / "state.json"  # a JSON checkpoint is not its own sidecar
    state.write_text(json.dumps({"step": 5}))
    assert step_in_content(state) is None
    assert step_in_content(tmp_path / "absent.pt") is None
