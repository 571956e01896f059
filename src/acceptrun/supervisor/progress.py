"""Progress of a script without the client API: step events from its logs and TensorBoard files.

The supervisor polls a :class:`ProgressReader` between its checks of the child (every
0.25 s). It reads what the attempt appended to ``attempts/<n>/stdout.log`` and
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
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec
from acceptrun.supervisor.axis import StepAxis

__all__ = ["ProgressReader", "match_line"]

TB_POLL_S = 1.0  # seconds between scans of the TensorBoard directory (a directory walk)
_NON_FINITE = re.compile(r"\b(?:nan|inf(?:inity)?)\b", re.I)
_MAX_LINE = 64 * 1024  # bytes: a longer "line" (a progress bar without newlines) is cut


@dataclass
class _LogTail:
    """New complete lines of one growing log file."""

    path: Path
    offset: int = 0
    partial: bytes = b""

    def lines(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        # \r ends a line too: progress bars (tqdm) redraw one line with carriage returns.
        parts = re.split(rb"\r\n|\r|\n", data)
        self.partial = b"" if final else parts.pop()
        if len(self.partial) > _MAX_LINE:
            parts.append(self.partial)
            self.partial = b""
        return [p[:_MAX_LINE].decode("utf-8", errors="replace") for p in parts if p]


def match_line(pattern: re.Pattern[str], line: str) -> dict[str, Any] | None:
    """Step and values from one line, or None when it is not a step line.

    >>> match_line(re.compile(r"iter (?P<step>\\d+): loss (?P<loss>\\S+)"), "iter 7: loss 0.5")
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
    groups = {
        name: None if m.start(name) < 0 else line[m.start(name) : m.end(name)]
        for name in pattern.groupindex
    }
    try:
        step = int(groups["step"] or "")
    except ValueError:
        return None
    out: dict[str, Any] = {"step": step}
    for name, text in groups.items():
        if name == "step" or text is None:
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
    last_step: int | None = None
    last_t: float | None = None
    diverged: dict[str, Any] | None = None
    _tails: list[_LogTail] = field(default_factory=list)
    _pattern: re.Pattern[str] | None = None
    _last_poll: float = field(default_factory=time.time)
    _tb: _TensorBoard | None = None

    def __post_init__(self) -> None:
        prog = self.spec.progress
        if prog.pattern is not None:
            self._pattern = re.compile(prog.pattern)
            if prog.stream in ("stdout", "both"):
                self._tails.append(_LogTail(self.stdout, _size(self.stdout)))
            if prog.stream in ("stderr", "both"):
                self._tails.append(_LogTail(self.stderr, _size(self.stderr)))
        if prog.tensorboard is not None:
            root = Path(self.workdir or self.spec.workdir_path) / prog.tensorboard
            self._tb = _TensorBoard.open(root, dict(prog.tags), self._warn)

    @property
    def active(self) -> bool:
        return bool(self._tails) or self._tb is not None

    def _warn(self, message: str) -> None:
        self.record.event("progress_warning", sync=True, attempt=self.attempt, message=message)
        if self.say is not None:
            self.say(message)

    def poll(self, final: bool = False) -> dict[str, Any] | None:
        """Read what is new; write its step events. The ``diverged`` event when it just diverged."""
        if self.diverged is not None:
            return None
        now = time.time()
        found: dict[int, dict[str, Any]] = {}
        for tail in self._tails:
            for line in tail.lines(final):
                assert self._pattern is not None
                values = match_line(self._pattern, line)
                if values is not None and not _counter_at_zero(values):
                    values["step"] = self._run_step(values["step"], "log")
                    found.setdefault(values["step"], {}).update(values)
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
        return self.diverged

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
            if self._emit(values.pop("step"), t, values, "log"):
                return

    def _emit(self, step: int, t: float, values: dict[str, Any], source: str) -> bool:
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
        loss = values.get("loss")
        if isinstance(loss, float):
            self._check_divergence(step, loss, source)
        return self.diverged is not None

    def _check_divergence(self, step: int, loss: float, source: str) -> None:
        limit = self.spec.limits.max_loss
        if math.isfinite(loss) and (limit is None or loss <= limit):
            return
        reason = f"loss {loss} at step {step}" + ("" if math.isfinite(loss) else " is not finite")
        if math.isfinite(loss):
            reason += f", above limits.max_loss = {limit:g}"
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
    return values["step"] == 0 and set(values) <= {"step", "total_steps"}


def _size(path: Path) -> int:
    """Bytes already in a log when the attempt starts (an earlier attempt's: not this one's)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class _TensorBoard:
    """Incremental reader of the scalar events under one directory."""

    root: Path
    tags: dict[str, str]  # value name -> TensorBoard tag; empty: every scalar
    loader_cls: Any
    to_value: Any
    loaders: dict[Path, Any] = field(default_factory=dict)
    pending: dict[int, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    held: tuple[int, int] | None = None  # (newest step, its number of values) at the last scan
    next_scan: float = 0.0

    @classmethod
    def open(cls, root: Path, tags: dict[str, str], warn: Any) -> _TensorBoard | None:
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

        reader = cls(root, tags, EventFileLoader, to_value)
        # Files an earlier attempt wrote are read to their end now: their steps are not this
        # attempt's (a restarted SummaryWriter starts a new file).
        for path in reader._files():
            loader = reader.loaders[path] = EventFileLoader(str(path))
            for _ in loader.Load():
                pass
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
            yield step, wall, values

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
            if not self.tags and "loss" not in values and tag.rsplit("/", 1)[-1] == "loss":
                values["loss"] = number  # "train/loss" is the loss the divergence check reads
            self.pending[int(ev.step)] = (max(wall, float(ev.wall_time)), values)
