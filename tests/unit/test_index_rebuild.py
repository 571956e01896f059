"""index rebuild: in place under the write lock, or beside a damaged file, which is moved
aside; an index that is not a regular file (a directory, a FIFO, a link) is never opened,
``ls`` lists from the run directories meanwhile."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun.record.workspace import Workspace


def test_rebuild_keeps_the_file_and_drops_rows_of_deleted_runs(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    ids = [ws.create_run(f"job{i}", spec_text="", state={}).run_id for i in range(2)]
    ws.list_runs()
    inode = ws.index_path.stat().st_ino
    (ws.runs_dir / ids[0] / "run.json").unlink()
    # A reader holding the index open across the rebuild sees the new rows, not a
    # replaced file: an upsert on the old file could otherwise be lost.
    with contextlib.closing(sqlite3.connect(ws.index_path)) as reader:
        assert ws.rebuild_index() == (1, [])
        assert reader.execute("SELECT run_id FROM runs").fetchall() == [(ids[1],)]
    assert ws.index_path.stat().st_ino == inode


def test_rebuild_replaces_an_index_that_is_not_a_database(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    run_id = ws.create_run("job", spec_text="", state={}).run_id
    ws.index_path.write_bytes(b"not a database at all" * 100)
    assert ws.rebuild_index() == (1, [])
    assert [r.run_id for r in ws.list_runs()] == [run_id]


def _not_a_file(ws: Workspace, kind: str, outside: Path) -> None:
    """Make the index ``kind``: a directory, a FIFO, a link to a user's file or /dev/zero."""
    if kind == "a directory":
        ws.index_path.mkdir()
        (ws.index_path / "user-file").write_text("kept")
    elif kind == "a FIFO":
        os.mkfifo(ws.index_path)
    elif kind == "a link to a user's file":
        ws.index_path.symlink_to(outside)
    else:
        ws.index_path.symlink_to("/dev/zero")


NOT_A_FILE = ["a directory", "a FIFO", "a link to a user's file", "a link to /dev/zero"]


@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_an_index_that_is_not_a_file_is_never_opened_and_rebuild_sets_it_aside(
    tmp_path: Path, kind: str
) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    run_id = ws.create_run("job", spec_text="", state={}).run_id
    ws.index_path.unlink()
    users = tmp_path / "users-notes.txt"
    users.write_text("the user's own words")
    _not_a_file(ws, kind, users)
    # ls lists from the run directories, says why and what fixes it; nothing is written
    # through the link, nothing blocks on the FIFO.
    assert [r.run_id for r in ws.list_runs()] == [run_id]
    assert ws.index_note is not None and "runs listed from their directories" in ws.index_note
    assert "index rebuild" in ws.index_note
    ws.index_run(ws.get_run(run_id))  # best effort: refused, not written through a link
    assert users.read_text() == "the user's own words"
    assert ws.rebuild_index() == (1, [])
    (aside,) = ws.root.glob("index.sqlite.bad-*")  # moved, never deleted
    assert aside.is_symlink() or aside.is_dir() or aside.exists()
    if kind == "a directory":
        assert (aside / "user-file").read_text() == "kept"
    assert ws.index_note is not None and str(aside) in ws.index_note
    assert users.read_text() == "the user's own words"
    assert [r.run_id for r in ws.list_runs()] == [run_id] and ws.index_note is None
    tally("files a command reads", tried=1)


def test_a_damaged_index_lists_from_the_runs_and_rebuild_keeps_it_aside(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    run_id = ws.create_run("job", spec_text="", state={}).run_id
    garbage = os.urandom(8192)
    ws.index_path.write_bytes(garbage)
    assert [r.run_id for r in ws.list_runs()] == [run_id]
    assert ws.index_note is not None and "index.sqlite cannot be used" in ws.index_note
    assert ws.rebuild_index() == (1, [])
    (aside,) = ws.root.glob("index.sqlite.bad-*")
    assert aside.read_bytes() == garbage
    tally("files a command reads", tried=1)
