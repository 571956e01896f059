"""One run record, read once: its attempts, timeline, steps, work lost and checkpoints.

Every reader (the verdict, the telemetry summary, the reports, ``acceptrun top``, the
MLflow export, the operations drill) derives these the same way, from the record only
(run.json, events.jsonl, attempts/*/exit.json), through :class:`RecordView`::

    view = RecordView(RunRecord(path))
    view.timeline()      # launch, first step, last step, end, steps
    view.spans()         # attempts as the events tell them, with their steps
    view.work_lost()     # steps, seconds and device-seconds lost (exit.json "work")

Each file is read at most once per view, and only when asked for (``timeline()`` reads
events.jsonl, not run.json). A view is a snapshot: make a new one to see new events.

The functions :func:`run_timeline`, :func:`read_attempts` and :func:`work_lost` keep their
old signatures for callers that need one figure.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_jsonl
from acceptrun._util.units import finite_number
from acceptrun.record.events import validate_event
from acceptrun.record.liveness import last_sign_of_life
from acceptrun.record.models import LedgerFile, RunState, VerdictFile, record_format
from acceptrun.record.steplog import StepLog
from acceptrun.record.workspace import RunRecord

__all__ = [
    "AttemptSpan",
    "CheckpointHistory",
    "RecordView",
    "attempt_spans",
    "read_attempts",
    "run_timeline",
    "work_lost",
]


@dataclass(slots=True)
class AttemptSpan:
    """One attempt as its events tell it: when it started and ended, and its steps."""

    number: int
    start: float  # unix seconds of attempt_start (workload_start for a standalone run)
    end: float | None = None  # unix seconds of attempt_exit; None while it runs
    outcome: str | None = None  # attempt_exit "outcome"
    steps: list[dict[str, Any]] = field(default_factory=list)
    client: bool = False  # a workload_start event: the client API ran in this attempt


@dataclass(frozen=True, slots=True)
class CheckpointHistory:
    """What the events say about checkpoints (the store itself is checkpoint/store.py)."""

    committed: list[int]  # steps, in commit order (a step saved twice appears twice)
    deleted: list[int]  # steps removed by retention or gc
    quarantined: list[int | None]  # steps set aside after a failed verification
    failed: int  # checkpoint_failed events

    @property
    def last_committed(self) -> int | None:
        return self.committed[-1] if self.committed else None


class RecordView:
    """A read-only view over one run record; see the module docstring."""

    def __init__(self, record: RunRecord | str | Path) -> None:
        self.record = record if isinstance(record, RunRecord) else RunRecord(Path(record))

    # ---- the files, each read once ---------------------------------------------------

    @cached_property
    def raw_state(self) -> dict[str, Any]:
        """run.json as written (RecordError when it is missing or of a newer format)."""
        return self.record.state

    @cached_property
    def state(self) -> RunState:
        return RunState.from_json(self.raw_state, self.record.path / "run.json")

    @cached_property
    def log_events(self) -> list[dict[str, Any]]:
        """Every line of events.jsonl, in file order (a torn or damaged line is skipped).

        In a record of format 2 these are every event but the steps, which are in the
        step log (:attr:`step_log`); a record of format 1 has its steps here too.
        """
        return list(
            read_jsonl(self.record.events_path, damaged=self.damaged_lines, root=self.record.path)
        )

    @cached_property
    def step_log(self) -> StepLog:
        """The run's steps, in chunks of arrays, whatever the format (record/steplog.py)."""
        return StepLog(self.record.path, events=self.log_events)

    @cached_property
    def all_events(self) -> list[dict[str, Any]]:
        """Every event, the steps of the step log included, ordered by time within
        events.jsonl's order. Builds one dict per step: for small runs and old callers;
        a reader of a long run reads :attr:`log_events` and :attr:`step_log`.
        """
        if not self.step_log.segments:
            return self.log_events  # format 1: the steps are in events.jsonl already
        steps = self.step_log.events()
        others = [ev for ev in self.log_events if ev.get("kind") != "step"]
        return list(heapq.merge(others, steps, key=_t_key))

    @cached_property
    def damaged_lines(self) -> list[str]:
        """The lines of events.jsonl that :attr:`all_events` skipped, each saying why."""
        return []  # filled as all_events reads the file

    @cached_property
    def _exit_files(self) -> list[tuple[str, dict[str, Any]]]:
        root = self.record.path / "attempts"
        if not root.is_dir():
            return []
        found = []
        for d in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            data = self.record.read_json(f"attempts/{d.name}/exit.json")
            if isinstance(data, dict):
                record_format(data, d / "exit.json")  # a newer format raises, naming the fix
                found.append((d.name, data))
        return found

    def verdict(self) -> VerdictFile | None:
        """verdict.json, or None before the run was decided."""
        data = self.record.read_json("verdict.json")
        return (
            None if data is None else VerdictFile.from_json(data, self.record.file("verdict.json"))
        )

    def ledger(self) -> LedgerFile | None:
        """ledger.json, or None when it was not built."""
        data = self.record.read_json("ledger.json")
        return None if data is None else LedgerFile.from_json(data, self.record.file("ledger.json"))

    # ---- events ----------------------------------------------------------------------

    def events(self, *kinds: str) -> list[dict[str, Any]]:
        """Events in order, optionally only those of the given kinds.

        Only a request for ``step`` events builds the steps as dicts (see :attr:`all_events`).
        """
        if not kinds:
            return self.all_events
        source = self.all_events if "step" in kinds else self.log_events
        return [ev for ev in source if ev.get("kind") in kinds]

    def event_problems(self) -> list[str]:
        """Damaged lines, and known events that lack a required field (unknown kinds are not)."""
        events = self.log_events  # reads the file, filling damaged_lines
        torn = [
            f"{seg.path}: a torn last record of {seg.torn} bytes (a kill or a full disk mid-write)"
            for seg in self.step_log.torn
        ]
        return [
            *self.damaged_lines, *self.step_log.problems, *torn,
            *(p for ev in events for p in validate_event(ev).problems),
        ]  # fmt: skip

    def steps(self) -> list[dict[str, Any]]:
        """The step events as dicts, by attempt, in the order written (small runs only)."""
        return self.step_log.events()

    def metrics(self) -> dict[str, Any]:
        """Metric name -> the last value recorded for it."""
        return {
            str(ev.get("name")): ev.get("value")
            for ev in self.log_events
            if ev.get("kind") == "metric"
        }

    def per_attempt_metrics(self) -> dict[str, int | None]:
        """Metric name -> its attempt, for the last values that are one attempt's figure.

        A framework's average over the attempt that ran (``per_attempt`` in the event,
        workload/aggregates.py): shown as "attempt N only", never as the run's.
        """
        out: dict[str, int | None] = {}
        for ev in self.log_events:
            if ev.get("kind") != "metric":
                continue
            name = str(ev.get("name"))
            if ev.get("per_attempt"):
                attempt = ev.get("attempt")
                out[name] = attempt if isinstance(attempt, int) else None
            else:
                out.pop(name, None)
        return out

    def last_outcome(self) -> str | None:
        """The outcome of the last attempt_exit event, None before any attempt ended."""
        exits = [ev for ev in self.log_events if ev.get("kind") == "attempt_exit"]
        outcome = exits[-1].get("outcome") if exits else None
        return None if outcome is None else str(outcome)

    # ---- derived ---------------------------------------------------------------------

    def attempts(self) -> list[dict[str, Any]]:
        """The exit.json of each attempt that ended, as written, by attempt number."""
        return [data for _name, data in self._exit_files]

    def timeline(self) -> dict[str, Any]:
        """Launch, first step, last step and end times (unix seconds), and the step count.

        One pass over events.jsonl and one over the step log's ``t`` column: its cost
        does not depend on the step log's layout, a step is never built as a dict.
        """
        launch = end = None
        for ev in self.log_events:
            kind, t = ev.get("kind"), ev.get("t")
            if kind in ("attempt_start", "workload_start") and launch is None:
                launch = t
            elif kind in ("attempt_exit", "workload_end"):
                end = t
        first_step = last_step = None
        steps = 0
        for chunk in self.step_log.chunks():
            if not len(chunk):
                continue
            steps += len(chunk)
            lo, hi = float(chunk.t.min()), float(chunk.t.max())
            first_step = lo if first_step is None else min(first_step, lo)
            last_step = hi if last_step is None else max(last_step, hi)
        return {
            "launch": launch,
            "first_step": first_step,
            "last_step": last_step,
            "end": end,
            "steps": steps,
        }

    def spans(self) -> list[AttemptSpan]:
        """Attempts in start order, from their events (see :func:`attempt_spans`)."""
        return attempt_spans(self.all_events)

    def trajectory(self, key: str = "loss") -> dict[int, tuple[float, int]]:
        """Step -> (value of ``key``, attempt) from the last attempt that logged the step."""
        out: dict[int, tuple[float, int]] = {}
        for ev in self.steps():
            step, value, attempt = ev.get("step"), ev.get(key), int(ev.get("attempt") or 0)
            if not isinstance(step, int) or not isinstance(value, int | float):
                continue
            if step not in out or attempt >= out[step][1]:
                out[step] = (float(value), attempt)
        return out

    def work_lost(self) -> dict[str, Any]:
        """Steps, seconds and device-seconds lost over all attempts (exit.json "work")."""
        return work_lost(self.attempts())

    def checkpoints(self) -> CheckpointHistory:
        """Checkpoints committed, deleted, quarantined and failed, from the events."""
        committed: list[int] = []
        deleted: list[int] = []
        quarantined: list[int | None] = []
        failed = 0
        for ev in self.log_events:
            kind, step = ev.get("kind"), ev.get("step")
            if kind == "checkpoint_commit" and isinstance(step, int):
                old = ev.get("redated_from")  # the same save, stored again under its step
                if old in committed:
                    committed.remove(old)
                committed.append(step)
            elif kind == "checkpoint_delete" and isinstance(step, int):
                if ev.get("redated_to") is None:
                    deleted.append(step)
            elif kind == "checkpoint_quarantine":
                quarantined.append(step if isinstance(step, int) else None)
            elif kind == "checkpoint_failed":
                failed += 1
        return CheckpointHistory(committed, deleted, quarantined, failed)

    def last_sign_of_life(self) -> float | None:
        """Unix seconds of the newest of the lease renewal, last event and last sample."""
        return last_sign_of_life(self.record.path)


def _t_key(ev: dict[str, Any]) -> float:
    t = ev.get("t")
    return float(t) if isinstance(t, int | float) else 0.0


def attempt_spans(events: Iterable[dict[str, Any]]) -> list[AttemptSpan]:
    """Attempts in start order, from attempt_start (workload_start when standalone).

    Only events with a numeric ``t`` count. An attempt whose start is not in the record
    (a truncated record) starts at its first step.
    """
    by_number: dict[int, AttemptSpan] = {}
    for ev in events:
        t = finite_number(ev.get("t"))
        number = ev.get("attempt")
        if t is None or not isinstance(number, int):
            continue
        kind = ev.get("kind")
        a = by_number.get(number)
        if kind == "attempt_start" or (kind == "workload_start" and a is None):
            if a is None:
                a = by_number[number] = AttemptSpan(number, t)
        elif a is None and kind == "step":
            a = by_number[number] = AttemptSpan(number, t)
        if a is None:
            continue
        if kind == "attempt_exit":
            a.end, a.outcome = t, str(ev.get("outcome"))
        elif kind == "step":
            a.steps.append(ev)
        elif kind == "workload_start":
            a.client = True
    return sorted(by_number.values(), key=lambda a: a.start)


def run_timeline(record: RunRecord) -> dict[str, Any]:
    """Launch, first step, last step and end times (unix seconds) from the events."""
    return RecordView(record).timeline()


def read_attempts(record: RunRecord) -> list[dict[str, Any]]:
    """The exit.json of each attempt that ended, by attempt number."""
    return RecordView(record).attempts()


def work_lost(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps (a range: exact, bounded or unknown), seconds and device-seconds lost over
    all attempts, from exit.json "work", with the text every view prints (record/lost.py).
    """
    from acceptrun.record.lost import lost_work

    return lost_work(attempts).to_dict()
