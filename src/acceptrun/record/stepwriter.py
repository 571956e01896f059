"""Writing the step log: one fixed-width binary record per step, appended whole.

The format is record/steplog.py's (segments, codecs, reserved NaNs). A step that needs a
column the open segment lacks, a wider codec or other constants starts the next segment
(:class:`_Layout`); a loop that logs the same keys every step packs each record in one
``struct.pack`` (:class:`_Plan`). The writer uses ``struct`` only: the training loop never
imports NumPy for it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.durable import HeldWrites, _json_default
from acceptrun.record.steplog import (
    BASE_COLUMNS,
    CONSTANT_FIELDS,
    FRAME_FIELDS,
    MAGIC,
    MISSING_F4,
    MISSING_F8,
    MISSING_U4,
    SUFFIX,
    TIMED,
    is_number,
)

__all__ = ["StepWriter", "split_event"]

_STRUCT = {"i8": "q", "f8": "d", "f4": "f", "us4": "I"}
_F4_MAX = 3.4028234663852886e38


def _f4_exact(v: float) -> bool:
    """Whether float32 holds ``v`` exactly (NaN and infinities: yes)."""
    if v != v or v in (math.inf, -math.inf):
        return True
    if abs(v) > _F4_MAX:
        return False
    return bool(struct.unpack("<f", struct.pack("<f", v))[0] == v)


def _codec_for(name: str, value: float) -> str:
    if name in TIMED:
        return "us4" if _us4_fits(value) else "f8"
    return "f4" if _f4_exact(value) else "f8"


def _us4_fits(value: float) -> bool:
    return value == value and 0.0 <= value < 4294.0


def _wider(a: str, b: str) -> str:
    """The codec that holds what both hold (``f8`` holds everything)."""
    return a if a == b else "f8"


# ---- writing ------------------------------------------------------------------------------------


@dataclass
class _Layout:
    columns: list[tuple[str, str]]
    constants: dict[str, Any]
    names: frozenset[str] = frozenset()
    codec: dict[str, str] = field(default_factory=dict)
    packer: struct.Struct | None = None

    def __post_init__(self) -> None:
        self.names = frozenset(n for n, _c in self.columns)
        self.codec = dict(self.columns)
        self.packer = struct.Struct("<" + "".join(_STRUCT[c] for _n, c in self.columns))

    def fits(self, values: dict[str, Any], constants: dict[str, Any]) -> bool:
        if constants != self.constants:
            return False
        codec = self.codec
        for name, v in values.items():
            c = codec.get(name)
            if c is None:
                return False
            if c == "f4":
                if not _f4_exact(v):
                    return False
            elif c == "us4" and not _us4_fits(v):
                return False
        return True

    def widened(self, values: dict[str, Any], constants: dict[str, Any]) -> _Layout:
        cols = dict(self.columns)
        for name, v in values.items():
            want = _codec_for(name, v)
            cols[name] = want if name not in cols else _wider(cols[name], want)
        return _Layout(list(cols.items()), constants)

    def pack(self, step: int, t: float, values: dict[str, Any]) -> bytes:
        out: list[Any] = []
        for name, c in self.columns:
            if name == "step":
                out.append(step)
            elif name == "t":
                out.append(t)
            else:
                v = values.get(name)
                if v is None:
                    out.append(
                        MISSING_U4 if c == "us4" else MISSING_F4 if c == "f4" else MISSING_F8
                    )
                elif c == "us4":
                    out.append(round(v * 1e6))
                else:
                    out.append(v)
        assert self.packer is not None
        return self.packer.pack(*out)


_MISSING_ARG = {"us4": MISSING_U4, "f4": MISSING_F4, "f8": MISSING_F8}
_ABSENT = object()


class _Plan:
    """How the events of one shape (the same keys, in the same order) pack into a layout.

    The writer's fast path: a step of a loop logs the same keys every time, so what
    :func:`split_event`, :meth:`_Layout.fits` and :meth:`_Layout.pack` decide per field is
    decided once per shape here, and each record costs one ``pack`` (and one ``unpack``
    when a column is float32, to prove it held the value exactly). Anything it does not
    handle (a non-float value, a value that needs a wider column, a changed constant)
    returns None and takes the general path.
    """

    __slots__ = ("columns", "constants", "f4", "keys", "layout")

    def __init__(self, keys: tuple[str, ...], layout: _Layout) -> None:
        self.keys = keys
        self.layout = layout
        self.columns = [(n, c, _MISSING_ARG[c]) for n, c in layout.columns[2:]]
        self.constants = [(k, layout.constants[k]) for k in keys if k in layout.constants]
        self.f4 = [i for i, (_n, c) in enumerate(layout.columns) if c == "f4"]

    @staticmethod
    def applies(keys: tuple[str, ...], layout: _Layout) -> bool:
        """Every key is a frame field, a constant of the layout or one of its columns."""
        names = layout.names
        return all(k in FRAME_FIELDS or k in layout.constants or k in names for k in keys) and set(
            layout.constants
        ) <= set(keys)

    def pack(self, fields: dict[str, Any], step: Any, t: float) -> bytes | None:
        for k, want in self.constants:
            if fields[k] != want:
                return None
        args: list[Any] = [step, t]
        get = fields.get
        for name, codec, missing in self.columns:
            v = get(name, _ABSENT)
            if v is _ABSENT:
                args.append(missing)
                continue
            tv = type(v)
            if tv is not float:
                if tv is not int or not -(2**53) <= v <= 2**53:
                    return None
                v = float(v)
            if codec == "us4":
                if not 0.0 <= v < 4294.0:
                    return None
                args.append(round(v * 1e6))
            else:
                args.append(v)
        packer = self.layout.packer
        assert packer is not None
        try:
            rec = packer.pack(*args)
        except (struct.error, OverflowError):
            return None
        if self.f4:
            back = packer.unpack(rec)
            for i in self.f4:
                if back[i] != args[i] and args[i] == args[i]:  # NaN is held as NaN
                    return None
        return rec


def _plain(v: Any) -> Any:
    """A NumPy or torch scalar as the number it holds (as events.jsonl wrote it), else ``v``."""
    item = getattr(v, "item", None)
    if callable(item):
        with contextlib.suppress(Exception):  # an array of many values: not a scalar
            out = item()
            if is_number(out):
                return out
    return v


def split_event(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A step event's numeric values and its constants; None when it cannot be a record."""
    step = fields.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not -(2**63) <= step < 2**63:
        return None
    values: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for k, v in fields.items():
        if k in FRAME_FIELDS:
            continue
        if k in CONSTANT_FIELDS or not is_number(v):
            if isinstance(v, str) and v in ("nan", "inf", "-inf") and k not in CONSTANT_FIELDS:
                values[k] = float(v)  # a non-finite value written as a string (JSON has no NaN)
                continue
            if k in CONSTANT_FIELDS or not is_number(v := _plain(v)):
                constants[k] = v
                continue
        if isinstance(v, int) and not -(2**53) <= v <= 2**53:
            return None  # a float64 does not hold it exactly: keep it as JSON
        values[k] = float(v) if isinstance(v, int) else v
    return values, constants


class StepWriter(HeldWrites):
    """Appends the step records of one process to ``attempts/<attempt>/steps/``.

    :meth:`append` holds records for at most ``FLUSH_S`` seconds or ``FLUSH_RECORDS``
    records and writes them in one ``write(2)`` (a flusher thread writes what is held when
    the loop stops appending); :meth:`flush` writes them now. One writer per process and
    attempt; a forked child starts its own. Thread-safe.
    """

    FLUSH_RECORDS = 4096
    FLUSHER_NAME = "acceptrun-steps"

    def __init__(self, record_path: Path) -> None:
        super().__init__()
        self.record_path = Path(record_path)
        self._attempt: int | None = None
        self._layout: _Layout | None = None
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0  # bytes in the open segment: a failed write is cut back to it
        self._plan: _Plan | None = None  # the fast path for the last shape of step event
        self.records = 0  # records appended by this writer

    def append(self, attempt: int, fields: dict[str, Any]) -> bool:
        """Add one step; False when it cannot be a record (the caller keeps it as JSON)."""
        if self._pid != os.getpid():
            self._after_fork()
        step, given = fields.get("step"), fields.get("t")
        plan = self._plan
        if (
            plan is not None
            and type(step) is int
            and type(given) is float
            and attempt == self._attempt
            and plan.layout is self._layout
            and plan.keys == tuple(fields)
        ):
            rec = plan.pack(fields, step, given)
            if rec is not None:
                with self._lock:
                    if plan.layout is self._layout:
                        self.records += 1
                        self._hold(rec)
                        return True
        return self._append_general(attempt, fields)

    def _append_general(self, attempt: int, fields: dict[str, Any]) -> bool:
        split = split_event(fields)
        if split is None:
            return False
        values, constants = split
        given: Any = fields.get("t")
        t = float(given) if is_number(given) else time.time()
        with self._lock:
            layout = self._layout
            if attempt != self._attempt or layout is None or not layout.fits(values, constants):
                self._write_held()
                base = (
                    _Layout(list(BASE_COLUMNS), constants)
                    if (layout is None or attempt != self._attempt)
                    else layout
                )
                layout = base.widened(values, constants)
                self._open_segment(attempt, layout)
            keys = tuple(fields)
            self._plan = _Plan(keys, layout) if _Plan.applies(keys, layout) else None
            self.records += 1
            self._hold(layout.pack(fields["step"], t, values))
        return True

    def flush(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            self._write_held()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
                self._layout = None  # a step after close() opens a new segment

    def _open_segment(self, attempt: int, layout: _Layout) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        root = self.record_path / "attempts" / str(attempt) / "steps"
        root.mkdir(parents=True, exist_ok=True)
        header = {
            "columns": [list(c) for c in layout.columns],
            "constants": layout.constants,
            "attempt": attempt,
            "pid": os.getpid(),
            "created": round(time.time(), 6),
        }
        from acceptrun._util.redact import redact_obj

        body = json.dumps(redact_obj(header), separators=(",", ":"), default=_json_default).encode()
        pad = (-(len(MAGIC) + 4 + len(body))) % 8
        blob = MAGIC + struct.pack("<I", len(body) + pad) + body + b" " * pad
        seq = _next_seq(root)
        while True:
            path = root / f"{seq:06d}{SUFFIX}"
            try:
                fd = os.open(
                    path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644
                )
            except FileExistsError:
                seq += 1
                continue
            break
        self._fd, self._path, self._attempt, self._layout = fd, path, attempt, layout
        self._size = 0
        try:
            self._write_all(blob)
        except OSError:
            # A segment without its whole header cannot be read: remove it, so that the next
            # step opens another instead of appending records to a file no reader can use.
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
            with contextlib.suppress(OSError):
                path.unlink()
            self._fd, self._layout = None, None
            raise

    def _write_held(self) -> None:
        if not self._held or self._fd is None:
            self._held = []
            return
        data = b"".join(self._held)
        self._held = []
        self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        """Write every byte; a failed write is cut back to the last whole record, then raised.

        A full disk may write part of a batch: the partial record is removed (``ftruncate``
        to the size before the batch) so the next batch starts on a record boundary; when
        even that fails the segment is closed and the next step starts a new one.
        """
        assert self._fd is not None and self._path is not None
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                n = os.write(self._fd, view[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "write(2) wrote nothing", str(self._path))
                done += n
        except OSError as exc:
            exc.add_note(f"{self._path}: {done} of {len(data)} bytes of this append were written")
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd, self._layout = None, None
            raise
        self._size += len(data)

    def _after_fork(self) -> None:
        self._forget_parent()
        self._fd, self._layout, self._attempt = None, None, None


def _next_seq(root: Path) -> int:
    best = -1
    with contextlib.suppress(OSError):
        for p in root.iterdir():
            if p.suffix == SUFFIX and p.stem.isdigit():
                best = max(best, int(p.stem))
    return best + 1
