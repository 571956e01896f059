"""The step log: one fixed-width binary record per step, made for runs of millions of steps.

A step is the one thing a run writes at every step, so it is the one thing whose cost
must not grow with the run. Step events live here instead of ``events.jsonl`` (which
keeps the other events); record/stepwriter.py writes them and this module is the only reader of the files.

Layout (record format 2)::

    attempts/<n>/steps/<seq>.steps      one segment: a header, then fixed-width records

A segment starts with the 8 bytes ``ACSTEP1\\n``, a little-endian uint32 header length,
and that many bytes of JSON (padded with spaces so records start on an 8-byte boundary):
``{"columns": [[name, codec], ...], "constants": {...}, "attempt": n, "pid": ...}``. Each
record is the columns packed in order, little-endian, without padding, so NumPy reads a
segment as one structured array (:func:`numpy.fromfile`), with no parsing. Codecs:

``i8``
    int64: ``step``.
``f8``
    float64: ``t`` (unix seconds), and any value that float32 does not hold exactly.
``f4``
    float32: a logged value while every value it has held is exactly a float32 (a loss
    from ``tensor.item()``, a batch size): exact, half the bytes.
``us4``
    uint32 microseconds: ``step_time`` and ``data_wait`` (the JSON events rounded them to
    the microsecond too), up to 4294 s; a longer one widens the column to ``f8``.

A value absent from a step is a reserved NaN (``MISSING_F8``/``MISSING_F4``, or
``0xFFFFFFFF`` for ``us4``), distinct from a logged NaN. ``total_steps``, ``source`` and
any value that is not a number are constants of the segment, in its header. A step that
needs a column the segment lacks, a wider codec or other constants starts the next
segment: layouts only widen, so a run has a handful of segments, whatever its length.
The steps of the bench loop (step, t, step_time, loss, samples) take 28 bytes with a
float32 loss, 32 with a float64 one; ``events.jsonl`` took 145.

Crash safety: records are appended whole (one ``write(2)`` of the held records, held
for at most 0.2 s as the JSON step events were), with ``O_APPEND``. A SIGKILL, a full disk
or a power cut can leave a partial last record: readers count whole records only
(``(size - header) // width``), so nothing is lost but the torn step, and a later attempt
writes segments of its own, never after a torn tail. :func:`repair_torn` cuts such a tail
at resume.

Records of format 1 (every step a JSON line in ``events.jsonl``) read through the same
API: :class:`StepLog` yields their steps in chunks of arrays, as it does for segments.
A step event that cannot be a record (a ``step`` that is not an integer) is written to
``events.jsonl`` as before and read from there too.

Writers call ``RunRecord.event("step", ...)`` as before; the record routes step events
to :class:`~acceptrun.record.stepwriter.StepWriter` (record/stepwriter.py). The writer
uses ``struct`` only: the training loop never imports NumPy for it. This module holds
the format and its readers.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.confined import open_regular
from acceptrun._util.durable import loads_json, read_jsonl

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BASE_COLUMNS",
    "CHUNK",
    "CONSTANT_FIELDS",
    "FRAME_FIELDS",
    "MAGIC",
    "MISSING_F4",
    "MISSING_F8",
    "MISSING_U4",
    "SUFFIX",
    "TIMED",
    "Segment",
    "StepChunk",
    "StepLog",
    "StepRanges",
    "is_number",
    "repair_torn",
    "segments",
]

MAGIC = b"ACSTEP1\n"
SUFFIX = ".steps"
# records per chunk a reader holds at once (~5 MB decoded; with its temporaries ~16 MB)
CHUNK = 1 << 16
MAX_HEADER = 1 << 20  # a segment header longer than this is damage, not a layout

MISSING_F8_BITS = 0x7FF8_0000_5EED_0BAD  # a quiet NaN with a payload no arithmetic makes
MISSING_F4_BITS = 0x7FC0_0BAD
MISSING_U4 = 0xFFFF_FFFF
MISSING_F8: float = struct.unpack("<d", struct.pack("<Q", MISSING_F8_BITS))[0]
MISSING_F4: float = struct.unpack("<f", struct.pack("<I", MISSING_F4_BITS))[0]

_NUMPY = {"i8": "<i8", "f8": "<f8", "f4": "<f4", "us4": "<u4"}
_SIZE = {"i8": 8, "f8": 8, "f4": 4, "us4": 4}
# Timed fields, stored in microseconds.
TIMED = frozenset({"step_time", "data_wait"})
# Fields that are constant over a loop: kept in the segment header, not in each record.
CONSTANT_FIELDS = frozenset({"total_steps", "source"})
# Fields of a step event that are not values: the step log keeps them elsewhere.
FRAME_FIELDS = frozenset({"t", "kind", "attempt", "step"})
BASE_COLUMNS = [("step", "i8"), ("t", "f8")]  # the first columns of every segment


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ---- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment file: where its records start, their layout and how many are whole."""

    path: Path
    attempt: int
    seq: int
    columns: tuple[tuple[str, str], ...]
    constants: dict[str, Any]
    offset: int  # bytes before the first record
    width: int  # bytes per record
    count: int  # whole records
    torn: int  # bytes of a partial last record (0: none)

    def dtype(self) -> np.dtype[Any]:
        import numpy as np

        return np.dtype([(n, _NUMPY[c]) for n, c in self.columns])


def read_segment_header(path: Path, root: Path | None = None) -> Segment | str:
    """A segment's header and record count, or why the file is not a segment.

    Opened by :func:`~acceptrun._util.confined.open_regular` from ``root`` (the record;
    default: the segment's folder): a link, a FIFO or a device is no segment.
    """
    try:
        with open_regular(path, root=path.parent if root is None else root) as f:
            head = f.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                return f"{path}: not a step log segment (no {MAGIC!r} header)"
            (n,) = struct.unpack("<I", head[len(MAGIC) :])
            if n > MAX_HEADER:
                return f"{path}: header of {n} bytes, more than a layout takes"
            body = f.read(n)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        return f"{path}: {exc}"
    try:
        header = loads_json(body)
        columns = tuple((str(a), str(b)) for a, b in header["columns"])
        attempt = int(header.get("attempt") or 0)
        constants = header.get("constants") or {}
        names = [n for n, _c in columns]
        if not all(c in _NUMPY for _n, c in columns) or columns[:2] != tuple(BASE_COLUMNS):
            raise ValueError(f"unknown layout {columns}")
        if "" in names or len(set(names)) != len(names):  # NumPy cannot make its dtype
            raise ValueError(f"column names empty or repeated: {names}")
    except (ValueError, KeyError, TypeError) as exc:
        return f"{path}: damaged header ({exc})"
    offset = len(MAGIC) + 4 + n
    width = sum(_SIZE[c] for _n, c in columns)
    body_bytes = max(0, size - offset)
    return Segment(
        path, attempt, int(path.stem) if path.stem.isdigit() else 0, columns,
        constants if isinstance(constants, dict) else {}, offset, width,
        body_bytes // width, body_bytes % width,
    )  # fmt: skip


def segments(record_path: Path, attempt: int | None = None) -> tuple[list[Segment], list[str]]:
    """The step log segments of a record (by attempt, then sequence), and damaged files."""
    root = Path(record_path) / "attempts"
    found: list[Segment] = []
    problems: list[str] = []
    try:
        dirs = [d for d in root.iterdir() if d.name.isdigit()]
    except OSError:
        return [], []
    for d in sorted(dirs, key=lambda p: int(p.name)):
        if attempt is not None and int(d.name) != attempt:
            continue
        sd = d / "steps"
        try:
            files = sorted(p for p in sd.iterdir() if p.suffix == SUFFIX)
        except OSError:
            continue
        for p in files:
            seg = read_segment_header(p, Path(record_path))
            if isinstance(seg, str):
                problems.append(seg)
            else:
                found.append(seg)
    found.sort(key=lambda s: (s.attempt, s.seq))
    return found, problems


def repair_torn(record_path: Path) -> list[tuple[Path, int]]:
    """Cut the partial last record of every segment; (path, bytes cut) for each one cut."""
    cut = []
    segs, _problems = segments(record_path)
    for seg in segs:
        if seg.torn:
            with contextlib.suppress(OSError):
                os.truncate(seg.path, seg.offset + seg.count * seg.width)
                cut.append((seg.path, seg.torn))
    return cut


@dataclass
class StepChunk:
    """Consecutive steps of one attempt, as arrays (float64 values; NaN where absent).

    ``values`` holds every value column, converted to seconds for ``step_time`` and
    ``data_wait``; ``present[name]`` says which rows logged it (a logged NaN is present).
    ``constants`` are the segment's (``total_steps``, ``source``).
    """

    attempt: int
    step: np.ndarray[Any, Any]
    t: np.ndarray[Any, Any]
    values: dict[str, np.ndarray[Any, Any]]
    present: dict[str, np.ndarray[Any, Any]]
    constants: dict[str, Any]

    def __len__(self) -> int:
        return int(self.step.shape[0])

    def value(self, name: str) -> np.ndarray[Any, Any] | None:
        return self.values.get(name)

    def events(self) -> list[dict[str, Any]]:
        """The chunk as step events (dicts), as a JSON record held them (small runs only)."""
        names = list(self.values)
        cols = [self.values[n].tolist() for n in names]
        masks = [self.present[n].tolist() for n in names]
        out = []
        steps, ts = self.step.tolist(), self.t.tolist()
        for i in range(len(steps)):
            ev: dict[str, Any] = {
                "t": ts[i],
                "kind": "step",
                "attempt": self.attempt,
                "step": steps[i],
            }
            for n, col, mask in zip(names, cols, masks, strict=True):
                if mask[i]:
                    ev[n] = col[i]  # NaN and infinities as floats, as json.loads reads them
            ev.update(self.constants)
            out.append(ev)
        return out


def _decode(seg: Segment, raw: np.ndarray[Any, Any]) -> StepChunk:
    import numpy as np

    values: dict[str, Any] = {}
    present: dict[str, Any] = {}
    for name, codec in seg.columns[2:]:
        col = raw[name]
        if codec == "us4":
            mask = col != MISSING_U4
            v = col.astype(np.float64) / 1e6
        elif codec == "f4":
            mask = col.view(np.uint32) != MISSING_F4_BITS
            v = col.astype(np.float64)
        else:
            mask = col.view(np.uint64) != MISSING_F8_BITS
            v = col.astype(np.float64, copy=True)
        v[~mask] = np.nan
        values[name] = v
        present[name] = mask
    return StepChunk(
        seg.attempt, raw["step"].astype(np.int64), raw["t"].astype(np.float64), values,
        present, dict(seg.constants),
    )  # fmt: skip


def _chunk_from_events(attempt: int, events: list[dict[str, Any]]) -> StepChunk:
    import numpy as np

    n = len(events)
    names: dict[str, None] = {}
    for ev in events:
        for k, v in ev.items():
            if (
                k not in FRAME_FIELDS
                and k not in CONSTANT_FIELDS
                and (is_number(v) or v in ("nan", "inf", "-inf"))
            ):
                names[k] = None
    values = {k: np.full(n, np.nan) for k in names}
    present = {k: np.zeros(n, dtype=bool) for k in names}
    step = np.empty(n, dtype=np.int64)
    t = np.empty(n, dtype=np.float64)
    for i, ev in enumerate(events):
        step[i] = ev["step"]
        t[i] = ev["t"]
        for k in names:
            v = ev.get(k)
            if v is None:
                continue
            if isinstance(v, str):
                if v not in ("nan", "inf", "-inf"):
                    continue
                v = float(v)
            if is_number(v):
                values[k][i] = v
                present[k][i] = True
    first = events[0] if events else {}
    constants = {k: first[k] for k in CONSTANT_FIELDS if k in first}
    return StepChunk(attempt, step, t, values, present, constants)


def _json_step(ev: Any) -> bool:
    return (
        isinstance(ev, dict)
        and ev.get("kind") == "step"
        and isinstance(ev.get("step"), int)
        and not isinstance(ev.get("step"), bool)
        and is_number(ev.get("t"))
    )


class StepRanges:
    """A set of step numbers as sorted, disjoint, non-adjacent closed intervals.

    An attempt's steps are a few runs of consecutive numbers: the set costs a few
    integers however long the run (a loop that logs every 10th step costs one interval
    per logged step, 16 bytes, still less than the steps themselves as dicts).
    """

    def __init__(self, lo: Any = None, hi: Any = None) -> None:
        import numpy as np

        self.lo = np.empty(0, np.int64) if lo is None else lo
        self.hi = np.empty(0, np.int64) if hi is None else hi

    @classmethod
    def of(cls, values: Any) -> StepRanges:
        import numpy as np

        u = np.asarray(values)
        if u.size > 1 and not bool(np.all(u[1:] > u[:-1])):  # a loop's steps are sorted already
            u = np.unique(u)
        if not u.size:
            return cls()
        breaks = np.flatnonzero(np.diff(u) != 1)
        return cls(u[np.r_[0, breaks + 1]], u[np.r_[breaks, u.size - 1]])

    def union(self, other: StepRanges) -> StepRanges:
        import numpy as np

        if not other.lo.size:
            return self
        if not self.lo.size:
            return other
        lo = np.concatenate([self.lo, other.lo])
        hi = np.concatenate([self.hi, other.hi])
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
        reach = np.maximum.accumulate(hi)
        starts = np.flatnonzero(np.r_[True, lo[1:] > reach[:-1] + 1])
        ends = np.r_[starts[1:] - 1, lo.size - 1]
        return StepRanges(lo[starts], reach[ends])

    def contains(self, values: Any) -> Any:
        import numpy as np

        if not self.lo.size:
            return np.zeros(values.shape, dtype=bool)
        i = np.searchsorted(self.lo, values, side="right") - 1
        return (i >= 0) & (values <= self.hi[np.maximum(i, 0)])

    def count_within(self, lo: Any, hi: Any) -> Any:
        """How many of the set's steps each closed interval ``[lo[i], hi[i]]`` holds."""
        import numpy as np

        lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        if not self.lo.size:
            return np.zeros(lo.shape, np.int64)
        before = np.r_[0, np.cumsum(self.hi - self.lo + 1)[:-1]]  # steps in earlier intervals

        def upto(x: Any) -> Any:  # the set's steps <= x
            i = np.searchsorted(self.lo, x, side="right") - 1
            j = np.maximum(i, 0)
            n = before[j] + np.minimum(x, self.hi[j]) - self.lo[j] + 1
            return np.where(i >= 0, n, 0)

        return np.maximum(upto(hi) - upto(lo - 1), 0)

    def size(self) -> int:
        return int((self.hi - self.lo + 1).sum()) if self.lo.size else 0


class StepLog:
    """Every step of a run, read in chunks of arrays, whatever the record's format.

    ::

        log = StepLog(record.path)
        for chunk in log.chunks():          # one attempt's consecutive steps per chunk
            chunk.step, chunk.t, chunk.values["loss"]
        log.count()                          # steps, from file sizes: no reading
        log.tail(5)                          # the last five steps, as events

    Steps of segments come first per attempt, then step events found in events.jsonl
    (a record of format 1 has only those), all by attempt. ``events`` may pass the
    record's events when the caller has read them already (a format-1 record's steps are
    then not read twice).
    """

    def __init__(self, record_path: Path, events: Iterable[dict[str, Any]] | None = None) -> None:
        self.path = Path(record_path)
        self._events = events
        segs, problems = segments(self.path)
        self.segments = segs
        self.problems = problems  # damaged segment files, each saying why

    @property
    def torn(self) -> list[Segment]:
        return [s for s in self.segments if s.torn]

    def count(self) -> int:
        """Whole records in the segments (JSON step events are not counted here)."""
        return sum(s.count for s in self.segments)

    def attempts(self) -> list[int]:
        return sorted({s.attempt for s in self.segments})

    def _json_steps(self) -> Iterator[dict[str, Any]]:
        source: Iterable[Any]
        if self._events is not None:
            source = self._events
        else:
            source = read_jsonl(self.path / "events.jsonl", root=self.path)
        for ev in source:
            if _json_step(ev):
                yield ev

    def chunks(self, chunk: int = CHUNK, attempt: int | None = None) -> Iterator[StepChunk]:
        """Steps in chunks of at most ``chunk`` records, by attempt, in the order written."""
        import numpy as np

        by_attempt: dict[int, list[Segment]] = {}
        for s in self.segments:
            if attempt is None or s.attempt == attempt:
                by_attempt.setdefault(s.attempt, []).append(s)
        json_by_attempt: dict[int, list[dict[str, Any]]] = {}
        pending: list[dict[str, Any]] = []
        # JSON steps are few in a format-2 record; a format-1 record streams them below.
        json_iter = self._json_steps()
        if by_attempt:
            for ev in json_iter:
                a = ev.get("attempt")
                a = a if isinstance(a, int) else 0
                if attempt is None or a == attempt:
                    json_by_attempt.setdefault(a, []).append(ev)
            for a in sorted(set(by_attempt) | set(json_by_attempt)):
                for seg in by_attempt.get(a, []):
                    if not seg.count:
                        continue
                    dtype = seg.dtype()
                    done = 0
                    with open_regular(seg.path, root=seg.path.parent) as f:
                        while done < seg.count:
                            n = min(chunk, seg.count - done)
                            f.seek(seg.offset + done * seg.width)
                            raw = np.fromfile(f, dtype=dtype, count=n)
                            if raw.shape[0] == 0:
                                break
                            done += raw.shape[0]
                            yield _decode(seg, raw)
                evs = json_by_attempt.get(a, [])
                for i in range(0, len(evs), chunk):
                    yield _chunk_from_events(a, evs[i : i + chunk])
            return
        # Format 1: step events only, streamed; a chunk ends at a change of attempt or of
        # constants, as a segment would.
        key: tuple[Any, ...] | None = None
        for ev in json_iter:
            a = ev.get("attempt")
            a = a if isinstance(a, int) else 0
            if attempt is not None and a != attempt:
                continue
            k = (a, *(repr(ev.get(c)) for c in sorted(CONSTANT_FIELDS)))
            if pending and (k != key or len(pending) >= chunk):
                yield _chunk_from_events(key[0] if key else 0, pending)
                pending = []
            key = k
            pending.append(ev)
        if pending:
            yield _chunk_from_events(key[0] if key else 0, pending)

    def bounds(self) -> dict[int, dict[str, float | int]]:
        """Per attempt: its first and last step number and time, in one pass of chunks.

        >>> StepLog(record.path).bounds()
        {1: {'steps': 230, 'min_step': 0, 'max_step': 229, 'first_t': ..., 'last_t': ...}}
        """
        out: dict[int, dict[str, float | int]] = {}
        for c in self.chunks():
            if not len(c):
                continue
            lo, hi = int(c.step.min()), int(c.step.max())
            t0, t1 = float(c.t.min()), float(c.t.max())
            b = out.get(c.attempt)
            if b is None:
                out[c.attempt] = {"steps": len(c), "min_step": lo, "max_step": hi,
                                  "first_t": t0, "last_t": t1}  # fmt: skip
            else:
                b["steps"] = int(b["steps"]) + len(c)
                b["min_step"], b["max_step"] = (
                    min(int(b["min_step"]), lo),
                    max(int(b["max_step"]), hi),
                )
                b["first_t"], b["last_t"] = (
                    min(float(b["first_t"]), t0),
                    max(float(b["last_t"]), t1),
                )
        return out

    def events(self, attempt: int | None = None) -> list[dict[str, Any]]:
        """Every step as an event dict: for small runs and old callers (10^5 steps: ~0.3 s)."""
        out: list[dict[str, Any]] = []
        for c in self.chunks(attempt=attempt):
            out.extend(c.events())
        return out

    def tail(self, n: int = 1, attempt: int | None = None) -> list[dict[str, Any]]:
        """The last ``n`` steps (of ``attempt``, else of the newest attempt with steps)."""
        import numpy as np

        segs = [s for s in self.segments if s.count and (attempt is None or s.attempt == attempt)]
        if not segs:
            evs = [
                ev for ev in self._json_steps() if attempt is None or ev.get("attempt") == attempt
            ]
            return evs[-n:] if n else []
        last_attempt = segs[-1].attempt
        out: list[dict[str, Any]] = []
        for seg in reversed([s for s in segs if s.attempt == last_attempt]):
            want = n - len(out)
            if want <= 0:
                break
            k = min(want, seg.count)
            with open_regular(seg.path, root=seg.path.parent) as f:
                f.seek(seg.offset + (seg.count - k) * seg.width)
                raw = np.fromfile(f, dtype=seg.dtype(), count=k)
            out = _decode(seg, raw).events() + out
        return out[-n:] if n else []


class StepTail:
    """Reads the records appended to one attempt's segments since the last poll.

    The supervisor's watch calls :meth:`poll` between its checks: a stat per segment,
    then only the new whole records, decoded as one chunk each; nothing is kept but the
    offsets.
    """

    def __init__(self, record_path: Path, attempt: int) -> None:
        self.record_path = Path(record_path)
        self.attempt = attempt
        self._done: dict[Path, int] = {}  # records already read per segment
        self._segments: dict[Path, Segment] = {}

    def poll(self, limit: int = CHUNK) -> list[StepChunk]:
        import numpy as np

        root = self.record_path / "attempts" / str(self.attempt) / "steps"
        try:
            files = sorted(p for p in root.iterdir() if p.suffix == SUFFIX)
        except OSError:
            return []
        out: list[StepChunk] = []
        for p in files:
            seg = self._segments.get(p)
            try:
                size = p.stat().st_size
            except OSError:
                continue
            if seg is None:
                found = read_segment_header(p)
                if isinstance(found, str):
                    continue
                seg = self._segments[p] = found
            count = max(0, size - seg.offset) // seg.width
            done = self._done.get(p, 0)
            if count <= done:
                continue
            n = min(count - done, limit)
            with open_regular(p, root=p.parent) as f:
                f.seek(seg.offset + done * seg.width)
                raw = np.fromfile(f, dtype=seg.dtype(), count=n)
            self._done[p] = done + int(raw.shape[0])
            if raw.shape[0]:
                out.append(_decode(seg, raw))
        return out
