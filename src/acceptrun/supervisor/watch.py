"""Watching one attempt: its events, its progress, and whether it is hung.

The supervisor polls an :class:`AttemptWatch` between its checks of the child. It reads
only what was appended since the last poll: events.jsonl (a seek and a short read) and the
attempt's step log (record/steplog.py's :class:`StepTail`, new records as arrays). Memory
does not grow with steps: the steps are folded into running figures (count, first and
last step, the last step as one dict, step-time totals), and :attr:`AttemptWatch.events`
keeps this attempt's events but steps, heartbeats and metrics (what the classifier, the
lost-work count and the checkpoint watcher read: attempt_start, workload_end, stopped,
diverged, xid, checkpoint_commit, shard_commit, ...). It answers "how long since progress?":

- with the client API, progress is a step event; the client's heartbeat thread says
  what the loop is doing meanwhile (``phase``: step, data_wait, ...), which tells a data
  stall (waiting for a batch) from a hang (stuck in a step, e.g. a collective);
- in black-box mode (no client), progress is new output in the attempt's logs or CPU
  time used by the process tree (sampled at most once a second);
- a black box whose steps are read from its output or TensorBoard files
  (``progress.pattern``/``progress.tensorboard``, ``steps_only``): progress is a step
  event, as with the client; other output and CPU use are not progress (a loop that
  spins without finishing a step is hung).

The client's clock starts when it attaches (``workload_start``) and stops when the
workload says it ended (rank 0's ``workload_end``): what follows is the interpreter's
exit (torch's teardown takes seconds on a busy machine), not a step that is late. The
supervisor then waits for the exit, bounded by the grace period (:attr:`AttemptWatch.ended_t`,
supervisor/stops.py's ``Hang``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from acceptrun._util.durable import loads_json
from acceptrun.record.steplog import StepChunk, StepLog, StepTail

__all__ = ["RECENT_STEPS", "AttemptWatch", "Stall"]

CPU_SAMPLE_S = 1.0  # seconds between process-tree CPU samples in black-box mode
CPU_EPSILON_S = 0.05  # CPU seconds per sample below which the tree counts as idle
# Kinds not kept in AttemptWatch.events: one per step or per few seconds, and read by no
# part of the supervisor once folded into the watch's figures (the phase, the steps).
UNKEPT = frozenset({"step", "heartbeat", "metric"})
# Step events the checkpoint watcher may date a file by (checkpoint.watch): the newest
# step read before the file's mtime is among the last few polls' steps.
RECENT_STEPS = 4096
SCAN_CHUNK = 1 << 16  # records per chunk when the watch reads its step log back (~3 MB)


@dataclass(frozen=True, slots=True)
class Stall:
    """No progress for ``seconds``: a hang or a data stall, with the evidence."""

    kind: str  # "hang" | "data_stall"
    seconds: float
    evidence: str


@dataclass
class AttemptWatch:
    """Incremental reader of one attempt's events plus its progress clock."""

    events_path: Path
    attempt: int
    logs: tuple[Path, ...]
    pid: int
    offset: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    client: bool = False  # a workload_start event arrived: the client API is in use
    steps_only: bool = False  # steps come from the script's output (supervisor/progress.py)
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    last_loss: Any = None
    last_checkpoint: int | None = None
    last_checkpoint_t: float | None = None
    ended_t: float | None = None  # monotonic s when rank 0's workload_end arrived
    end_status: str | None = None  # its status ("ok", "error: ...")
    # For the live telemetry (Prometheus): the newest step event and attempt totals (s).
    last_step_event: dict[str, Any] | None = None
    step_time_total: float = 0.0
    data_wait_total: float = 0.0
    _progress_t: float = field(default_factory=time.monotonic)
    _phase: tuple[str, float] = ("startup", 0.0)
    _log_size: int = -1
    _cpu: float = -1.0
    _cpu_t: float = 0.0
    _partial: bytes = b""
    first_step_t: float | None = None  # unix s of the attempt's first step
    keep_recent: int = 0  # step events kept in :attr:`recent_steps` (checkpoint.watch)
    steps_seen: int = 0  # step events read (records, not spans): recent_steps' positions
    recent_steps: deque[dict[str, Any]] = field(default_factory=deque)
    _tail: StepTail | None = None

    def __post_init__(self) -> None:
        self._tail = StepTail(self.events_path.parent, self.attempt)
        self.recent_steps = deque(maxlen=self.keep_recent or 1)

    def kept_events(self) -> list[dict[str, Any]]:
        """The kept events, then the newest step: what the classifier reads."""
        last = self.last_step_event
        return [*self.events, last] if last is not None else list(self.events)

    def step_window(self) -> tuple[int, list[dict[str, Any]]]:
        """(step events read so far, the last :attr:`keep_recent` of them, oldest first).

        What the checkpoint watcher dates a file by (supervisor/external.py): the n-th
        step event read is ``window[1][n - (window[0] - len(window[1]))]``.
        """
        return self.steps_seen, list(self.recent_steps) if self.keep_recent else []

    def step_t(self, step: int) -> float | None:
        """Unix s of this attempt's last step event ``step``, read back from the step log."""
        import numpy as np

        found: float | None = None
        for chunk in StepLog(self.events_path.parent).chunks(SCAN_CHUNK, attempt=self.attempt):
            hit = np.flatnonzero(chunk.step == step)
            if hit.size:
                found = float(chunk.t[hit[-1]])
        return found

    def poll(self) -> list[dict[str, Any]]:
        """Read newly appended events and steps; returns this attempt's new events.

        New steps come back as one dict, the newest (:attr:`last_step_event`), after the
        other new events: the watch never builds a dict per step.
        """
        new = self._poll_events()
        if self._tail is not None:
            chunks = self._tail.poll()
            if chunks:
                for chunk in chunks:
                    self._observe_chunk(chunk)
                if self.last_step_event is not None:
                    new.append(self.last_step_event)
        return new

    def _poll_events(self) -> list[dict[str, Any]]:
        try:
            with open(self.events_path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for its end
        new = []
        for raw in lines:
            try:
                ev = loads_json(raw)
            except ValueError:  # not JSON, not UTF-8, too deep
                continue
            if not isinstance(ev, dict) or ev.get("attempt") != self.attempt:
                continue
            new.append(ev)
            self._observe(ev)
            if ev.get("kind") not in UNKEPT:
                self.events.append(ev)
        return new

    def _observe_chunk(self, chunk: StepChunk) -> None:
        """Fold new step records (one attempt, in order) into the figures, vectorized."""
        import numpy as np

        n = len(chunk)
        if not n:
            return
        span = chunk.values.get("span")
        if span is None:
            self.steps += n
        else:  # a log line every N steps stands for N of them (a whole, positive N)
            whole = np.isfinite(span) & (span > 0) & (span == np.floor(span))
            self.steps += int(np.where(whole, span, 1.0).sum())
        if self.first_step is None:
            self.first_step = int(chunk.step[0])
            self.first_step_t = float(chunk.t[0])
        self.last_step = int(chunk.step[-1])
        loss = chunk.present.get("loss")
        if loss is not None and loss.any():
            i = int(np.flatnonzero(loss)[-1])
            v = float(chunk.values["loss"][i])
            self.last_loss = v  # a NaN as a float, as json.loads reads an event's NaN
        st = chunk.values.get("step_time")
        if st is not None:
            timed = np.isfinite(st)
            self.step_time_total += float(st[timed].sum())
            wait = chunk.values.get("data_wait")
            if wait is not None:
                w = wait[timed]
                self.data_wait_total += float(w[np.isfinite(w)].sum())
        keep = self.keep_recent
        last = _rows(chunk, max(1, min(n, keep)))
        if keep:
            self.recent_steps.extend(last)
        self.steps_seen += n
        self.last_step_event = last[-1]
        self._progress_t = time.monotonic()

    def _observe(self, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        if kind == "workload_start":
            self.client = True
            # The client's steps are the progress from now on: its clock starts here, not
            # at the black box's last CPU sample (up to CPU_SAMPLE_S old).
            self._progress_t = time.monotonic()
        elif kind == "workload_end" and ev.get("rank", 0) == 0:
            # The run's end, told by rank 0 (another rank's workload_end is its own error,
            # while the others may still be stuck).
            self.ended_t = time.monotonic()
            self.end_status = str(ev.get("status"))
        elif kind == "step":  # a step that is no record (a step that is not an integer)
            self.steps_seen += 1
            if self.keep_recent:
                self.recent_steps.append(ev)
            span = ev.get("span")  # a log line every N steps stands for N of them
            self.steps += span if isinstance(span, int) and span > 0 else 1
            step = ev.get("step")
            if isinstance(step, int):
                if self.first_step is None:
                    self.first_step, self.first_step_t = step, ev.get("t")
                self.last_step = step
            self.last_loss = ev.get("loss", self.last_loss)
            self._progress_t = time.monotonic()
            self.last_step_event = ev
            if isinstance(ev.get("step_time"), int | float):
                self.step_time_total += ev["step_time"]
                wait = ev.get("data_wait")
                self.data_wait_total += wait if isinstance(wait, int | float) else 0.0
        elif kind == "heartbeat":
            phase = str(ev.get("phase"))
            self._phase = (phase, float(ev.get("phase_s") or 0.0))
        elif kind == "checkpoint_commit":
            self.last_checkpoint = ev.get("step")
            self.last_checkpoint_t = ev.get("t")

    def stalled(self, window: float) -> Stall | None:
        """A :class:`Stall` when nothing progressed for ``window`` seconds, else None.

        Never once the workload said it ended (:attr:`ended_t`): no step is due any more.
        """
        if self.ended_t is not None:
            return None
        now = time.monotonic()
        if not self.client and not self.steps_only:
            self._black_box_progress(now)
        idle = now - self._progress_t
        if idle < window:
            return None
        where = (
            "no step"
            if self.client
            else "no step line"
            if self.steps_only
            else "no output and no CPU use"
        )
        last = f"; last step {self.last_step}" if self.last_step is not None else "; no step yet"
        phase, phase_s = self._phase
        if self.client and phase == "data_wait":
            return Stall(
                "data_stall",
                idle,
                f"{where} for {idle:.0f}s, waiting for data for {phase_s:.0f}s{last}",
            )
        detail = f", stuck in phase '{phase}' for {phase_s:.0f}s" if self.client else ""
        return Stall("hang", idle, f"{where} for {idle:.0f}s{detail}{last}")

    def _black_box_progress(self, now: float) -> None:
        size = sum(p.stat().st_size for p in self.logs if p.exists())
        if size != self._log_size:
            self._log_size = size
            self._progress_t = now
        if now - self._cpu_t < CPU_SAMPLE_S:
            return
        self._cpu_t = now
        cpu = _tree_cpu_seconds(self.pid)
        if cpu is not None and cpu - self._cpu > CPU_EPSILON_S:
            self._progress_t = now
        if cpu is not None:
            self._cpu = cpu


def _rows(chunk: StepChunk, n: int) -> list[dict[str, Any]]:
    """The last ``n`` rows of a chunk as step events."""
    tail = StepChunk(
        chunk.attempt, chunk.step[-n:], chunk.t[-n:],
        {k: v[-n:] for k, v in chunk.values.items()},
        {k: v[-n:] for k, v in chunk.present.items()}, chunk.constants,
    )  # fmt: skip
    return tail.events()


def _tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and its descendants (None if it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += (
            t.user
            + t.system
            + getattr(t, "children_user", 0.0)
            + getattr(t, "children_system", 0.0)
        )
    return total
