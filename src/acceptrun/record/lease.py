"""The lease of a run: who keeps the record, renewed while that process lives.

The process that keeps a run's record writes ``supervisor.json`` in the run directory
(pid, process start time, host, role) and renews it every :data:`RENEW_S` seconds from a
thread of its own; :mod:`acceptrun.record.liveness` reads it, and shows a run whose
keeper is gone as ``interrupted``, with its last sign of life. The keeper is the
supervisor (``acceptrun run``, ``acceptrun resume``: role ``supervisor``) or, for a plain
``python train.py`` that called ``acceptrun.init()``, the training process itself (role
``standalone``): the OOM killer, a node reboot or ``kill -9`` then leaves a record that
says so, instead of "running" for ever.

A process forked from the keeper (a data-loader worker, ``os.fork()``) neither renews nor
ends the lease: its copy lets go of it (:func:`os.register_at_fork`).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from acceptrun._util.durable import write_json_atomic
from acceptrun.errors import UserError
from acceptrun.record.liveness import LEASE_FILE
from acceptrun.record.workspace import RunRecord

__all__ = [
    "RENEW_S",
    "SupervisorLease",
    "end_lease",
    "process_start_time",
    "start_lease",
]

RENEW_S = 2.0  # seconds between lease renewals: one small atomic write each


def process_start_time(pid: int | None = None) -> float:
    """The process's start time (unix seconds, psutil's create_time): a pid plus this
    names one process, not whichever reuses the pid later."""
    import psutil

    return float(psutil.Process(os.getpid() if pid is None else pid).create_time())


class SupervisorLease:
    """``supervisor.json`` of one run, renewed every :data:`RENEW_S` s while held.

    ``role`` is ``supervisor`` or ``standalone`` (the training process keeps its own
    record); readers name the process accordingly.
    """

    def __init__(
        self, record: RunRecord, *, interval_s: float = RENEW_S, role: str = "supervisor"
    ) -> None:
        self.record = record
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._body = {
            "pid": os.getpid(),
            "started": process_start_time(),
            "host": socket.gethostname(),
            "role": role,
            "interval_s": interval_s,
            "ended_at": None,
        }
        self.failures = 0  # renewals that could not be written (a full disk): logged, not fatal
        # One write at a time; the process's exit waits for one in flight, which would
        # otherwise leave its temporary file behind (the renewing thread is a daemon).
        self._writing = threading.Lock()

    @property
    def path(self) -> Path:
        return self.record.file(LEASE_FILE)

    def start(self) -> None:
        """Write the lease now (a reader sees it at once), then renew it on a thread."""
        self._write()
        atexit.register(self._quiesce)
        self._thread = threading.Thread(target=self._renew, name="acceptrun-lease", daemon=True)
        self._thread.start()

    def _write(self, **extra: Any) -> None:
        body = {**self._body, "renewed_at": round(time.time(), 3), **extra}
        with self._writing:
            try:
                write_json_atomic(self.path, body)
            except (OSError, UserError) as exc:  # UserError: disk full or read-only
                # Background work never kills the run: a reader then sees an older renewal.
                self.failures += 1
                if self.failures == 1:
                    print(f"acceptrun: could not renew {self.path}: {exc}", file=sys.stderr)

    def _renew(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._stop.is_set():
                self._write()

    def _quiesce(self) -> None:
        """At exit: no new renewal, and the one in flight finishes (and cleans up)."""
        self._stop.set()
        with self._writing:
            pass

    def end(self) -> None:
        """Stop renewing and mark the lease ended (the keeper exits on purpose)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._write(ended_at=round(time.time(), 3))
        atexit.unregister(self._quiesce)

    def _forked(self) -> None:
        """In a forked child: this copy is not the keeper; it never writes the lease."""
        self._stop.set()
        self._thread = None
        self._writing = threading.Lock()  # the parent's thread may have held it at the fork
        atexit.unregister(self._quiesce)


_held: dict[Path, SupervisorLease] = {}  # run directory -> the lease this process holds
_held_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _held_lock
    _held_lock = threading.Lock()
    for lease in _held.values():
        lease._forked()
    _held.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def start_lease(record: RunRecord, *, role: str = "supervisor") -> SupervisorLease:
    """Take the run's lease for this process (``acceptrun run``, ``acceptrun resume``, a
    standalone run's ``acceptrun.init()``).

    Held until :func:`end_lease` (called by the close of the run); a lease this process
    already holds for the record is renewed, not doubled.
    """
    key = record.path.resolve()
    with _held_lock:
        lease = _held.get(key)
        if lease is None:
            lease = _held[key] = SupervisorLease(record, role=role)
            lease.start()
    return lease


def end_lease(record: RunRecord) -> None:
    """Mark the run's lease ended, if this process holds it (no-op otherwise)."""
    with _held_lock:
        lease = _held.pop(record.path.resolve(), None)
    if lease is not None:
        lease.end()
