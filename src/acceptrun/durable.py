"""Durable writes: the one helper every file of a run record goes through.

Two kinds of file exist in a record:

- whole files (JSON, TOML, logs copied in): written by :func:`write_atomic`, which writes a
  temporary file in the same directory, fsyncs it, renames it over the target and fsyncs
  the directory. A reader sees the old file or the new one, never half of either, even
  if the writer is SIGKILLed or the disk fills mid-write.
- append-only JSON Lines (events, telemetry): :func:`append_jsonl` writes each record with
  one ``write(2)`` on an ``O_APPEND`` descriptor, so writers in several processes never
  interleave; :func:`read_jsonl` skips a torn last line left by a crash.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from acceptrun.errors import RecordError, UserError

__all__ = [
    "append_jsonl",
    "fsync_dir",
    "read_json",
    "read_jsonl",
    "write_atomic",
    "write_json_atomic",
]

Writer = Callable[[IO[bytes]], None]


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so a rename or a new file in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes | str | Writer, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    ``data`` is bytes, text (UTF-8), or a callable that writes into the open binary file
    (for content too large to hold in memory). On any failure the temporary file is
    removed and the previous ``path``, if any, is left untouched.

    >>> write_atomic("verdict.json", b"{}")
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise UserError(
                f"could not write {path}: {exc.strerror}; the previous copy, if any, is "
                "intact. Free disk space (or raise the file-size limit) and retry."
            ) from exc
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as pretty, key-sorted JSON through :func:`write_atomic`."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"
    write_atomic(path, text)


def read_json(path: str | Path) -> Any:
    """Read a JSON file of a record; a damaged one raises :class:`RecordError`."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise RecordError(
            f"{path} is not valid JSON ({exc}); the record is damaged. "
            "Restore it from a copy, or run `acceptrun index rebuild` to skip it."
        ) from exc


def append_jsonl(path: str | Path, obj: Any, *, sync: bool = False) -> None:
    """Append one JSON record as a line, with a single ``write(2)``.

    ``sync=True`` also fsyncs (lifecycle events); per-step events skip it because an fsync
    per step would stall the training loop, and the page cache survives a process crash.
    """
    line = (json.dumps(obj, separators=(",", ":"), default=_json_default) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the records of a JSON Lines file; a torn or garbled line is skipped."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed in finally; a generator needs it open
    except FileNotFoundError:
        return
    try:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # torn last line: a writer died mid-record
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(obj, dict):
                yield obj
    finally:
        f.close()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        return item()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON: {obj!r}")
