"""Is the supervisor of a run record alive? Derived from its lease, never written here.

The process that supervises a run (``acceptrun run``, ``acceptrun resume``) holds a
lease in the run directory, ``supervisor.json`` (written by
:mod:`acceptrun.record.lease`)::

    {"pid": 4242, "started": 1796101234.56, "host": "gpu-7", "role": "supervisor",
     "renewed_at": 1796101300.1, "interval_s": 2.0, "ended_at": null}

A standalone run (a plain ``python train.py`` calling ``acceptrun.init()``) has no
supervisor: its training process holds the lease itself (``role: standalone``), and the
messages below name it as "its process".

A reader asks :func:`supervisor_state`:

- ``ended``: run.json says the run is closed (a verdict was written); its ``liveness``,
  written at close, says who kept it and when it was last alive: nothing else is read;
- ``alive``: on this host, the lease's pid runs and started when the lease says (a pid
  reused by another process started later); on another host, the lease was renewed
  within :data:`STALE_AFTER_S`;
- ``gone``: anything else for a run that is not closed. ``last_sign_of_life`` is the
  newest of the lease's renewal and the last event or telemetry sample.

Readers show a gone supervisor's run as ``interrupted`` (:func:`shown_status`) and leave
run.json alone: only ``acceptrun resume`` (under its lock) writes the record.

>>> supervisor_state(record).state
'gone'
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.confined import open_regular
from acceptrun._util.durable import loads_json, read_bytes_bounded
from acceptrun.record.status import RUN_CLOSED, RUN_OWNED, RunStatus
from acceptrun.record.workspace import now_iso

__all__ = [
    "LEASE_FILE",
    "STALE_AFTER_S",
    "SupervisorLiveness",
    "dead_periods",
    "interrupted_note",
    "interruption",
    "is_live",
    "last_sign_of_life",
    "read_lease",
    "shown_status",
    "status_text",
    "supervisor_state",
]

LEASE_FILE = "supervisor.json"
# Seconds after its last renewal that a lease held on another host counts as lapsed: many
# renewal intervals, so a loaded shared filesystem does not make a live run look dead.
STALE_AFTER_S = 30.0
START_SLACK_S = 1.0  # psutil's create_time rests on the boot time, known to the second
# Statuses in which a supervisor works on the run; its death leaves the run interrupted.
_SUPERVISED = (RunStatus.PREFLIGHT, RunStatus.RUNNING, RunStatus.CLOSING)
# How messages name the process that keeps the record, by SupervisorLiveness.keeper.
_KEEPER_NOUN = {"supervisor": "its supervisor", "standalone": "its process"}
_TAIL_BYTES = 64 * 1024  # the end of events.jsonl / telemetry.jsonl read for the last time


@dataclass(frozen=True, slots=True)
class SupervisorLiveness:
    """What a reader can tell about the supervisor of one record."""

    state: str  # alive | gone | ended
    last_sign_of_life: float | None  # unix seconds; None when nothing was ever recorded
    detail: str  # for messages: why gone, or who is alive
    keeper: str = "supervisor"  # who holds the lease: supervisor, or standalone (the script)

    @property
    def gone(self) -> bool:
        return self.state == "gone"

    @property
    def last_seen_iso(self) -> str:
        return "unknown" if self.last_sign_of_life is None else now_iso(self.last_sign_of_life)

    def to_dict(self) -> dict[str, Any]:
        """For JSON readers (``show --json``, ``report --format json``)."""
        return {
            "state": self.state,
            "last_sign_of_life": self.last_sign_of_life,
            "last_seen": None if self.last_sign_of_life is None else self.last_seen_iso,
            "detail": self.detail,
            "keeper": self.keeper,
        }


def read_lease(run_dir: str | Path) -> dict[str, Any] | None:
    """The lease, or None when there is none or it cannot be read (a torn copy)."""
    try:
        data = loads_json(read_bytes_bounded(Path(run_dir) / LEASE_FILE, root=run_dir))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def supervisor_state(
    record: Any, state: dict[str, Any] | None = None, *, now: float | None = None
) -> SupervisorLiveness:
    """``alive``, ``gone`` or ``ended`` for ``record`` (a RunRecord or a run directory).

    ``state`` is run.json when the caller has read it already.
    """
    run_dir = Path(getattr(record, "path", record))
    if state is None:
        try:
            loaded = loads_json(read_bytes_bounded(run_dir / "run.json", root=run_dir))
        except (OSError, ValueError):
            loaded = {}
        state = loaded if isinstance(loaded, dict) else {}
    status = str(state.get("status"))
    if status in RUN_CLOSED:
        closed = state.get("liveness")
        closed = closed if isinstance(closed, dict) else {}
        seen = closed.get("last_sign_of_life")
        keeper = "standalone" if closed.get("keeper") == "standalone" else "supervisor"
        seen = float(seen) if isinstance(seen, int | float) else None
        return SupervisorLiveness("ended", seen, f"the run is {status}", keeper)
    lease = read_lease(run_dir)
    now = time.time() if now is None else now
    # Who keeps the record: the lease says; without one, a standalone run's own process.
    role = lease.get("role") if lease is not None else state.get("mode")
    keeper = "standalone" if role == "standalone" else "supervisor"
    if lease is None and keeper == "standalone":
        alive, detail = _old_standalone_alive(run_dir, state)
    else:
        alive, detail = _lease_alive(lease, state, now, _KEEPER_NOUN[keeper])
    if alive or (status not in _SUPERVISED and status != RunStatus.INTERRUPTED):
        # created (nothing supervises it yet), failed (a tune sweep): not ours to judge
        return SupervisorLiveness("alive" if alive else "ended", None, detail)
    return SupervisorLiveness("gone", last_sign_of_life(run_dir, lease), detail, keeper)


def is_live(record: Any, state: dict[str, Any]) -> bool:
    """Whether the run is going now: a status its keeper works in (run.json ``state``),
    and the keeper alive by :func:`supervisor_state` (its lease, on this host or
    another). ``top``, the board's pages and its live feeds all ask this."""
    if state.get("status") not in RUN_OWNED:
        return False  # closed, created, interrupted: nothing more to read
    return supervisor_state(record, state).state == "alive"


def _lease_alive(
    lease: dict[str, Any] | None, state: dict[str, Any], now: float, keeper: str
) -> tuple[bool, str]:
    if lease is None:
        # A record written before leases, or in the instant before launch writes one:
        # the pid in run.json, on this host.
        pid = state.get("supervisor_pid")
        host = str(state.get("supervisor") or "").rpartition("@")[2]
        if type(pid) is not int or (host and host != socket.gethostname()):
            return True, "no lease and no local pid to check: assumed alive"
        return _pid_alive(pid, None)
    if lease.get("ended_at") is not None:
        return False, f"{keeper} (pid {lease.get('pid')}) exited without closing the run"
    pid, started = lease.get("pid"), lease.get("started")
    if lease.get("host") != socket.gethostname():
        renewed = lease.get("renewed_at")
        if isinstance(renewed, int | float) and now - renewed < STALE_AFTER_S:
            return True, f"lease on host {lease.get('host')} renewed {now - renewed:.0f} s ago"
        return False, f"its lease on host {lease.get('host')} lapsed"
    if type(pid) is not int:
        return False, "its lease names no pid"
    return _pid_alive(pid, started if isinstance(started, int | float) else None, keeper)


def _old_standalone_alive(run_dir: Path, state: dict[str, Any]) -> tuple[bool, str]:
    """A standalone run recorded before standalone runs held a lease: its process is the
    pid of its ``workload_start`` event, which must have started before that event."""
    host = str(state.get("created_by") or "").rpartition("@")[2]
    start = _first_event(run_dir, "workload_start")
    pid, t = (start or {}).get("pid"), (start or {}).get("t")
    if type(pid) is not int or not isinstance(t, int | float):
        return True, "no lease and no pid recorded yet: assumed alive"
    if host and host != socket.gethostname():
        return True, f"no lease, and its process ran on host {host}: assumed alive"
    return _pid_alive(pid, None, _KEEPER_NOUN["standalone"], started_before=float(t))


def _first_event(run_dir: Path, kind: str) -> dict[str, Any] | None:
    """The first ``kind`` event among the first lines of events.jsonl (None if not there)."""
    try:
        with open_regular(run_dir / "events.jsonl", root=run_dir) as f:
            head = f.read(_TAIL_BYTES)
    except OSError:
        return None
    for line in head.splitlines()[:20]:
        try:
            event = loads_json(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("kind") == kind:
            return event
    return None


def _pid_alive(
    pid: int,
    started: float | None,
    keeper: str = "its supervisor",
    *,
    started_before: float | None = None,
) -> tuple[bool, str]:
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            zombie = proc.status() == psutil.STATUS_ZOMBIE
            created = proc.create_time()
    except psutil.NoSuchProcess:
        return False, f"{keeper} (pid {pid}) is gone"
    except psutil.AccessDenied:
        return True, f"pid {pid} belongs to another user: assumed alive"
    if zombie:
        return False, f"{keeper} (pid {pid}) has exited"
    reused = started is not None and abs(created - started) > START_SLACK_S
    if reused or (started_before is not None and created > started_before + START_SLACK_S):
        return False, f"{keeper} (pid {pid}) is gone; the pid is now another process"
    return True, f"{keeper.removeprefix('its ')} pid {pid}"


def last_sign_of_life(run_dir: str | Path, lease: dict[str, Any] | None = None) -> float | None:
    """The newest of the lease's renewal and the last event and telemetry sample (unix s)."""
    run_dir = Path(run_dir)
    lease = read_lease(run_dir) if lease is None else lease
    times: list[float] = []
    for key in ("renewed_at", "ended_at"):
        value = (lease or {}).get(key)
        if isinstance(value, int | float):
            times.append(float(value))
    for name in ("events.jsonl", "telemetry.jsonl"):
        t = _last_time(run_dir / name)
        if t is not None:
            times.append(t)
    return max(times) if times else None


def _last_time(path: Path) -> float | None:
    """The largest ``t`` among the last lines of a JSON Lines file (its end only: files grow)."""
    try:
        with open_regular(path, root=path.parent) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    best: float | None = None
    for line in tail.splitlines()[-50:]:
        try:
            line_obj = loads_json(line)
            if line_obj.get("kind") == "notify":
                continue  # a delivery (`acceptrun watch` writes them after a death): no sign of life
            t = line_obj.get("t")
        except (ValueError, AttributeError):
            continue  # the first, cut line, or a torn last one
        if isinstance(t, int | float) and (best is None or t > best):
            best = float(t)
    return best


def interruption(record: Any, status: str) -> SupervisorLiveness | None:
    """The liveness of a supervised run whose supervisor is gone; None otherwise (cheap then:
    a closed or never started run reads nothing)."""
    if status not in _SUPERVISED and status != RunStatus.INTERRUPTED:
        return None
    liveness = supervisor_state(record)
    return liveness if liveness.gone else None


def interrupted_note(run_id: str, liveness: SupervisorLiveness) -> str:
    """One line for listings: why the run reads interrupted and how to continue it."""
    return (
        f"{run_id} is interrupted: {liveness.detail}; last sign of life "
        f"{liveness.last_seen_iso}; `acceptrun resume {run_id}` continues it"
    )


def status_text(state: dict[str, Any], supervisor: dict[str, Any] | None) -> str:
    """A report's status line from run.json and :meth:`SupervisorLiveness.to_dict`."""
    if (supervisor or {}).get("state") == "gone":
        seen = (supervisor or {}).get("last_seen") or "unknown"
        who = _KEEPER_NOUN.get(str((supervisor or {}).get("keeper")), "its supervisor")
        return f"interrupted ({who} is gone; last sign of life {seen})"
    return str(state.get("status"))


def shown_status(record: Any, status: str, state: dict[str, Any] | None = None) -> str:
    """The status a reader shows: ``interrupted`` for a supervised run whose supervisor is gone."""
    if status not in _SUPERVISED and status != RunStatus.INTERRUPTED:
        return status
    if supervisor_state(record, state).gone:
        return str(RunStatus.INTERRUPTED)
    return status


def dead_periods(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stretches during which a run had no supervisor: last sign of life -> resume.

    Read from the ``audit`` events of ``acceptrun resume`` that took over an interrupted
    run (their ``interrupted`` field); the cost ledger reports them apart from compute.
    """
    periods = []
    for ev in events:
        gap = ev.get("interrupted") if ev.get("kind") == "audit" else None
        if not isinstance(gap, dict) or not isinstance(ev.get("t"), int | float):
            continue
        since = gap.get("last_sign_of_life")
        start = float(since) if isinstance(since, int | float) else None
        periods.append(
            {
                "attempt": gap.get("attempt"),
                "last_sign_of_life": start,
                "resumed_at": float(ev["t"]),
                "seconds": None if start is None else round(max(0.0, ev["t"] - start), 3),
            }
        )
    return periods
