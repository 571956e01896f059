"""The workspace's index, ``index.sqlite``: a cache of each run's run.json, never the truth.

``acceptrun ls``, ``cost`` and the board read it; every close of a run upserts its row
(:func:`upsert`, best effort); :func:`rebuild` recreates it from the run directories,
which stay the single source of truth. The file is SQLite, versioned by
:mod:`acceptrun._util.sqlite`.

Any file a command reads may be garbage. An index that is not a regular file (a
directory, a FIFO, a symlink: SQLite would follow a link and write its pages into
whatever it names, or block on a FIFO) is never opened (:func:`problem`); a damaged one
is rebuilt beside it. Either is moved aside to ``index.sqlite.bad-<unix seconds>`` by a
rebuild, never deleted (a directory there may be someone's), and :class:`Rebuilt` says
where it went.

    rows = read_rows(ws.index_path)                        # IndexRow, oldest first
    rebuild(ws.index_path, ws.records())                   # Rebuilt(count, skipped, aside)
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.confined import describe_mode
from acceptrun._util.sqlite import migrate
from acceptrun.errors import RecordError, WorkspaceError

if TYPE_CHECKING:
    from acceptrun.record.workspace import RunRecord

__all__ = [
    "INDEX_MIGRATIONS",
    "IndexRow",
    "Rebuilt",
    "connect",
    "problem",
    "read_rows",
    "rebuild",
    "row_from_state",
    "upsert",
]

# The index's PRAGMA user_version history (acceptrun._util.sqlite.migrate): append a
# script for each change of shape; never edit a released one.
INDEX_MIGRATIONS = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, name TEXT, status TEXT, verdict TEXT, mode TEXT,
        created_at TEXT, ended_at TEXT, duration_s REAL, attempts INTEGER, path TEXT)""",
)


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One run as the index knows it (a summary of its run.json)."""

    run_id: str
    name: str
    status: str
    verdict: str | None
    mode: str
    created_at: str
    ended_at: str | None
    duration_s: float | None
    attempts: int
    path: str


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """What :func:`rebuild` did: runs indexed, run directories skipped (run.json missing
    or damaged), and where an unusable index was moved (None: it was rebuilt in place)."""

    count: int
    skipped: list[str] = field(default_factory=list)
    aside: Path | None = None


def problem(path: Path) -> str | None:
    """What the index at ``path`` is when it is not a regular file (``"a FIFO (named
    pipe)"``), else None (a regular file, or none there)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else describe_mode(mode)


def connect(path: Path) -> sqlite3.Connection:
    """The index at ``path``, migrated to this release's schema; WorkspaceError when it is
    not a regular file (never opened) or of a newer release."""
    if what := problem(path):
        raise WorkspaceError(
            f"{path} is {what}, not the index acceptrun writes; it is not opened. "
            "`acceptrun index rebuild` moves it aside and writes a new index."
        )
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        migrate(conn, path, INDEX_MIGRATIONS)
    except BaseException:
        conn.close()
        raise
    conn.isolation_level = "DEFERRED"  # back to implicit transactions for the callers
    return conn


def read_rows(path: Path) -> list[IndexRow]:
    """Every row, oldest first."""
    with contextlib.closing(connect(path)) as conn:
        rows = conn.execute("SELECT * FROM runs ORDER BY run_id").fetchall()
    return [IndexRow(*r) for r in rows]


def upsert(path: Path, record: RunRecord) -> None:
    """Write ``record``'s row from its run.json (a damaged one: nothing written)."""
    with contextlib.closing(connect(path)) as conn:
        # run.json is read under the write lock: of two writers (two closes, a close
        # and a rebuild) the later one reads the later state, so none goes backwards.
        conn.execute("BEGIN IMMEDIATE")
        try:
            try:
                row = row_from_state(record, record.state)
            except RecordError:
                conn.execute("ROLLBACK")
                return
            _insert(conn, row)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def rebuild(path: Path, records: Iterable[RunRecord]) -> Rebuilt:
    """Recreate the index at ``path`` from ``records`` (the run directories).

    The rows are replaced in one write transaction on the index itself, so a run that
    closes meanwhile waits for the lock and then writes its newer row: no update is
    lost to the rebuild. An index that SQLite cannot open, or that is not a regular
    file, is rebuilt beside it and the new one renamed in after the bad one is moved
    aside (nothing can be writing to a file that is not a database).
    """
    if problem(path):  # a link, a directory, a FIFO: never opened
        return _rebuild_beside(path, records)
    try:
        conn = connect(path)
    except sqlite3.OperationalError as exc:  # locked past the timeout, or unwritable
        raise WorkspaceError(
            f"cannot rebuild {path}: {exc}. Wait for the command holding it to finish, "
            "or make the workspace writable, and run it again."
        ) from exc
    except sqlite3.DatabaseError:  # "file is not a database" and other damage
        return _rebuild_beside(path, records)
    try:
        conn.isolation_level = None
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM runs")
            done = _fill(conn, records)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()
    return done


def _rebuild_beside(path: Path, records: Iterable[RunRecord]) -> Rebuilt:
    tmp = path.with_name(f".index-{os.getpid()}.sqlite")
    tmp.unlink(missing_ok=True)
    conn = connect(tmp)
    try:
        done = _fill(conn, records)
        conn.commit()
    finally:
        conn.close()
    # A rollback journal of the damaged file must not be applied to the new one.
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        path.with_name(path.name + "-journal").unlink()
    aside = path.with_name(f"{path.name}.bad-{int(time.time())}")
    try:
        os.rename(path, aside)  # a link is moved as the link: its target is untouched
    except FileNotFoundError:  # nothing there any more: nothing moved
        os.replace(tmp, path)
        return done
    os.replace(tmp, path)
    return Rebuilt(done.count, done.skipped, aside)


def _fill(conn: sqlite3.Connection, records: Iterable[RunRecord]) -> Rebuilt:
    skipped: list[str] = []
    count = 0
    for record in records:
        try:
            state = record.state
        except (RecordError, json.JSONDecodeError):
            skipped.append(str(record.path))
            continue
        _insert(conn, row_from_state(record, state))
        count += 1
    return Rebuilt(count, skipped)


def _insert(conn: sqlite3.Connection, r: IndexRow) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
        (r.run_id, r.name, r.status, r.verdict, r.mode, r.created_at, r.ended_at,
         r.duration_s, r.attempts, r.path),
    )  # fmt: skip


def row_from_state(record: RunRecord, state: dict[str, Any]) -> IndexRow:
    """The row of ``record`` from its run.json ``state``."""
    return IndexRow(
        run_id=record.run_id,
        name=str(state.get("name", "")),
        status=str(state.get("status", "unknown")),
        verdict=state.get("verdict"),
        mode=str(state.get("mode", "supervised")),
        created_at=str(state.get("created_at", "")),
        ended_at=state.get("ended_at"),
        duration_s=state.get("duration_s"),
        attempts=int(state.get("attempts", 0)),
        path=str(record.path),
    )
