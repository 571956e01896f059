"""index rebuild: in place under the write lock, or beside a damaged file."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

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
