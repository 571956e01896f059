"""Checkpoint mirror over a local path and memory://: LATEST never moves back, a step
deleted before upload is skipped, pending steps resume in a later attempt, bad settings
name the fix (S3 on loopback: tests/integration/test_checkpoint_mirror.py)."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from acceptrun._util.durable import read_json
from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.mirror_remote import fetch, remote_steps
from builders import assert_same_checkpoint, make_checkpoint

Events = list[tuple[str, dict[str, Any]]]


def recorder(events: Events) -> Callable[[str, dict[str, Any]], None]:
    return lambda name, payload: events.append((name, payload))


@pytest.mark.parametrize("kind", ["path", "memory"])
def test_local_path_and_memory_mirrors(kind: str, tmp_path: Path) -> None:
    url = (
        str(tmp_path / "other-disk" / "run1")
        if kind == "path"
        else f"memory://acceptrun-{secrets.token_hex(3)}/run1"
    )
    ckpt = tmp_path / "ckpt"
    mirror = Mirror(url, state_path=tmp_path / "state" / "mirror.json", verify="size")
    mirror.start()
    for step in (1, 2):
        mirror.enqueue(step, make_checkpoint(ckpt, step))
    assert mirror.wait(timeout=10)
    mirror.close()

    assert remote_steps(url) == [1, 2]
    restored = fetch(url, tmp_path / "restore")
    assert_same_checkpoint(ckpt / "step-2", restored)
    assert fetch(url, tmp_path / "restore") == restored  # again: the old copy replaced whole
    assert_same_checkpoint(ckpt / "step-2", restored)
    assert sorted(p.name for p in (tmp_path / "restore").iterdir()) == ["LATEST", "step-2"]
    if kind == "path":
        assert (tmp_path / "other-disk" / "run1" / "LATEST").read_text() == "step-2\n"
        assert_same_checkpoint(ckpt / "step-1", tmp_path / "other-disk" / "run1" / "step-1")


def test_latest_never_moves_back_and_unmanifested_steps_are_ignored(tmp_path: Path) -> None:
    url = f"memory://acceptrun-{secrets.token_hex(3)}/run"
    ckpt = tmp_path / "ckpt"
    mirror = Mirror(url, state_path=tmp_path / "mirror.json")
    mirror.upload(20, make_checkpoint(ckpt, 20))
    mirror.upload(10, make_checkpoint(ckpt, 10))  # a late catch-up of an older step
    fs, root = fsspec.url_to_fs(url)
    assert fs.cat_file(f"{root}/LATEST") == b"step-20\n"

    # A step whose upload died before its manifest is not a checkpoint.
    fs.pipe_file(f"{root}/step-30/model.safetensors", b"partial")
    fs.pipe_file(f"{root}/LATEST", b"step-30\n")
    assert remote_steps(url) == [10, 20]
    assert fetch(url, tmp_path / "restore") == tmp_path / "restore" / "step-20"


def test_step_deleted_locally_before_upload_is_skipped(tmp_path: Path) -> None:
    url = f"memory://acceptrun-{secrets.token_hex(3)}/run"
    events: Events = []
    mirror = Mirror(url, state_path=tmp_path / "mirror.json", on_event=recorder(events))
    step_dir = make_checkpoint(tmp_path / "ckpt", 5)
    mirror.enqueue(5, step_dir)
    shutil.rmtree(step_dir)  # retention ran before the mirror thread got to it
    mirror.start()
    # Drained, and nothing failed: a newer step superseded the skipped one.
    assert mirror.wait(timeout=10) is True
    mirror.close()
    state = mirror.status()[5]
    assert state["state"] == "skipped" and "deleted locally" in state["reason"]
    assert [(name, p["step"], p["state"]) for name, p in events] == [
        ("mirror_failed", 5, "skipped")
    ]
    assert remote_steps(url) == []


def test_pending_steps_resume_in_a_later_attempt(tmp_path: Path) -> None:
    url = f"memory://acceptrun-{secrets.token_hex(3)}/run"
    state_path = tmp_path / "mirror.json"
    step_dir = make_checkpoint(tmp_path / "ckpt", 9)
    first = Mirror(url, state_path=state_path)
    first.enqueue(9, step_dir)  # the attempt dies before the thread uploads it
    first.close()
    assert read_json(state_path)["steps"]["9"]["state"] == "pending"

    second = Mirror(url, state_path=state_path)
    second.start()
    assert second.wait(timeout=10)
    second.close()
    assert remote_steps(url) == [9]


def test_bad_settings_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="retry_base_s"):
        Mirror("memory://x", state_path=tmp_path / "m.json", retry_base_s=0)
    with pytest.raises(ValueError, match="verify"):
        Mirror("memory://x", state_path=tmp_path / "m.json", verify="md5")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
