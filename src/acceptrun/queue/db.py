"""The queue's state: ``queue.sqlite`` in the workspace.

Two tables. ``jobs`` holds every submitted job with its frozen spec, what it asks for
(``kind`` gpu or cpu, ``slots``), its state and, once started, the run it drives::

    queued ──start──> running ──exit──> done | failed
      ^                  │ preempt (acceptrun stop)       cancel (acceptrun stop)
      └──── exited ──── preempting                 ──────> cancelled
      (run id kept: the next start resumes the run)

``workers`` holds the live workers (pid, host, devices, heartbeat), so that a restarted
worker can tell a job whose worker died (an orphan) from one that is merely running.

The database runs in WAL mode (readers such as ``acceptrun queue`` never block the
worker); every state change is one ``BEGIN IMMEDIATE`` transaction whose ``WHERE``
clause names the state it expects, so two processes (a worker and ``acceptrun cancel``,
or two workers recovering the same orphan) never both win. Times are unix seconds.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.sqlite import migrate
from acceptrun.record.status import JOB_ACTIVE, JOB_ENDED, JobState

__all__ = ["ACTIVE", "ENDED", "STATES", "Job", "QueueDB", "WorkerRow", "format_devices"]

STATES = tuple(JobState)
ACTIVE = JOB_ACTIVE  # a process works on the job
ENDED = JOB_ENDED
BUSY_TIMEOUT_S = 30.0  # seconds a writer waits for another's transaction before failing

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    spec_path TEXT NOT NULL,          -- the spec as submitted (absolute path)
    spec_text TEXT NOT NULL,          -- its frozen, resolved copy: what the job runs
    spec_hash TEXT NOT NULL,
    priority INTEGER NOT NULL,
    kind TEXT NOT NULL,               -- gpu (resources.gpus > 0) or cpu
    slots INTEGER NOT NULL,           -- GPUs, or CPU slots (resources.processes)
    expected_s REAL,                  -- limits.expected_runtime max, seconds
    state TEXT NOT NULL,
    run_id TEXT,                      -- picked at the first start, kept across preemptions
    worker_id TEXT,
    pid INTEGER,                      -- the job's acceptrun process (its run's supervisor)
    devices TEXT,                     -- "0,1": GPU indices or CPU slot numbers
    submitted_at REAL NOT NULL,       -- FIFO order within a priority
    queued_at REAL NOT NULL,          -- when it last entered the queue (waits count from it)
    started_at REAL,                  -- start of the current or last stint
    ended_at REAL,
    ran_s REAL NOT NULL DEFAULT 0,    -- seconds of the ended stints
    attempts INTEGER NOT NULL DEFAULT 0,     -- starts: the run, then each resume
    preemptions INTEGER NOT NULL DEFAULT 0,
    stop_request TEXT,                -- preempt | cancel, while one is pending
    stop_sent_at REAL,                -- when `acceptrun stop` reached the run
    exit_code INTEGER,
    note TEXT                         -- the last thing that happened, for `acceptrun queue`
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    kind TEXT NOT NULL,               -- gpu | cpu
    devices TEXT NOT NULL,
    started_at REAL NOT NULL,
    heartbeat REAL NOT NULL
);
"""
# PRAGMA user_version history (acceptrun._util.sqlite.migrate): append a script for each
# change of shape; never edit a released one.
MIGRATIONS = (_SCHEMA,)


def format_devices(devices: Sequence[int]) -> str:
    """``"0,1,2"``: the form stored and passed in CUDA_VISIBLE_DEVICES."""
    return ",".join(str(d) for d in devices)


def _parse_devices(text: str | None) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d) if text else ()


@dataclass(frozen=True, slots=True)
class Job:
    """One row of ``jobs``."""

    id: int
    name: str
    spec_path: str
    spec_text: str
    spec_hash: str
    priority: int
    kind: str
    slots: int
    expected_s: float | None
    state: str
    run_id: str | None
    worker_id: str | None
    pid: int | None
    devices: tuple[int, ...]
    submitted_at: float
    queued_at: float
    started_at: float | None
    ended_at: float | None
    ran_s: float
    attempts: int
    preemptions: int
    stop_request: str | None
    stop_sent_at: float | None
    exit_code: int | None
    note: str | None

    def waited_s(self, now: float) -> float:
        """Seconds spent waiting in the queue, all stints together."""
        end = self.ended_at if self.state in ENDED else now
        return max(0.0, (end or now) - self.submitted_at - self.ran_for(now))

    def ran_for(self, now: float) -> float:
        """Seconds it has run, the current stint included."""
        current = 0.0
        if self.state in ACTIVE and self.started_at is not None:
            current = now - self.started_at
        return self.ran_s + current

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["devices"] = list(self.devices)
        del out["spec_text"]
        return out


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One row of ``workers``."""

    id: str
    pid: int
    host: str
    kind: str
    devices: tuple[int, ...]
    started_at: float
    heartbeat: float


_JOB_COLUMNS = ", ".join(Job.__slots__)


def _job(row: Sequence[Any]) -> Job:
    values = list(row)
    i = Job.__slots__.index("devices")
    values[i] = _parse_devices(values[i])
    return Job(*values)


class QueueDB:
    """``queue.sqlite`` of a workspace; one instance (one connection) per process.

    >>> db = QueueDB(workspace.root / "queue.sqlite")
    >>> job_id = db.submit(name="bert", spec_path="/p/spec.toml", spec_text=text, ...)
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are the explicit BEGIN IMMEDIATE blocks below.
        self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        migrate(self.conn, self.path, MIGRATIONS)

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: taken at once (IMMEDIATE), committed or rolled back."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ---- jobs -----------------------------------------------------------------------------

    def submit(
        self,
        *,
        name: str,
        spec_path: str,
        spec_text: str,
        spec_hash: str,
        priority: int,
        kind: str,
        slots: int,
        expected_s: float | None,
        now: float | None = None,
    ) -> int:
        """Queue a job; returns its id."""
        t = time.time() if now is None else now
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO jobs (name, spec_path, spec_text, spec_hash, priority, kind, slots,"
                " expected_s, state, submitted_at, queued_at, note)"
                " VALUES (?,?,?,?,?,?,?,?,'queued',?,?,'submitted')",
                (name, spec_path, spec_text, spec_hash, priority, kind, slots, expected_s, t, t),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def job(self, job_id: int) -> Job | None:
        row = self.conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        return None if row is None else _job(row)

    def job_by_run(self, run_id: str) -> Job | None:
        row = self.conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE run_id = ? ORDER BY id DESC", (run_id,)
        ).fetchone()
        return None if row is None else _job(row)

    def jobs(self, *states: str, kind: str | None = None) -> list[Job]:
        """Jobs in the given states (all when none), in queue order: priority, then FIFO."""
        where: list[str] = []
        params: list[Any] = []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            params.extend(states)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY priority DESC, submitted_at, id"
        return [_job(r) for r in self.conn.execute(sql, params)]

    def claim(
        self, job_id: int, *, worker_id: str, devices: Sequence[int], run_id: str | None, now: float
    ) -> bool:
        """queued -> running on ``devices``; False when another process took it first."""
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE jobs SET state='running', worker_id=?, devices=?, run_id=?, pid=NULL,"
                " started_at=?, attempts=attempts+1, stop_request=NULL, stop_sent_at=NULL,"
                " exit_code=NULL, note=? WHERE id=? AND state='queued'",
                (worker_id, format_devices(devices), run_id, now, "starting", job_id),
            )
            return cur.rowcount == 1

    def set_pid(self, job_id: int, pid: int, note: str) -> None:
        with self.transaction() as c:
            c.execute("UPDATE jobs SET pid=?, note=? WHERE id=?", (pid, note, job_id))

    def request_stop(self, job_id: int, kind: str, note: str) -> Job | None:
        """Mark a running job for a stop: ``"preempt"`` (running -> preempting) or
        ``"cancel"`` (a cancel wins over a pending preemption). None when not running."""
        with self.transaction() as c:
            if kind == "preempt":
                cur = c.execute(
                    "UPDATE jobs SET state='preempting', stop_request='preempt', note=?"
                    " WHERE id=? AND state='running' AND stop_request IS NULL",
                    (note, job_id),
                )
            else:
                cur = c.execute(
                    "UPDATE jobs SET stop_request='cancel', note=?"
                    " WHERE id=? AND state IN ('running','preempting')",
                    (note, job_id),
                )
            if cur.rowcount != 1:
                return None
        return self.job(job_id)

    def claim_stop(self, job_id: int, now: float) -> bool:
        """Take the delivery of a pending stop: True for one process only (a worker and
        ``acceptrun cancel`` may both try); :meth:`release_stop` hands it back."""
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE jobs SET stop_sent_at=? WHERE id=? AND stop_sent_at IS NULL", (now, job_id)
            )
            return cur.rowcount == 1

    def release_stop(self, job_id: int) -> None:
        with self.transaction() as c:
            c.execute("UPDATE jobs SET stop_sent_at=NULL WHERE id=?", (job_id,))

    def cancel_queued(self, job_id: int, now: float) -> bool:
        """queued -> cancelled; False when it is not queued (any more)."""
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE jobs SET state='cancelled', ended_at=?, note='cancelled while queued'"
                " WHERE id=? AND state='queued'",
                (now, job_id),
            )
            return cur.rowcount == 1

    def settle(
        self,
        job: Job,
        state: str,
        *,
        note: str,
        now: float,
        exit_code: int | None = None,
    ) -> bool:
        """End a stint of ``job`` (as this process last read it): ``state`` is done, failed,
        cancelled, or queued again (its run id kept, so the next start resumes the run)."""
        ran = job.ran_s + (now - job.started_at if job.started_at is not None else 0.0)
        requeue = state == "queued"
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE jobs SET state=?, ran_s=?, exit_code=?, note=?, pid=NULL,"
                " stop_request=NULL, stop_sent_at=NULL, worker_id=?, devices=?,"
                " ended_at=?, queued_at=?, preemptions=preemptions+?"
                " WHERE id=? AND state IN ('running','preempting') AND worker_id IS ?",
                (
                    state, ran, exit_code, note,
                    None if requeue else job.worker_id,
                    None if requeue else format_devices(job.devices),
                    None if requeue else now,
                    now if requeue else job.queued_at,
                    1 if requeue and job.stop_request == "preempt" else 0,
                    job.id, job.worker_id,
                ),
            )  # fmt: skip
            return cur.rowcount == 1

    def adopt(self, job: Job, worker_id: str, note: str) -> bool:
        """Take over a running job whose worker died (its run's supervisor lives on)."""
        with self.transaction() as c:
            cur = c.execute(
                "UPDATE jobs SET worker_id=?, note=? WHERE id=? AND worker_id IS ?"
                " AND state IN ('running','preempting')",
                (worker_id, note, job.id, job.worker_id),
            )
            return cur.rowcount == 1

    # ---- workers --------------------------------------------------------------------------

    def register_worker(
        self, worker_id: str, *, pid: int, kind: str, devices: Sequence[int], now: float
    ) -> None:
        with self.transaction() as c:
            c.execute(
                "INSERT OR REPLACE INTO workers VALUES (?,?,?,?,?,?,?)",
                (worker_id, pid, socket.gethostname(), kind, format_devices(devices), now, now),
            )

    def heartbeat(self, worker_id: str, now: float) -> None:
        with self.transaction() as c:
            c.execute("UPDATE workers SET heartbeat=? WHERE id=?", (now, worker_id))

    def remove_worker(self, worker_id: str) -> None:
        with self.transaction() as c:
            c.execute("DELETE FROM workers WHERE id=?", (worker_id,))

    def workers(self) -> list[WorkerRow]:
        rows = self.conn.execute(
            "SELECT id, pid, host, kind, devices, started_at, heartbeat FROM workers ORDER BY id"
        ).fetchall()
        return [WorkerRow(r[0], r[1], r[2], r[3], _parse_devices(r[4]), r[5], r[6]) for r in rows]
