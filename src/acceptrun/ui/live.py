"""Live feeds of the board, as server-sent events: a run's steps and state, its logs.

A feed follows a file by byte offset, like ``tail -f``: each poll reads what was
appended since the last one and sends the whole lines (a torn last line waits for the
next poll). The offset is the SSE event id, so a browser that reconnects (it sends
``Last-Event-ID``) gets exactly the lines it missed. The first message of a run's feed
holds the steps so far, thinned to what a chart can show; after that every new step is
sent as it is written (the client writes step events at least every 0.2 s).

Messages of ``run_feed``:

- ``steps``: ``[{"step", "t", "loss", "step_time", "throughput", "attempt"}, ...]``
- ``status``: what ``acceptrun top`` shows for the run (step, ETA, throughput, GPU or
  process use, cost so far), with ``status`` and ``live``; every ``STATUS_EVERY_S``
- ``end``: the run is no longer live; the page reloads its verdict
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from acceptrun._util.confined import open_regular
from acceptrun._util.controls import escape_controls
from acceptrun._util.durable import loads_json
from acceptrun._util.redact import redact_text
from acceptrun.errors import UnsafeFileError
from acceptrun.record.steplog import StepChunk, StepLog, segments
from acceptrun.record.steplog import _decode as decode_segment
from acceptrun.record.workspace import RunRecord
from acceptrun.ui.board import is_live, thin_rows

__all__ = [
    "POLL_S",
    "log_feed",
    "read_appended",
    "run_feed",
    "run_status",
    "sse",
    "step_row",
    "throughput_key",
]

POLL_S = 0.1  # seconds between looks at a followed file: the feed's added latency at most
STATUS_EVERY_S = 1.0  # seconds between status messages (each reads the ends of two files)
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies and browsers from timing out
_CHUNK = 4 << 20  # bytes read per poll at most; a backlog is sent over several polls


def sse(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One server-sent event; ``data`` is sent as one line of JSON.

    A NaN or an infinity (a diverged loss) is sent as null: the browser's JSON.parse
    refuses the NaN that Python's json writes, and would drop the whole message. Its
    strings (a metric's name, a run's) have their control and bidi characters escaped:
    the page puts them in as text, where a U+202E would still reorder what it shows.
    """
    head = f"id: {event_id}\n" if event_id is not None else ""
    data = _shown(data)
    try:
        body = json.dumps(data, default=str, allow_nan=False)
    except ValueError:
        body = json.dumps(_nan_as_null(data), default=str)
    return f"{head}event: {event}\ndata: {body}\n\n".encode()


def _shown(data: Any) -> Any:
    """``data`` with every string, keys too, through :func:`escape_controls`."""
    if isinstance(data, str):
        return escape_controls(data)
    if isinstance(data, dict):
        return {_shown(k): _shown(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_shown(v) for v in data]
    return data


def _nan_as_null(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _nan_as_null(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_nan_as_null(v) for v in data]
    return data


def read_appended(path: Path, offset: int, root: Path | None = None) -> tuple[list[bytes], int]:
    """The whole lines appended to ``path`` after byte ``offset``, and the offset after them.

    ``root``: the record (default: the log's folder); no link below it is followed.
    """
    try:
        with open_regular(path, root=root or path.parent) as f:  # a link, a FIFO: not read
            f.seek(offset)
            data = f.read(_CHUNK)
    except OSError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[: end + 1].splitlines(), offset + end + 1


def step_row(ev: dict[str, Any], key: str | None) -> dict[str, Any]:
    st = ev.get("step_time")
    rate = None
    if isinstance(st, int | float) and st > 0:
        amount = ev.get(key) if key else None
        rate = (float(amount) if isinstance(amount, int | float) else 1.0) / float(st)
    return {
        "step": ev.get("step"),
        "t": ev.get("t"),
        "loss": ev.get("loss"),
        "step_time": st,
        "throughput": rate,
        "attempt": ev.get("attempt"),
    }


def _steps(lines: list[bytes], key: str | None) -> list[dict[str, Any]]:
    out = []
    for raw in lines:
        try:
            ev = loads_json(raw)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("kind") == "step":
            out.append(step_row(ev, key))
    return out


def throughput_key(record: RunRecord) -> tuple[str | None, str]:
    """The step field that throughput counts (samples, tokens, or none: steps/s), and its unit."""
    import contextlib

    from acceptrun.errors import SpecError
    from acceptrun.spec.model import AcceptanceSpec

    unit = AcceptanceSpec().throughput_unit  # a missing or damaged spec: the default
    with contextlib.suppress(SpecError):
        unit = record.spec.acceptance.throughput_unit
    return {"samples/s": "samples", "tokens/s": "tokens"}.get(unit), unit


def run_status(record: RunRecord) -> dict[str, Any]:
    """What ``acceptrun top`` computes for the run, plus its status and whether it is live."""
    from acceptrun.report.top import run_row

    state = record.state
    row = run_row(record, state)
    row["live"] = is_live(record, state)
    return row


class _StepCursor:
    """New records of every step log segment, in (attempt, sequence) order.

    The position is the number of records read over all segments: the feed's SSE id, so
    a browser that reconnects gets the steps after the last it had.
    """

    def __init__(self, record: RunRecord, position: int = 0) -> None:
        self.record = record
        self.position = position
        self._done: dict[Path, int] = {}
        self._skip = position  # records already sent before a reconnect

    def poll(self, limit: int = 1 << 16) -> list[StepChunk]:
        import numpy as np

        segs, _problems = segments(self.record.path)
        out: list[StepChunk] = []
        for seg in segs:
            done = self._done.get(seg.path, 0)
            if self._skip:
                take = min(self._skip, seg.count - done)
                done += take
                self._skip -= take
                self._done[seg.path] = done
            if seg.count <= done:
                continue
            n = min(limit, seg.count - done)
            with open_regular(seg.path, root=seg.path.parent) as f:
                f.seek(seg.offset + done * seg.width)
                raw = np.fromfile(f, dtype=seg.dtype(), count=n)
            self._done[seg.path] = done + int(raw.shape[0])
            self.position += int(raw.shape[0])
            if raw.shape[0]:
                out.append(decode_segment(seg, raw))
        return out


def _chunk_rows(chunk: StepChunk, key: str | None, picks: Any = None) -> list[dict[str, Any]]:
    """Rows of a chunk (those at ``picks`` only, when given), as :func:`step_row` makes them."""
    import numpy as np

    if picks is not None:
        idx = np.asarray(sorted(picks), dtype=np.int64)
        chunk = StepChunk(
            chunk.attempt, chunk.step[idx], chunk.t[idx],
            {k: v[idx] for k, v in chunk.values.items()},
            {k: v[idx] for k, v in chunk.present.items()}, chunk.constants,
        )  # fmt: skip
    return [step_row(ev, key) for ev in chunk.events()]


def _picks(chunk: StepChunk, key: str | None, buckets: int) -> set[int]:
    """Row indices of a chunk that keep each charted value's min and max per bucket."""
    import numpy as np

    n = len(chunk)
    keep = {0, n - 1}
    st = chunk.values.get("step_time")
    ys = [chunk.values.get("loss"), st]
    if st is not None:
        amount = chunk.values.get(key) if key else None
        with np.errstate(divide="ignore", invalid="ignore"):
            num = np.where(np.isfinite(amount), amount, 1.0) if amount is not None else 1.0
            ys.append(np.where(st > 0, num / st, np.nan))
    b = (np.arange(n) * buckets) // n
    for y in ys:
        if y is None:
            continue
        ok = np.isfinite(y)
        if not ok.any():
            continue
        for sign in (1.0, -1.0):  # min, then max: the first row of each bucket after sorting
            order = np.lexsort((np.where(ok, sign * y, np.inf), b))
            first = np.ones(n, dtype=bool)
            first[1:] = b[order][1:] != b[order][:-1]
            chosen = order[first]
            keep.update(int(i) for i in chosen[ok[chosen]])
    return keep


def _backlog(record: RunRecord, key: str | None, budget: int = 1400) -> list[dict[str, Any]]:
    """The run's steps so far, thinned to about ``budget`` rows, read in chunks: rows are
    built only for the rows a chart keeps (each value's min and max per bucket)."""
    log = StepLog(record.path)
    total = log.count()
    rows: list[dict[str, Any]] = []
    for chunk in log.chunks(1 << 16):
        if not log.segments or total <= budget:
            rows += _chunk_rows(chunk, key)
            continue
        buckets = max(1, -(-budget * len(chunk) // total))
        rows += _chunk_rows(chunk, key, _picks(chunk, key, buckets))
    return thin_rows(rows, "step", ("loss", "step_time", "throughput"))


def run_feed(
    record: RunRecord, offset: int, stopping: Callable[[], bool], *, first: bool = True
) -> Iterator[bytes]:
    """The run's live feed from step record ``offset`` of its step log, until it is no
    longer live (the SSE id is the number of step records sent).

    ``first``: the opening message carries the steps so far (thinned), read in chunks.
    """
    key, _ = throughput_key(record)
    cursor = _StepCursor(record, offset)
    if first:
        rows = _backlog(record, key)
        cursor = _StepCursor(record, StepLog(record.path).count())
        cursor.poll(0)  # marks every record counted as sent
        yield sse("steps", rows, cursor.position)
    last_status = last_sent = 0.0
    while not stopping():
        chunks = cursor.poll()
        now = time.monotonic()
        rows = [r for c in chunks for r in _chunk_rows(c, key)]
        if rows:
            yield sse("steps", rows, cursor.position)
            last_sent = now
        if now - last_status >= STATUS_EVERY_S:
            last_status = now
            status = run_status(record)
            yield sse("status", status, cursor.position)
            last_sent = now
            if not status["live"]:
                more = cursor.poll()
                if not more:  # everything written before the end was sent
                    yield sse("end", {"status": status.get("status")}, cursor.position)
                    return
                rows = [r for c in more for r in _chunk_rows(c, key)]
                yield sse("steps", rows, cursor.position)
                continue
        if now - last_sent >= KEEPALIVE_S:
            yield b": keepalive\n\n"
            last_sent = now
        if not chunks:
            time.sleep(POLL_S)


def log_files(record: RunRecord) -> list[tuple[int, str, Path]]:
    """(attempt, stdout|stderr, path) of the run's logs, in attempt order."""
    out = []
    attempts = record.path / "attempts"
    numbers = (
        sorted(int(p.name) for p in attempts.iterdir() if p.name.isdigit())
        if attempts.is_dir()
        else []
    )
    for n in numbers:
        for stream in ("stdout", "stderr"):
            path = record.attempt_dir(n) / f"{stream}.log"
            if path.exists():
                out.append((n, stream, path))
    return out


def log_tail(path: Path, max_bytes: int = 64 * 1024, root: Path | None = None) -> tuple[str, int]:
    """The last ``max_bytes`` of a log as text, and the file's size (where a feed continues).

    ``root``: the record (default: the log's folder); no link below it is followed.
    """
    try:
        with open_regular(path, root=root or path.parent) as f:  # a link, a FIFO: not read
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except UnsafeFileError as exc:
        return f"[{exc}]", 0
    except OSError:
        return "", 0
    return data.decode("utf-8", errors="replace"), size


def log_feed(
    record: RunRecord, offsets: dict[str, int], stopping: Callable[[], bool]
) -> Iterator[bytes]:
    """New lines of every log of the run (``attempt/stream`` -> offset), until it ends.

    Messages: ``line`` ``{"log": "1/stdout", "text": ...}``; ``end`` once the run is not
    live and nothing is left to send.
    """
    last_check = last_sent = 0.0
    while not stopping():
        sent = False
        for n, stream, path in log_files(record):
            name = f"{n}/{stream}"
            lines, after = read_appended(path, offsets.get(name, 0), record.path)
            if lines:
                offsets[name] = after
                text = b"\n".join(lines).decode("utf-8", errors="replace")
                # Shown as text by the page: control and bidi characters as escapes. Redacted
                # before it is JSON-encoded (in there a quote is \", which hides a
                # `"password": "x"` form from the send's own pass).
                yield sse("line", {"log": name, "text": escape_controls(redact_text(text))})
                sent = True
        now = time.monotonic()
        if sent:
            last_sent = now
        if now - last_check >= STATUS_EVERY_S:
            last_check = now
            state = record.state
            if not is_live(record, state) and not sent:
                yield sse("end", {"status": state.get("status")})
                return
        if now - last_sent >= KEEPALIVE_S:
            yield b": keepalive\n\n"
            last_sent = now
        if not sent:
            time.sleep(POLL_S)


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
