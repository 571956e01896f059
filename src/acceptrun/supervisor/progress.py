"""Progress of a script without the client API: step events from its logs and TensorBoard files.

A :class:`ProgressReader` polls on a thread of its own (:meth:`ProgressReader.start`),
every 0.25 s. It reads what the attempt appended to ``attempts/<n>/stdout.log`` and
``stderr.log`` since the last poll (the output tee writes them; a seek and a short read)
and matches each line against ``progress.pattern``; it reads the TensorBoard event files
under ``progress.tensorboard`` incrementally (tensorboard's own ``EventFileLoader``, which
remembers where it stopped). Each new step becomes a ``step`` event in events.jsonl, the
event the client writes, with ``"source": "log"`` or ``"tensorboard"``, so hang
detection, divergence, lost work, the time split, the report's charts and ``acceptrun
top`` read it without knowing where it came from.

Step time is the time between two step lines divided by the steps between them; a line
every 10 steps gives an event with ``span = 10`` (the steps it stands for) and the step
time of one step. Lines read in one poll share the time since the previous step evenly,
so a step time is never finer than the poll (0.25 s) over the lines read together. The
first step of an attempt has no step time (nothing before it to measure from). A step 0
line with no value but a total (a progress bar's ``0/300``, drawn before the first step
of every attempt) is no step: see :func:`_counter_at_zero`. For
TensorBoard the event's own ``wall_time`` is used.

A loss that is NaN/inf or above ``limits.max_loss`` writes a ``diverged`` event, as the
client does, and :meth:`ProgressReader.poll` returns it: the supervisor then kills the
workload at once (a black box asked to stop might save the diverged state as its newest
checkpoint).

Nothing a workload prints can stop the supervisor: the pattern runs on RE2 (linear time,
the GIL released while it matches: _util/userregex.py), the supervisor's poll loop (stop
requests, wall time) never waits on this thread, and each poll's work is bounded: at most
:data:`READ_MAX` bytes of a log (older unread output is skipped, and a warning says so),
each line cut at :data:`_MAX_LINE` bytes, and :data:`POLL_BUDGET_S` seconds of matching
(the lines left wait for the next poll).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.userregex import UserPattern, compile_user_pattern
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.axis import StepAxis
from acceptrun.supervisor.counter import COUNTER_GROUPS, StepClock
from acceptrun.supervisor.process import Arrivals
from acceptrun.workload.contract import divergence

__all__ = ["ProgressReader", "match_line"]

TB_POLL_S = 1.0  # seconds between scans of the TensorBoard directory (a directory walk)
POLL_S = 0.25  # seconds between the reader thread's polls
READ_MAX = 1 << 20  # bytes read from one log per poll; unread output beyond it is skipped
POLL_BUDGET_S = 0.5  # seconds of matching per poll; the lines left wait for the next poll
RECENT_STEPS = 4096  # steps kept with the time they were reported by, to date saves by
LINES_WAIT_S = 5.0  # seconds a save's dating waits for the lines that arrived before it
_ARRIVED = "\0arrived"  # a step's first line's arrival, carried beside its values
FINAL_BUDGET_S = 2.0  # seconds of matching at the attempt's end; the lines left are dropped
STOP_JOIN_S = 30.0  # hang guard on the thread's end: one poll is budget + one line's match
_NON_FINITE = re.compile(r"\b(?:nan|inf(?:inity)?)\b", re.I)
_MAX_LINE = 64 * 1024  # bytes: a longer "line" (a progress bar without newlines) is cut
_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass
class _LogTail:
    """New complete lines of one growing log file, each with the time it arrived."""

    path: Path
    offset: int = 0
    arrivals: Arrivals | None = None  # when the tee read each chunk (supervisor/process.py)
    partial: bytes = b""
    skipped: int = 0  # bytes never read: written faster than the reader reads
    cut: bool = False  # the next read starts inside a line (after a skip): drop its head
    pending: deque[tuple[str, float | None]] = field(default_factory=deque)  # not matched yet
    read_at: float = 0.0  # unix s: every chunk the tee read before it was in the last read

    def lines(self, final: bool = False) -> list[tuple[str, float | None]]:
        """New complete lines, from at most :data:`READ_MAX` bytes of the log, each with
        the unix time the tee read its end (None where not known)."""
        self.read_at = time.time() if self.arrivals is None else self.arrivals.read_time()
        try:
            with open(self.path, "rb") as f:
                unread = os.fstat(f.fileno()).st_size - self.offset
                if unread > READ_MAX:
                    # Faster than it is read: skip to the newest READ_MAX bytes, so neither
                    # memory nor a poll's time grows with what a workload prints.
                    self.skipped += unread - READ_MAX + len(self.partial)
                    self.offset += unread - READ_MAX
                    self.partial, self.cut = b"", True
                f.seek(self.offset)
                data = f.read(READ_MAX)
        except FileNotFoundError:
            return []
        base = self.offset - len(self.partial)  # the file offset of data's first byte
        self.offset += len(data)
        data = self.partial + data
        # \r ends a line too: progress bars (tqdm) redraw one line with carriage returns.
        parts, start = [], 0
        for m in _LINE_END.finditer(data):
            parts.append((data[start : m.start()], base + m.end()))
            start = m.end()
        rest = data[start:]
        if self.cut:  # the tail of a skipped line is no line
            self.cut = not parts
            if not parts:
                self.skipped += len(rest)
                return []
            self.skipped += len(parts.pop(0)[0])
        if final or len(rest) > _MAX_LINE:
            parts.append((rest, base + len(data)))
            rest = b""
        self.partial = rest
        return [
            (p[:_MAX_LINE].decode("utf-8", errors="replace"), self._arrival(end))
            for p, end in parts
            if p
        ]

    def _arrival(self, end: int) -> float | None:
        return None if self.arrivals is None else self.arrivals.time_of(end)


def match_line(pattern: UserPattern, line: str) -> dict[str, Any] | None:
    """Step and values from one line, or None when it is not a step line.

    >>> rx = compile_user_pattern(r"iter (?P<step>\\d+): loss (?P<loss>\\S+)", where="doc")
    >>> match_line(rx, "iter 7: loss 0.5")
    {'step': 7, 'loss': 0.5}
    """
    m = None
    if _NON_FINITE.search(line):
        # "loss nan" against a number group such as [0-9.eE+-]+: a diverged step must not
        # go unseen. Match with the words as zeros of the same length, read the real text.
        m = pattern.search(_NON_FINITE.sub(lambda w: "0" * len(w.group()), line))
    m = m or pattern.search(line)
    if m is None:
        return None
    # By span, not by text: a match against the zeroed line reads the real line's words.
    spans = {name: m.span(index) for name, index in pattern.groupindex.items()}
    groups = {name: None if a < 0 else line[a:b] for name, (a, b) in spans.items()}
    out: dict[str, Any] = {}
    for name in COUNTER_GROUPS:  # where the line is: a step, or an epoch and a batch
        text = groups.get(name)
        if text is None:
            continue
        try:
            out[name] = float(text) if name == "epoch" else int(text)
        except ValueError:
            return None
    if not out.keys() & {"step", "batch", "iter", "epoch"}:
        return None
    for name, text in groups.items():
        if name in COUNTER_GROUPS or text is None:
            continue
        try:
            value = float(text.strip().rstrip(",;"))
        except ValueError:
            continue  # a group that is not a number (a phase name) is not a value
        out[name] = int(value) if name == "total_steps" and math.isfinite(value) else value
    return out


@dataclass
class ProgressReader:
    """Turns one attempt's output lines and TensorBoard scalars into step events."""

    record: RunRecord
    spec: RunSpec
    attempt: int
    stdout: Path
    stderr: Path
    say: Any = None  # callable(str) for a warning, or None
    workdir: Path | None = None  # where progress.tensorboard is read; None: the spec's workdir
    axis: StepAxis | None = None  # the run's step of each reported step (supervisor/axis.py)
    arrivals: Mapping[Path, Arrivals] | None = None  # the tee's read times (ChildProcess)
    last_step: int | None = None
    last_t: float | None = None
    diverged: dict[str, Any] | None = None
    unknown_after: int | None = None  # progress unknown after this step: lines dropped
    _tails: list[_LogTail] = field(default_factory=list)
    _pattern: UserPattern | None = None
    _last_poll: float = field(default_factory=time.time)
    _tb: _TensorBoard | None = None
    _thread: threading.Thread | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _skip_warned: bool = False
    _clocks: list[StepClock] = field(default_factory=list)  # one per log: its own counter
    # The newest steps written, each with the time it is known to have been reported by
    # (a line's arrival, a scalar's own time): what the checkpoint watcher dates a save by.
    _recent: deque[tuple[float, dict[str, Any]]] = field(
        default_factory=lambda: deque(maxlen=RECENT_STEPS)
    )
    _newest: int | None = None  # the newest step matched, emitted or not yet
    _read_through: float = 0.0  # unix s: every line that arrived before it is in _log_steps
    _progressed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        prog = self.spec.progress
        if prog.pattern is not None:
            self._pattern = compile_user_pattern(prog.pattern, where="progress.pattern")
            arrivals = self.arrivals or {}
            if prog.stream in ("stdout", "both"):
                self._tails.append(
                    _LogTail(self.stdout, _size(self.stdout), arrivals.get(self.stdout))
                )
            if prog.stream in ("stderr", "both"):
                self._tails.append(
                    _LogTail(self.stderr, _size(self.stderr), arrivals.get(self.stderr))
                )
            self._clocks = [
                StepClock(
                    epoch_length=prog.epoch_length, first_epoch=prog.first_epoch, warn=self._told
                )
                for _ in self._tails
            ]
        if prog.tensorboard is not None:
            root = Path(self.workdir or self.spec.workdir_path) / prog.tensorboard
            self._tb = _TensorBoard.open(root, dict(prog.tags), self._warn, self.axis)

    @property
    def active(self) -> bool:
        return bool(self._tails) or self._tb is not None

    def _warn(self, message: str, **fields: Any) -> None:
        self.record.event(
            "progress_warning", sync=True, attempt=self.attempt, message=message, **fields
        )
        if self.say is not None:
            self.say(message)

    def _told(self, reason: str, message: str) -> None:
        """A warning of the step clock (supervisor/counter.py), with its reason.

        Lines that cannot be ordered are dropped from then on: the last step, the lost
        work and the step times after the newest step read so far are unknown, and the
        attempt's work says from which step (``unknown_after``; record/lost.py).
        """
        if reason == "unordered" and self.unknown_after is None:
            newest = max(s for s in (self.last_step, self._newest, -1) if s is not None)
            self.unknown_after = newest if newest >= 0 else None
            self._warn(message, reason=reason, unknown_after=self.unknown_after)
            return
        self._warn(message, reason=reason)

    def start(self) -> None:
        """Poll every :data:`POLL_S` seconds on a thread of its own, until :meth:`stop`.

        The supervisor's poll loop (stop requests, wall time, the grace period) then never
        waits on matching; it reads :attr:`diverged` and :attr:`last_step`.
        """
        self._thread = threading.Thread(target=self._pump, name="acceptrun-progress", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """End the thread; False when it did not end within :data:`STOP_JOIN_S` seconds."""
        self._stopping.set()
        with self._progressed:
            self._progressed.notify_all()  # a watcher waiting on a line: it waits no more
        if self._thread is None:
            return True
        self._thread.join(STOP_JOIN_S)
        return not self._thread.is_alive()

    def steps_before(
        self, t: float, wait_s: float = LINES_WAIT_S, slack: float = 0.0
    ) -> list[dict[str, Any]]:
        """The step events reported before ``t`` (unix s), oldest first.

        What the checkpoint watcher dates a save written at ``t`` by. An output line
        counts when the tee had read it before ``t`` (it was printed before), a
        TensorBoard scalar by its own time, up to ``slack`` seconds after ``t`` (a file's
        mtime may trail its write by a coarse clock tick: supervisor/dating.py). Waits up to ``wait_s`` seconds for the lines
        that arrived before ``t`` to be matched (a poll or two), so a save made within a
        poll of its step line is dated by that line, not by the one before it; past the
        wait (a reader far behind) or once the reader stopped, what is known. A line whose
        arrival is no longer known (read long before) counts by its event's time.
        """
        deadline = time.monotonic() + wait_s
        with self._progressed:
            while self._tails and self._read_through < t and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._progressed.wait(left)
            return [
                dict(ev)
                for known, ev in self._recent
                if known <= t + (0.0 if ev.get("source") == "log" else slack)
            ]

    def recent_steps(self) -> list[dict[str, Any]]:
        """The newest step events written (at most :data:`RECENT_STEPS`), oldest first."""
        with self._progressed:
            return [dict(ev) for _known, ev in self._recent]

    def _pump(self) -> None:
        while self.diverged is None and not self._stopping.wait(POLL_S):
            try:
                self.poll()
            except Exception as exc:  # background work records its failure, never kills the run
                with contextlib.suppress(Exception):  # a record that cannot be written either
                    self._warn(f"progress.pattern: reading the output stopped: {exc!r}")
                return

    def poll(self, final: bool = False) -> dict[str, Any] | None:
        """Read what is new; write its step events. The ``diverged`` event when it just diverged."""
        if self.diverged is not None:
            return None
        now = time.time()
        found: dict[int, dict[str, Any]] = {}
        budget = time.monotonic() + (FINAL_BUDGET_S if final else POLL_BUDGET_S)
        through = now
        for tail, clock in zip(self._tails, self._clocks, strict=True):
            if final or not tail.pending:
                tail.pending.extend(tail.lines(final))
            self._match_pending(tail, clock, found, budget)
            # Lines left for the next poll: what arrived before this read is not all in.
            through = min(through, self._read_through if tail.pending else tail.read_at)
            if final and tail.pending:
                self._warn(
                    f"progress.pattern: {len(tail.pending):,} lines of {tail.path.name} were "
                    f"not matched: matching them took over {FINAL_BUDGET_S:g} s"
                )
                tail.pending.clear()
            if tail.skipped and not self._skip_warned:
                self._skip_warned = True
                self._warn(
                    f"progress.pattern: {tail.path.name} grew faster than it is read (over "
                    f"{READ_MAX >> 20} MiB between two reads): older lines were skipped, "
                    "and the steps they held are not counted"
                )
        dropped = sum(clock.dropped for clock in self._clocks)
        if final and dropped:
            self._warn(
                f"progress.pattern: {dropped:,} step lines of attempt {self.attempt} were "
                "dropped: their counter went back and could not be ordered",
                reason="dropped", dropped=dropped, unknown_after=self.unknown_after,
            )  # fmt: skip
        new = [v for s, v in sorted(found.items()) if self.last_step is None or s > self.last_step]
        if new:
            self._emit_log_steps(new, now)
        if self._tb is not None and self.diverged is None:
            for raw, wall, values in self._tb.poll(now, final):
                step = self._run_step(raw, "tensorboard")
                if self.last_step is not None and step <= self.last_step:
                    continue
                if self._emit(step, wall, values, "tensorboard"):
                    break
        self._last_poll = now
        self.record.flush_events()
        with self._progressed:
            self._read_through = max(self._read_through, through)
            self._progressed.notify_all()
        return self.diverged

    def _match_pending(
        self, tail: _LogTail, clock: StepClock, found: dict[int, dict[str, Any]], budget: float
    ) -> None:
        """Match the tail's pending lines until ``budget`` (monotonic s); the rest wait.

        At least one line each poll, so the reader moves on however slow a line is.
        """
        assert self._pattern is not None
        while tail.pending:
            line, arrived = tail.pending.popleft()
            values = match_line(self._pattern, line)
            if values is not None and not _counter_at_zero(values):
                step = clock.read(values)  # takes the counter groups out of values
                if step is not None:
                    values["step"] = self._run_step(step, "log")
                    self._newest = max(values["step"], self._newest or values["step"])
                    entry = found.setdefault(values["step"], {})
                    entry.update(values)
                    if arrived is not None:  # the step's first line: when it was printed by
                        entry.setdefault(_ARRIVED, arrived)
            if time.monotonic() >= budget:
                return

    def _run_step(self, step: int, source: str) -> int:
        return step if self.axis is None else self.axis.run_step(step, source)

    def _emit_log_steps(self, new: list[dict[str, Any]], now: float) -> None:
        """Lines read together: spread the time since the previous step evenly over them."""
        if self.last_step is None or self.last_t is None:
            s0, t0 = new[0]["step"], min(self._last_poll, now)
        else:
            s0, t0 = self.last_step, self.last_t
        advanced = new[-1]["step"] - s0
        per = (now - t0) / advanced if advanced > 0 else 0.0
        for values in new:
            t = t0 + (values["step"] - s0) * per if advanced > 0 else now
            arrived = values.pop(_ARRIVED, None)
            if self._emit(values.pop("step"), t, values, "log", arrived):
                return

    def _emit(
        self, step: int, t: float, values: dict[str, Any], source: str, arrived: float | None = None
    ) -> bool:
        """Write one step event; True when its loss diverged."""
        event: dict[str, Any] = {"t": round(t, 6), "attempt": self.attempt, "step": step}
        if self.last_step is not None and self.last_t is not None and step > self.last_step:
            span = step - self.last_step
            event["step_time"] = round(max(0.0, t - self.last_t) / span, 6)
            if span > 1:
                event["span"] = span
        total = values.pop("total_steps", None)
        if isinstance(total, int):
            event["total_steps"] = total
        event.update({k: v for k, v in values.items() if k not in event})
        event["source"] = source
        self.last_step, self.last_t = step, t
        # Non-finite values are written as strings: JSON has no NaN (the client does the same
        # in its diverged event).
        clean: dict[str, Any] = {
            k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
            for k, v in event.items()
        }
        self.record.event("step", defer=True, **clean)
        with self._progressed:
            self._recent.append((t if arrived is None else arrived, {"kind": "step", **clean}))
        loss = values.get("loss")
        if isinstance(loss, float):
            self._check_divergence(step, loss, source)
        return self.diverged is not None

    def _check_divergence(self, step: int, loss: float, source: str) -> None:
        reason = divergence(step, loss, self.spec.limits.max_loss)
        if reason is None:
            return
        self.diverged = self.record.event(
            "diverged", sync=True, attempt=self.attempt, step=step, loss=str(loss),
            reason=reason, source=source,
        )  # fmt: skip


def _counter_at_zero(values: dict[str, Any]) -> bool:
    """A reading of step 0 with nothing but a total: a progress bar's start, no step done.

    tqdm (the Trainer's bar, Lightning's, most others) draws ``0/300`` before the first
    step, and a resumed attempt's bar draws it again before it jumps to the first step
    after the checkpoint (``101/300``). Read as a step, it counted a step nobody ran,
    gave the next reading a span back to 0 (101 steps for one), and in a resumed attempt
    made the step axis take the bar for a counter that started again. A step 0 line
    that carries a value (nanoGPT's ``iter 0: loss 4.2``) is a step.
    """
    count = values.get("step", values.get("batch", values.get("iter")))
    return count == 0 and set(values) <= {*COUNTER_GROUPS, "total_steps"}


def _size(path: Path) -> int:
    """Bytes already in a log when the attempt starts (an earlier attempt's: not this one's)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


# Words of a TensorBoard tag that name the training loss, in any case and with any of "/",
# "_", "-", "." or " " between them: loss, train/loss, Loss/train, train_loss,
# training_loss, train_loss_step. A tag with any other word (val, eval, epoch) is not it.
_LOSS_WORDS = frozenset(("loss", "train", "training", "step", "batch", "total"))
_TAG_SEPARATORS = re.compile(r"[/_\-. ]+")
# A first step equal to the resumed step is a restarted counter when reaching it took at
# least this fraction of the time the previous attempt took for as many steps.
RESTART_PACE = 0.5


def is_loss_tag(tag: str) -> bool:
    """Whether a TensorBoard tag is the training loss by its name (docs/own-script.md)."""
    words = set(_TAG_SEPARATORS.split(tag.lower())) - {""}
    return "loss" in words and words <= _LOSS_WORDS


@dataclass
class _TensorBoard:
    """Incremental reader of the scalar events under one directory.

    A resumed attempt's first scalar decides the step axis (supervisor/axis.py). One
    below the resumed step is a restarted counter by the steps alone; one equal to it
    is told apart by wall time: the script's writer starts a new event file, and a
    counter that started again took, from the new file's first record, about as long to
    reach that step as the previous attempt took for as many steps (read from the old
    files' scalars), where a counter that went on logs it at once. With no pace to compare (no two old scalars), it is
    taken as going on, and a warning says so.
    """

    root: Path
    tags: dict[str, str]  # value name -> TensorBoard tag; empty: every scalar
    loader_cls: Any
    to_value: Any
    loaders: dict[Path, Any] = field(default_factory=dict)
    pending: dict[int, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    held: tuple[int, int] | None = None  # (newest step, its number of values) at the last scan
    next_scan: float = 0.0
    axis: StepAxis | None = None
    warn: Any = None
    started: float = field(default_factory=time.time)  # unix s: the attempt's start
    born: float | None = None  # unix s: the first record of this attempt's first new file
    pace: float | None = None  # seconds per step in the old files' newest, when known

    @classmethod
    def open(
        cls, root: Path, tags: dict[str, str], warn: Any, axis: StepAxis | None = None
    ) -> _TensorBoard | None:
        try:  # an optional dependency: acceptrun[tensorboard]
            from tensorboard.backend.event_processing.event_file_loader import (  # type: ignore[import-untyped]
                EventFileLoader,
            )
            from tensorboard.util.tensor_util import make_ndarray  # type: ignore[import-untyped]
        except ImportError:
            warn(
                f"progress.tensorboard = {str(root)!r} is not read: the tensorboard package "
                "is not installed (pip install acceptrun[tensorboard])"
            )
            return None

        def to_value(value: Any) -> float | None:
            if value.HasField("simple_value"):
                return float(value.simple_value)
            if value.HasField("tensor"):
                with contextlib.suppress(Exception):
                    array = make_ndarray(value.tensor)
                    if array.size == 1:
                        return float(array.reshape(()))
            return None

        reader = cls(root, tags, EventFileLoader, to_value, axis=axis, warn=warn)
        # Files an earlier attempt wrote are read to their end now: their steps are not this
        # attempt's (a restarted SummaryWriter starts a new file). Their pace is kept.
        newest: list[tuple[float, int]] = []
        for path in reader._files():
            loader = reader.loaders[path] = EventFileLoader(str(path))
            seen = [
                (float(ev.wall_time), int(ev.step))
                for ev in loader.Load()
                if ev.HasField("summary") and len(ev.summary.value)
            ]
            if seen and (not newest or max(seen)[0] > max(newest)[0]):
                newest = seen
        reader.pace = _pace(newest)
        return reader

    def _files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            out += [Path(dirpath) / f for f in files if "tfevents" in f]
        return sorted(out)

    def poll(self, now: float, final: bool) -> Iterator[tuple[int, float, dict[str, Any]]]:
        """(step, wall time, values) of steps complete since the last call, in step order.

        A step is complete once a later step appears (its values may come in several
        records), once a scan found nothing new for it (a script that logs every 500
        steps must not wait 500 steps for its newest one: the watcher dates a checkpoint
        by it), or at the end of the attempt.
        """
        if not final and now < self.next_scan:
            return
        self.next_scan = now + TB_POLL_S
        for path in self._files():
            loader = self.loaders.get(path)
            if loader is None:
                loader = self.loaders[path] = self.loader_cls(str(path))
            try:
                events = list(loader.Load())
            except Exception:  # a torn record at the end: read again next time
                continue
            if events and self.born is None:  # a writer's first record: its file_version
                self.born = float(events[0].wall_time)
            for ev in events:
                self._add(ev)
        if not self.pending:
            return
        newest = max(self.pending)
        quiet = self.held == (newest, len(self.pending[newest][1]))  # as at the last scan
        for step in sorted(self.pending):
            if step == newest and not (final or quiet):
                self.held = (newest, len(self.pending[newest][1]))
                break
            wall, values = self.pending.pop(step)
            self._place(step, wall)
            yield step, wall, values

    def _place(self, step: int, wall: float) -> None:
        """Tell the axis a restarted counter whose first step equals the resumed step."""
        axis = self.axis
        if axis is None or axis.offset is not None or step != axis.resume_step or step <= 0:
            return
        # From the writer's start (its file's first record) where known: the import and
        # start-up before it are no steps.
        took = wall - (self.started if self.born is None else max(self.born, self.started))
        if self.pace is None:
            if self.warn is not None:
                self.warn(
                    f"progress.tensorboard: the first step after resuming from step {step} "
                    f"is {step} itself, and the earlier attempt's pace is unknown, so it is "
                    "taken as going on from the checkpoint; if the script's counter starts "
                    "again at each resume, have it log its first scalar before step "
                    f"{step} (or save its step in the checkpoint and resume its counter)"
                )
            return
        if took >= RESTART_PACE * step * self.pace:
            axis.restarted(
                step, "tensorboard",
                f"its first scalar, step {step}, came {took:.1f} s after the start; the "
                f"earlier attempt took {step * self.pace:.1f} s for {step} steps",
            )  # fmt: skip

    def _add(self, ev: Any) -> None:
        if not ev.HasField("summary"):
            return
        by_tag = {v: k for k, v in self.tags.items()}
        for value in ev.summary.value:
            tag = value.tag
            if self.tags and tag not in by_tag:
                continue
            number = self.to_value(value)
            if number is None:
                continue
            wall, values = self.pending.setdefault(int(ev.step), (float(ev.wall_time), {}))
            name = by_tag.get(tag, tag)
            values[name] = number
            if not self.tags and "loss" not in values and is_loss_tag(tag):
                values["loss"] = number  # "Loss/train" is the loss the divergence check reads
            self.pending[int(ev.step)] = (max(wall, float(ev.wall_time)), values)


def _pace(scalars: list[tuple[float, int]]) -> float | None:
    """Seconds per step over (wall time, step) pairs of one event file, or None."""
    if len(scalars) < 2:
        return None
    (w0, s0), (w1, s1) = min(scalars), max(scalars)
    return (w1 - w0) / (s1 - s0) if s1 > s0 and w1 > w0 else None
