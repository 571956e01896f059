"""Schema versions of acceptrun's SQLite files, kept in ``PRAGMA user_version``.

Each database declares its migrations as a list of SQL scripts: script ``i`` takes the file
from version ``i`` to ``i + 1``. Opening a file applies the scripts it has not seen, in one
write transaction, and records the new version. A file written by a newer acceptrun (a
version beyond the list) is refused with an error naming the file and the fix, rather than
read with a schema this code does not know.

Version 0 is an empty file, or one written before versions were recorded: the first script
of each database creates its tables with ``IF NOT EXISTS`` so that such files upgrade in
place.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from acceptrun.errors import WorkspaceError

__all__ = ["migrate", "schema_version"]


def schema_version(conn: sqlite3.Connection) -> int:
    """The file's ``PRAGMA user_version`` (0 for a new or unversioned file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, path: str | Path, migrations: Sequence[str]) -> int:
    """Bring the database open on ``conn`` to ``len(migrations)``; return the version.

    ``conn`` must be in autocommit mode (``isolation_level=None``) or have no transaction
    open. Concurrent openers are safe: the version is read again inside ``BEGIN
    IMMEDIATE``, so only one of them applies a script.
    """
    target = len(migrations)
    if schema_version(conn) == target:
        return target
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn)
        if version > target:
            raise WorkspaceError(
                f"{path} has schema version {version}, newer than this acceptrun knows "
                f"({target}): it was written by a newer release. Upgrade acceptrun "
                "(pip install -U acceptrun) to read it."
            )
        for script in migrations[version:]:
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
        # PRAGMA takes no parameters; target is an int computed here.
        conn.execute(f"PRAGMA user_version = {target:d}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return target
