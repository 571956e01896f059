"""``acceptrun watch``: tell someone when a run's supervisor is gone.

A supervisor cannot report its own death, and its notifier dies with it. The process
that sees it is one that outlives it: ``acceptrun watch`` follows one or more workspaces
and, every ``--every`` seconds, asks each run that is not closed whether its supervisor
is alive (:func:`acceptrun.record.liveness.supervisor_state`: the lease's pid and start
time on this host, its renewal on another). A gone supervisor is a ``supervisor_gone``
condition for the run's own ``[notify]`` targets, delivered and recorded like any other
(a ``notify`` event in the dead run's record, ``by: "watch"``), once per supervisor.

Why a command of its own, not the queue worker or the board: both run only when someone
uses them (a run started by hand has neither), while a watcher is cheap (it reads each
run's run.json, and the lease of those not closed) and can run anywhere that sees the workspace,
under systemd, cron (``--once``) or tmux, beside runs started in any way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from acceptrun._util.durable import loads_json, read_bytes_bounded
from acceptrun.errors import AcceptrunError
from acceptrun.notify.conditions import supervisor_gone
from acceptrun.notify.notifier import Dispatcher
from acceptrun.notify.secrets import notify_spec_of
from acceptrun.record.liveness import read_lease, supervisor_state
from acceptrun.record.status import RUN_CLOSED
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.load import load_spec

__all__ = ["Watcher"]

log = logging.getLogger("acceptrun")


class Watcher:
    """Check the runs of some workspaces for gone supervisors; deliver each one once."""

    def __init__(self, workspaces: Sequence[Workspace]) -> None:
        self.workspaces = list(workspaces)
        self._told: set[str] = set()  # run_id|condition key handed to a dispatcher
        self._quiet: set[str] = set()  # runs without [notify] targets: not read again
        self._dispatchers: list[Dispatcher] = []

    def check(self) -> int:
        """One pass over every workspace; the number of conditions handed over."""
        found = 0
        for ws in self.workspaces:
            runs = ws.runs_dir
            if not runs.is_dir():
                continue
            for run_dir in sorted(runs.iterdir()):
                if run_dir.name.startswith(".") or run_dir.name in self._quiet:
                    continue
                try:
                    found += self._check_run(run_dir)
                except (OSError, ValueError, AcceptrunError) as exc:
                    log.warning("watch: %s could not be checked: %s", run_dir, exc)
        return found

    def _check_run(self, run_dir: Path) -> int:
        try:
            state = loads_json(read_bytes_bounded(run_dir / "run.json"))
        except (OSError, ValueError):
            return 0  # being created, or damaged: `acceptrun ls` says which
        if not isinstance(state, dict) or str(state.get("status")) in RUN_CLOSED:
            return 0
        liveness = supervisor_state(run_dir, state)
        if not liveness.gone or liveness.keeper != "supervisor":
            return 0
        lease = read_lease(run_dir) or {}
        since = lease.get("renewed_at") or liveness.last_sign_of_life
        if not isinstance(since, int | float):
            return 0
        record = RunRecord(run_dir)
        condition = supervisor_gone(record.run_id, run_dir, since=float(since),
                                    pid=lease.get("pid"), detail=liveness.detail)  # fmt: skip
        told = f"{record.run_id}|{condition.key}"
        if told in self._told:
            return 0
        self._told.add(told)
        spec = load_spec(record.spec_path)
        notify = notify_spec_of(record, spec)
        if not notify.enabled:
            self._quiet.add(run_dir.name)
            return 0
        dispatcher = Dispatcher(record, notify, name=spec.name, by="watch")
        if not any(t.wants("supervisor_gone") for t in dispatcher.targets):
            dispatcher.close(0)
            self._quiet.add(run_dir.name)
            return 0
        log.info("watch: run %s: its supervisor is gone; telling %s", record.run_id,
                 ", ".join(t.name for t in dispatcher.targets if t.wants("supervisor_gone")))  # fmt: skip
        dispatcher.submit(condition)
        self._dispatchers.append(dispatcher)
        return 1

    def settle(self, timeout_s: float) -> None:
        """Wait for the deliveries under way (each dispatcher's own retries), then close them."""
        deadline = time.monotonic() + timeout_s
        for dispatcher in self._dispatchers:
            dispatcher.close(max(0.0, deadline - time.monotonic()))
        self._dispatchers.clear()

    def reap(self) -> None:
        """Close the dispatchers that have nothing left to deliver."""
        keep = []
        for dispatcher in self._dispatchers:
            if dispatcher.wait(0):
                dispatcher.close(0)
            else:
                keep.append(dispatcher)
        self._dispatchers = keep

    def run(self, every_s: float, stop: threading.Event | None = None) -> None:
        """Check every ``every_s`` seconds until ``stop`` is set (or forever)."""
        stop = stop or threading.Event()
        while True:
            self.check()
            self.reap()
            if stop.wait(every_s):
                self.settle(30.0)
                return
