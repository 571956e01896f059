"""The workspace's index, ``index.sqlite``: a cache of each run's run.json, never the truth.

``acceptrun ls``, ``cost`` and the board read it; every close of a run upserts its row
(:func:`upsert`, best effort); :func:`rebuild` recreates it from the run directories,
which stay the single source of truth. The file is SQLite, versioned by
:mod:`acceptrun._util.sqlite`.

Beside each run's row, the ``costs`` table keeps what the workspace-wide cost views
(``acceptrun cost``, the board's spend page) read of a closed run's ledger.json: the
figures they add up (:data:`COST_FIGURES`, a column each) and a digest of the rest
(:func:`ledger_digest`). Those views read 10,000 runs from here in a fraction of a
second instead of opening every record. Every write of a ledger.json refreshes its row
(:meth:`acceptrun.record.workspace.RunRecord.write_json`); a closed run without one (an
index written before this table) is read from its record and written back by the
reader (:func:`put_costs`).

Any file a command reads may be garbage. An index that is not a regular file (a
directory, a FIFO, a symlink: SQLite would follow a link and write its pages into
whatever it names, or block on a FIFO) is never opened (:func:`problem`); a damaged one
is rebuilt beside it. Either is moved aside to ``index.sqlite.bad-<unix seconds>`` by a
rebuild, never deleted (a directory there may be someone's), and :class:`Rebuilt` says
where it went.

    rows = read_rows(ws.index_path)                        # IndexRow, oldest first
    rebuild(ws.index_path, ws.records())                   # Rebuilt(count, skipped, aside)
    costs = read_costs(ws.index_path)                      # CostRow, oldest first
    light = read_costs(ws.index_path, figures=False)       # the figures left in the index
    sums = sum_costs(ws.index_path, {r.run_id: "" for r in light})  # {"": (sums...)}
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
from acceptrun.record.status import RUN_LIVE

if TYPE_CHECKING:
    from acceptrun.record.workspace import RunRecord

__all__ = [
    "COST_FIGURES",
    "INDEX_MIGRATIONS",
    "CostRow",
    "IndexRow",
    "Rebuilt",
    "connect",
    "cost_row",
    "ledger_digest",
    "problem",
    "put_costs",
    "read_costs",
    "read_digests",
    "read_figures",
    "read_rows",
    "rebuild",
    "row_from_state",
    "sum_costs",
    "upsert",
]

LEDGER_FILE = "ledger.json"  # written by acceptrun.cost.ledger (a layer above: read here as JSON)
# The figures of a ledger that the cost views add up over runs (acceptrun.cost.report:
# summarize, waste_by), as paths into ledger.json: one REAL column each in ``costs``.
# tests/unit/test_cost_index.py checks that they cover cost.ledger's PARTS and RESPONSIBLE.
COST_FIGURES: tuple[str, ...] = (
    "totals.compute_usd", "totals.storage_usd", "totals.human_usd", "totals.switching_usd",
    "billed_s", "device_seconds", "compute.usd",
    *(f"compute.split_{u}.{p}" for u in ("usd", "s")
      for p in ("productive", "wasted", "idle", "checkpoint_stall")),
    *(f"compute.waste.{u}.{r}" for u in ("usd", "seconds")
      for r in ("provider", "workload", "unknown", "drill")),
    "storage.left_behind.bytes", "storage.left_behind.monthly_usd",
    "storage.left_behind.mirror_bytes", "storage.left_behind.mirror_monthly_usd",
    *(f"compute.detail_s.{k}" for k in (
        "productive", "checkpoint_stall", "wasted.lost_work", "wasted.failed_startup",
        "wasted.failed_preflight", "idle.startup", "idle.backoff", "idle.after_last_step",
        "idle.idle_stop", "idle.after_run", "idle.rounding")),
)  # fmt: skip
DETAIL = "compute.detail_s."  # its keys have dots of their own: "idle.startup"
DETAILS = tuple(f for f in COST_FIGURES if f.startswith(DETAIL))
# What else a digest keeps, in the ledger's own shape (the run's ledger.json holds the
# rest): the price, and the attempts a credit claim lists.
_KEPT = ("run_id", "name", "status", "created_at", "priced", "unpriced_reason", "accepted",
         "totals", "total_usd", "billed_s", "device_seconds", "nodes")  # fmt: skip
_KEPT_COMPUTE = ("usd", "split_s", "split_usd", "detail_s", "waste")
_KEPT_PRICE = ("label", "provider", "instance", "gpu", "price_per_hour", "increment_s",
               "minimum_s", "storage_per_gib_month", "source")  # fmt: skip
_COST_COLUMNS = ("run_id", "digest", "price", "accepted", "priced", "claims",
                 *(f.replace(".", "__") for f in COST_FIGURES))  # fmt: skip

# The index's PRAGMA user_version history (acceptrun._util.sqlite.migrate): append a
# script for each change of shape; never edit a released one.
INDEX_MIGRATIONS = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, name TEXT, status TEXT, verdict TEXT, mode TEXT,
        created_at TEXT, ended_at TEXT, duration_s REAL, attempts INTEGER, path TEXT)""",
    # 2: the cost views' part of each closed run's ledger.json. An index upgraded to it
    # has no cost rows yet: the first `acceptrun cost` reads those runs' ledgers and
    # writes theirs (`acceptrun index rebuild` writes them all).
    "CREATE TABLE IF NOT EXISTS costs (run_id TEXT PRIMARY KEY, digest TEXT NOT NULL, "
    "price TEXT, accepted INTEGER, priced INTEGER, claims INTEGER, "
    + ", ".join(f"{c} REAL" for c in _COST_COLUMNS[6:])
    + ")",
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
class CostRow:
    """A run as the cost views read it from the index: its row, and its ledger's figures
    (``digest`` None: the index holds none for it yet)."""

    run_id: str
    name: str
    status: str
    created_at: str
    path: str
    digest: str | None  # JSON text of ledger_digest(ledger.json); read when the row is
    price: str | None  # JSON text of the digest's price
    accepted: bool
    priced: bool
    claims: int  # attempts the digest keeps for a credit claim
    figures: tuple[float, ...]  # COST_FIGURES, in order; () while left in the index
    index: str = ""  # the index it was read from ("": read from its record)


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


def read_costs(path: Path, *, figures: bool = True) -> list[CostRow]:
    """Every run's row with its ledger's figures, oldest first (one query, no record read).

    The digests are not read (``digest`` is ``""`` for a run that has one, None for one
    without): :func:`read_digests` reads those a view shows. With ``figures=False`` the
    figures stay in the index too (``()``): :func:`sum_costs` adds them up there, and
    :func:`read_figures` reads them (10,000 runs' figures are half a million values).
    """
    cols = ", ".join(f"c.{c}" for c in _COST_COLUMNS[2 : None if figures else 6])
    with contextlib.closing(connect(path)) as conn:
        rows = conn.execute(
            f"SELECT r.run_id, r.name, r.status, r.created_at, r.path, "
            f"CASE WHEN c.run_id IS NULL THEN NULL ELSE '' END, {cols} "
            "FROM runs r LEFT JOIN costs c ON c.run_id = r.run_id ORDER BY r.run_id"
        ).fetchall()
    where = str(path)
    out = []
    for r in rows:
        run_id, name, status, created_at, at, digest, price = r[:7]
        out.append(CostRow(run_id, name, status, created_at, at, digest, price,
                           accepted=bool(r[7]), priced=bool(r[8]), claims=r[9] or 0,
                           figures=r[10:], index=where))  # fmt: skip
    return out


# What sum_costs adds up: each figure, then each detail figure (seconds) times its run's
# compute USD per billed second (what that detail cost, as summarize reckons it per run).
_PER_S = "CASE WHEN c.billed_s THEN c.compute__usd / c.billed_s ELSE 0.0 END"
_SUMS = ", ".join(
    [*(f"TOTAL(c.{c})" for c in _COST_COLUMNS[6:])]
    + [f"TOTAL(c.{f.replace('.', '__')} * {_PER_S})" for f in DETAILS]
)
_FIGURES = ", ".join(f"c.{c}" for c in _COST_COLUMNS[6:])


def _choose(conn: sqlite3.Connection, keys: Iterable[tuple[str, str]]) -> None:
    """A temporary table of (run id, its group) for the query that follows (in memory,
    this connection's own: the index itself is not written)."""
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS chosen (run_id TEXT PRIMARY KEY, k TEXT)")
    conn.execute("DELETE FROM temp.chosen")
    conn.executemany("INSERT OR REPLACE INTO temp.chosen VALUES (?, ?)", keys)


def sum_costs(path: Path, keys: dict[str, str]) -> dict[str, tuple[float, ...]]:
    """The figures of the runs ``keys`` names (run id -> the name of its group), added up
    by SQLite per group: each of COST_FIGURES, then each of DETAILS in USD. A run the
    index holds no figures for adds nothing; a group of none of them is absent."""
    with contextlib.closing(connect(path)) as conn:
        conn.execute("BEGIN")  # one read: the runs compared are the runs summed
        groups = set(keys.values())
        held = {r for (r,) in conn.execute("SELECT run_id FROM costs")}
        if len(groups) == 1 and held == keys.keys():
            # every run the index holds figures for, in one group: no table of them
            (found,) = conn.execute(f"SELECT {_SUMS} FROM costs c").fetchall()
            return {groups.pop(): tuple(found)}
        _choose(conn, keys.items())
        rows = conn.execute(
            f"SELECT ch.k, {_SUMS} FROM temp.chosen ch "
            "JOIN costs c ON c.run_id = ch.run_id GROUP BY ch.k"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def read_figures(path: Path, run_ids: Iterable[str]) -> dict[str, tuple[float, ...]]:
    """The figures (COST_FIGURES) of these runs, by run id (those the index holds)."""
    with contextlib.closing(connect(path)) as conn:
        _choose(conn, ((r, "") for r in run_ids))
        rows = conn.execute(
            f"SELECT c.run_id, {_FIGURES} FROM temp.chosen ch JOIN costs c ON c.run_id = ch.run_id"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def read_digests(path: Path, run_ids: list[str]) -> dict[str, str]:
    """The digests (JSON text) of these runs, by run id."""
    with contextlib.closing(connect(path)) as conn:
        found: dict[str, str] = {}
        for i in range(0, len(run_ids), 500):  # SQLite's limit on bound parameters
            chunk = run_ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            found.update(
                conn.execute(f"SELECT run_id, digest FROM costs WHERE run_id IN ({marks})", chunk)
            )
    return found


def put_costs(path: Path, ledgers: Iterable[dict[str, Any]]) -> None:
    """Write the cost rows of ledgers a reader took from their records."""
    with contextlib.closing(connect(path)) as conn:
        conn.executemany(_PUT_COST, [_cost_values(led) for led in ledgers])
        conn.commit()


def ledger_digest(ledger: dict[str, Any]) -> dict[str, Any]:
    """What the cost views read of one ledger, in its own shape (a ledger reads the same).

    Only the attempts a credit claim lists are kept (the provider's failures and injected
    faults); of the storage, its ``left_behind``.
    """
    out = {k: ledger.get(k) for k in _KEPT}
    price = ledger.get("price")
    out["price"] = {k: price.get(k) for k in _KEPT_PRICE} if isinstance(price, dict) else None
    compute = ledger.get("compute") or {}
    claimed = [
        a
        for a in compute.get("attempts") or []
        if a.get("responsibility") == "provider" or (a.get("evidence") or {}).get("injected")
    ]
    out["compute"] = {**{k: compute.get(k) for k in _KEPT_COMPUTE}, "attempts": claimed}
    out["storage"] = {"left_behind": (ledger.get("storage") or {}).get("left_behind") or {}}
    return out


def _figure(ledger: dict[str, Any], figure: str) -> float:
    value: Any = ledger
    keys = figure.split(".")
    if figure.startswith(DETAIL):
        keys = [*DETAIL.split(".")[:2], figure.removeprefix(DETAIL)]
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else 0.0


_PUT_COST = (
    f"INSERT OR REPLACE INTO costs ({', '.join(_COST_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_COST_COLUMNS))})"
)


def _cost_values(ledger: dict[str, Any]) -> tuple[Any, ...]:
    digest = ledger_digest(ledger)
    return (
        digest["run_id"],
        json.dumps(digest),
        json.dumps(digest["price"]),
        digest["accepted"] is True,
        bool(digest["priced"]),
        len(digest["compute"]["attempts"]),
        *(_figure(ledger, f) for f in COST_FIGURES),
    )


def cost_row(ledger: dict[str, Any], *, path: str = "") -> CostRow:
    """The row the index would hold for ``ledger`` (one read from its record)."""
    run_id, digest, price, accepted, priced, claims, *figures = _cost_values(ledger)
    name, status, created = (str(ledger.get(k)) for k in ("name", "status", "created_at"))
    return CostRow(run_id, name, status, created, path, digest, price,
                   accepted=accepted, priced=priced, claims=claims, figures=tuple(figures))  # fmt: skip


def _put_cost(conn: sqlite3.Connection, record: RunRecord, state: dict[str, Any]) -> None:
    """The cost row of a closed run whose ledger.json reads (else none: read when asked)."""
    if state.get("status") in RUN_LIVE:
        return
    try:
        ledger = record.read_json(LEDGER_FILE)
    except (OSError, ValueError, RecordError):
        ledger = None
    if isinstance(ledger, dict) and isinstance(ledger.get("compute"), dict):
        conn.execute(_PUT_COST, _cost_values({**ledger, "run_id": record.run_id}))
    else:
        conn.execute("DELETE FROM costs WHERE run_id = ?", (record.run_id,))


def upsert(path: Path, record: RunRecord) -> None:
    """Write ``record``'s row from its run.json (a damaged one: nothing written), and the
    digest of its ledger.json once it is closed."""
    with contextlib.closing(connect(path)) as conn:
        # run.json is read under the write lock: of two writers (two closes, a close
        # and a rebuild) the later one reads the later state, so none goes backwards.
        conn.execute("BEGIN IMMEDIATE")
        try:
            try:
                state = record.state
            except RecordError:
                conn.execute("ROLLBACK")
                return
            _insert(conn, row_from_state(record, state))
            _put_cost(conn, record, state)
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
            conn.execute("DELETE FROM costs")
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
        _put_cost(conn, record, state)
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
