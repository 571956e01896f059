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
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from acceptrun._util.durable import loads_json
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
    """One server-sent event; ``data`` is sent as one line of JSON."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


def read_appended(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The whole lines appended to ``path`` after byte ``offset``, and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(_CHUNK)
    except FileNotFoundError:
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
    from acceptrun.spec.model import AcceptanceSpec, load_spec

    unit = AcceptanceSpec().throughput_unit  # a missing or damaged spec: the default
    with contextlib.suppress(SpecError):
        unit = load_spec(record.spec_path).acceptance.throughput_unit
    return {"samples/s": "samples", "tokens/s": "tokens"}.get(unit), unit


def run_status(record: RunRecord) -> dict[str, Any]:
    """What ``acceptrun top`` computes for the run, plus its status and whether it is live."""
    from acceptrun.report.top import run_row

    state = record.state
    row = run_row(record, state)
    row["live"] = is_live(record, state)
    return row


def run_feed(
    record: RunRecord, offset: int, stopping: Callable[[], bool], *, first: bool = True
) -> Iterator[bytes]:
    """The run's live feed from byte ``offset`` of events.jsonl, until it is no longer live.

    ``first``: the opening message carries the steps before ``offset`` too (thinned).
    """
    key, _ = throughput_key(record)
    path = record.events_path
    if first:
        lines, offset = read_appended(path, 0)
        while True:  # a long run's backlog takes several reads
            more, after = read_appended(path, offset)
            if not more:
                break
            lines += more
            offset = after
        rows = thin_rows(_steps(lines, key), "step", ("loss", "step_time", "throughput"))
        yield sse("steps", rows, offset)
    last_status = last_sent = 0.0
    while not stopping():
        lines, offset_after = read_appended(path, offset)
        now = time.monotonic()
        if lines:
            offset = offset_after
            rows = _steps(lines, key)
            if rows:
                yield sse("steps", rows, offset)
                last_sent = now
        if now - last_status >= STATUS_EVERY_S:
            last_status = now
            status = run_status(record)
            yield sse("status", status, offset)
            last_sent = now
            if not status["live"]:
                more, _ = read_appended(path, offset)
                if not more:  # everything written before the end was sent
                    yield sse("end", {"status": status.get("status")}, offset)
                    return
                continue
        if now - last_sent >= KEEPALIVE_S:
            yield b": keepalive\n\n"
            last_sent = now
        if not lines:
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


def log_tail(path: Path, max_bytes: int = 64 * 1024) -> tuple[str, int]:
    """The last ``max_bytes`` of a log as text, and the file's size (where a feed continues)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
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
            lines, after = read_appended(path, offsets.get(name, 0))
            if lines:
                offsets[name] = after
                text = b"\n".join(lines).decode("utf-8", errors="replace")
                yield sse("line", {"log": name, "text": text})
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
