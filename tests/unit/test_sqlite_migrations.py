"""Schema versions of the queue and index databases (PRAGMA user_version)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from acceptrun._util.sqlite import migrate, schema_version
from acceptrun.errors import WorkspaceError
from acceptrun.queue.db import MIGRATIONS, QueueDB
from acceptrun.record.index import INDEX_MIGRATIONS
from acceptrun.record.workspace import Workspace


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return schema_version(conn)


def test_a_new_queue_database_is_at_the_latest_version(tmp_path: Path) -> None:
    db = QueueDB(tmp_path / "queue.sqlite")
    db.close()
    assert _version(tmp_path / "queue.sqlite") == len(MIGRATIONS)


def test_an_unversioned_queue_database_upgrades_in_place_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queue.sqlite"
    with sqlite3.connect(path) as conn:  # a file written before versions were recorded
        for statement in MIGRATIONS[0].split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(
            "INSERT INTO workers VALUES ('w1', 1, 'host', 'cpu', '0', 1.0, 2.0)",
        )
    assert _version(path) == 0
    db = QueueDB(path)
    try:
        rows = db.conn.execute("SELECT id, host FROM workers").fetchall()
    finally:
        db.close()
    assert rows == [("w1", "host")]
    assert _version(path) == len(MIGRATIONS)


def test_a_queue_database_from_a_newer_release_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(WorkspaceError) as caught:
        QueueDB(path)
    message = str(caught.value)
    assert str(path) in message and "newer" in message and "Upgrade acceptrun" in message


def test_the_index_is_versioned_when_listed_and_rebuilt(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    assert ws.list_runs() == []
    assert _version(ws.index_path) == len(INDEX_MIGRATIONS)
    count, skipped = ws.rebuild_index()
    assert (count, skipped) == (0, [])
    assert _version(ws.index_path) == len(INDEX_MIGRATIONS)


def test_an_index_from_a_newer_release_is_refused_by_name(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    with sqlite3.connect(ws.index_path) as conn:
        conn.execute(f"PRAGMA user_version = {len(INDEX_MIGRATIONS) + 5}")
    with pytest.raises(WorkspaceError, match="newer than this acceptrun knows"):
        ws.list_runs()


def test_migrations_apply_only_the_scripts_a_file_has_not_seen(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    steps = ("CREATE TABLE a (x INTEGER)", "ALTER TABLE a ADD COLUMN y TEXT")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate(conn, path, steps[:1]) == 1
        conn.execute("INSERT INTO a VALUES (7)")
        assert migrate(conn, path, steps) == 2
        assert migrate(conn, path, steps) == 2  # idempotent
        assert conn.execute("SELECT x, y FROM a").fetchall() == [(7, None)]
    finally:
        conn.close()
