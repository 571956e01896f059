"""Watching one attempt: its events, its progress, and whether it is hung.

The supervisor polls an :class:`AttemptWatch` between its checks of the child. It reads
only what was appended to events.jsonl since the last poll (a seek and a short read),
keeps this attempt's events for the classifier, and answers "how long since progress?":

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from acceptrun._util.durable import loads_json

__all__ = ["AttemptWatch", "Stall"]

CPU_SAMPLE_S = 1.0  # seconds between process-tree CPU samples in black-box mode
CPU_EPSILON_S = 0.05  # CPU seconds per sample below which the tree counts as idle


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

    def poll(self) -> list[dict[str, Any]]:
        """Read newly appended events; returns this attempt's new ones."""
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
        self.events.extend(new)
        return new

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
        elif kind == "step":
            span = ev.get("span")  # a log line every N steps stands for N of them
            self.steps += span if isinstance(span, int) and span > 0 else 1
            step = ev.get("step")
            if isinstance(step, int):
                self.first_step = step if self.first_step is None else self.first_step
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
