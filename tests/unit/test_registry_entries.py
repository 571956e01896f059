"""The user's list of workspaces holding garbage: never a traceback, never overwritten.

An entry that cannot be a workspace's path (a NUL in it, a control character, not a
string, not absolute) is skipped and counted in ``owned().note()``; a list that is not
JSON is ignored with a warning by readers, and moved aside (never overwritten) by the
next write, which starts a new list.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun.record import registry

BAD_ENTRIES = [
    {"path": "/home/me/a\x00b/.acceptrun"},
    {"path": "/home/me/\x1b[31mred/.acceptrun"},
    {"path": "relative/.acceptrun"},
    {"path": 7},
    {"no path": True},
    "not an object",
]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config"
    monkeypatch.setenv(registry.ENV_CONFIG_DIR, str(path))
    monkeypatch.setattr(registry, "_warned", False)
    return path


def test_bad_entries_are_skipped_and_counted(config: Path, tmp_path: Path) -> None:
    good = tmp_path / "proj" / ".acceptrun"
    (good / "runs").mkdir(parents=True)
    registry.remember(good)
    listed = config / registry.FILE
    doc = json.loads(listed.read_text())
    doc["workspaces"] += BAD_ENTRIES
    listed.write_text(json.dumps(doc))
    mine = registry.owned()
    assert [e.path for e in mine.workspaces] == [good.resolve()]
    dict_entries = sum(isinstance(e, dict) for e in BAD_ENTRIES)
    assert mine.bad == dict_entries  # a non-object is dropped by the reader itself
    note = mine.note()
    assert note is not None and f"{dict_entries} entries of {listed} skipped" in note
    registry.remember(tmp_path / "other" / ".acceptrun")  # the user's entries are kept
    kept = json.loads(listed.read_text())["workspaces"]
    assert [e for e in BAD_ENTRIES if isinstance(e, dict)] == [e for e in kept if e in BAD_ENTRIES]
    tally("files a command reads", tried=len(BAD_ENTRIES))


@pytest.mark.parametrize("content", [b"{\x00 not json", b"\xff\xfe garbage", b"[" * 100_000])
def test_a_list_that_is_not_json_is_moved_aside_not_overwritten(
    config: Path, tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    config.mkdir(mode=0o700)
    listed = config / registry.FILE
    listed.write_bytes(content)
    listed.chmod(0o600)
    assert registry.owned().workspaces == []
    assert f"{listed} is not valid JSON" in capsys.readouterr().err
    assert listed.read_bytes() == content  # a reader never rewrites it
    ws = tmp_path / "proj" / ".acceptrun"
    registry.remember(ws)
    (aside,) = config.glob(f"{registry.FILE}.damaged-*")
    assert aside.read_bytes() == content
    assert [e.path for e in registry.listed()] == [ws.resolve()]
    tally("files a command reads", tried=1)
