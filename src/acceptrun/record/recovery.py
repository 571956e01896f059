"""How long each restart took, split into its parts, from the record alone.

A restart is an attempt that ended and the next one that started. From the workload's
end (an injected fault's own time, else its process's end: the attempt's start plus its
duration) to the next attempt's first step, in order:

- ``detect``: the end to the attempt's recorded exit (noticing it, the last reads of its
  logs, the final capture of a watched checkpoint);
- ``backoff``: the restart backoff ``limits.restart_backoff`` asked for;
- ``start``: the rest of the gap to the next attempt's start (the newest checkpoint
  verified, the command started);
- ``set_up``: the next attempt's start to the client's ``workload_start`` (the
  interpreter, the imports; a black box has none: it is in ``first_step``);
- ``restore``: the checkpoint loaded (its ``restored`` event's seconds);
- ``first_step``: the rest, to the first step logged (building the model and the data,
  the step itself).

A warm restart (``limits.warm_restart``, supervisor/standby.py) starts the next attempt
from a standby that already waits in ``run.restore()``: its ``start`` and ``set_up`` are
near zero, and ``mode`` says ``"warm"`` (``"cold"`` otherwise, None in a record older
than the mode; ``cold_why`` says why an attempt of a warm run started cold). ``source``
is where the restore read the state: ``"memory"`` (the memory tier, checkpoint/memtier.py),
``"disk"`` or ``"mirror"`` (None in an older record, or without a restore).

Every part is measured on one machine's clock and never below zero; a part the record
cannot tell is None. ``total`` is the end to the first step: the time a failure cost
beyond the work it threw away (record/lost.py).

>>> r = Restart(1, end_t=10.0, exit_t=10.1, start_t=10.6, backoff_s=0.5, set_up_t=11.6,
...             restore_s=0.2, first_step_t=12.0)
>>> r.parts()["set_up"], r.total
(1.0, 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from acceptrun.record.workspace import RunRecord

__all__ = ["PARTS", "Restart", "restarts"]

PARTS = ("detect", "backoff", "start", "set_up", "restore", "first_step")


@dataclass(frozen=True, slots=True)
class Restart:
    """Attempt ``attempt`` ended and the next one started: the times that tell how fast."""

    attempt: int
    end_t: float | None  # unix s: the workload's end (an injected fault's, or its exit)
    exit_t: float  # the attempt's recorded exit
    start_t: float  # the next attempt's start
    backoff_s: float | None
    set_up_t: float | None  # the next attempt's workload_start (the client's)
    restore_s: float | None
    first_step_t: float | None
    mode: str | None = None  # "warm" (a standby took over) or "cold"; None: not recorded
    cold_why: str | None = None  # why a run with warm restarts started this one cold
    source: str | None = None  # where the state came from: "memory", "disk" or "mirror"

    def parts(self) -> dict[str, float | None]:
        """Seconds per part (:data:`PARTS`), None where the record does not tell."""
        backoff = self.backoff_s or 0.0
        ready = self.set_up_t if self.set_up_t is not None else self.start_t
        restore = self.restore_s or 0.0
        return {
            "detect": None if self.end_t is None else _pos(self.exit_t - self.end_t),
            "backoff": self.backoff_s,
            "start": _pos(self.start_t - self.exit_t - backoff),
            "set_up": None if self.set_up_t is None else _pos(self.set_up_t - self.start_t),
            "restore": self.restore_s,
            "first_step": None
            if self.first_step_t is None
            else _pos(self.first_step_t - ready - restore),
        }

    @property
    def total(self) -> float | None:
        """The workload's end (or its recorded exit) to the next attempt's first step."""
        if self.first_step_t is None:
            return None
        return _pos(self.first_step_t - (self.end_t if self.end_t is not None else self.exit_t))


def restarts(record: RunRecord) -> list[Restart]:
    """Every restart of the run, oldest first (a resume by hand counts too)."""
    kinds = ("attempt_exit", "attempt_start", "restart", "workload_start", "restored",
             "fault_injected")  # fmt: skip
    by: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in kinds}
    for ev in record.events(*kinds):
        n = ev.get("attempt")
        if isinstance(n, int):
            by[ev["kind"]].setdefault(n, ev)  # an attempt's first of each kind
    out = []
    for n, ended in sorted(by["attempt_exit"].items()):
        nxt = by["attempt_start"].get(n + 1)
        if nxt is None:
            continue
        restart, setup = by["restart"].get(n + 1), by["workload_start"].get(n + 1)
        restored, fault = by["restored"].get(n + 1), by["fault_injected"].get(n)
        out.append(
            Restart(
                attempt=n,
                end_t=float(fault["t"]) if fault is not None else _ended(ended),
                exit_t=float(ended["t"]),
                start_t=float(nxt["t"]),
                backoff_s=None if restart is None else _num(restart.get("backoff_s")),
                set_up_t=None if setup is None else float(setup["t"]),
                restore_s=None if restored is None else _num(restored.get("seconds")),
                first_step_t=_first_step_t(record, n + 1),
                mode=_text(nxt.get("start_mode")),
                cold_why=_text(nxt.get("cold_why")),
                source=None if restored is None else _text(restored.get("source")),
            )
        )
    return out


def _ended(exit_event: dict[str, Any]) -> float | None:
    """The attempt's process end: its start plus its duration (exit.json's fields)."""
    duration = _num(exit_event.get("duration_s"))
    try:
        started = datetime.fromisoformat(str(exit_event.get("started_at"))).timestamp()
    except ValueError:
        return None
    return None if duration is None else started + duration


def _first_step_t(record: RunRecord, attempt: int) -> float | None:
    from acceptrun.record.steplog import StepLog

    for chunk in StepLog(record.path).chunks(1024, attempt=attempt):
        if len(chunk.t):
            return float(chunk.t[0])
    return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _pos(seconds: float) -> float:
    return max(0.0, round(seconds, 3))
