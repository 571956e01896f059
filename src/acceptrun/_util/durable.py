"""Durable writes: the one helper every file of a run record goes through.

Two kinds of file exist in a record:

- whole files (JSON, TOML, logs copied in): written by :func:`write_atomic`, which writes a
  temporary file in the same directory, fsyncs it, renames it over the target and fsyncs
  the directory. A reader sees the old file or the new one, never half of either, even
  if the writer is SIGKILLed or the disk fills mid-write.
- append-only JSON Lines (events, telemetry): :func:`append_jsonl` writes each record with
  one ``write(2)`` on an ``O_APPEND`` descriptor, so writers in several processes never
  interleave; :func:`read_jsonl` skips a torn last line left by a crash, and the next
  append terminates it first (:func:`write_appended`), so no record is glued onto it.

Every reader of a file acceptrun did not just write itself goes through
:func:`loads_json` / :func:`read_json` / :func:`read_jsonl`, which bound depth and size
(:data:`MAX_JSON_DEPTH`, :data:`MAX_JSON_BYTES`, :data:`MAX_JSONL_LINE_BYTES`) and turn any
bad content into a ``ValueError`` or :class:`~acceptrun.errors.RecordError`. They open
through :func:`acceptrun._util.confined.open_regular`: only a regular file is read (a FIFO,
a device, a directory is refused unread), and given ``root=`` (the run record) no symlink
below it is followed.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from acceptrun._util.confined import open_regular
from acceptrun._util.redact import redact_record, redact_text
from acceptrun.errors import RecordError, UnsafeFileError, UserError

__all__ = [
    "MAX_JSONL_LINE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "STORAGE_FIXES",
    "AppendLog",
    "HeldWrites",
    "append_jsonl",
    "deeper_than",
    "fsync_dir",
    "jsonl_line",
    "loads_json",
    "read_bytes_bounded",
    "read_json",
    "read_jsonl",
    "storage_fault",
    "write_appended",
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


def write_atomic(
    path: str | Path, data: bytes | str | Writer, *, mode: int = 0o644, raw: bool = False
) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    ``data`` is bytes, text (UTF-8), or a callable that writes into the open binary file
    (for content too large to hold in memory). On any failure the temporary file is
    removed and the previous ``path``, if any, is left untouched.

    Text is what acceptrun writes (a report, an export, a note): it passes through the
    redactor (:mod:`acceptrun._util.redact`) unless ``raw=True``, which the few writers
    of the user's own text take (the frozen spec.toml that ``resume`` reads, a checkpoint
    manifest whose digest covers its text). Bytes and callables are payloads written as
    they are (checkpoint files, copies of the workload's logs).

    >>> write_atomic("verdict.json", b"{}")
    """
    path = Path(path)
    if isinstance(data, str) and not raw:
        data = redact_text(data)
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
        with contextlib.suppress(OSError):  # gone, or on a read-only file system
            os.unlink(tmp)
        if isinstance(exc, OSError) and (fault := storage_fault(exc)):
            raise UserError(
                f"could not write {path}: {fault} ({exc.strerror}); the previous copy, if "
                f"any, is intact. {STORAGE_FIXES[fault]}"
            ) from exc
        raise
    fsync_dir(path.parent)


# What a write's errno says about the file system, for messages that name the fix.
_FAULTS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk full",
    errno.EFBIG: "disk full",  # a file-size limit (RLIMIT_FSIZE) reached: the same remedy
    errno.EROFS: "read-only file system",
}
STORAGE_FIXES = {
    "disk full": "Free disk space (or raise the file-size limit) and retry.",
    "read-only file system": "Remount it read-write (or move the workspace) and retry.",
}


def storage_fault(exc: OSError) -> str | None:
    """``"disk full"`` or ``"read-only file system"`` when ``exc`` is one, else None.

    >>> storage_fault(OSError(errno.ENOSPC, "No space left on device"))
    'disk full'
    """
    return _FAULTS.get(exc.errno or 0)


def write_json_atomic(path: str | Path, obj: Any, *, raw: bool = False) -> None:
    """Write ``obj`` as pretty, key-sorted JSON through :func:`write_atomic`.

    Its strings are redacted (:func:`acceptrun._util.redact.redact_record`; keys are
    kept) unless ``raw=True``.
    """
    text = json.dumps(obj if raw else redact_record(obj), indent=2, sort_keys=True,
                      default=_json_default) + "\n"  # fmt: skip
    write_atomic(path, text, raw=True)


# Limits on what a reader accepts from a file acceptrun did not just write itself. No
# record acceptrun writes comes near them (a verdict.json is kilobytes, a manifest of
# 100,000 files about 15 MiB, nesting under 10 levels); past them the content is damaged
# or hostile, and is refused as such instead of exhausting the stack or the memory.
MAX_JSON_DEPTH = 64  # nested arrays/objects; deeper ones also break later readers' recursion
MAX_JSON_BYTES = 64 << 20  # one whole JSON file, bytes
MAX_JSONL_LINE_BYTES = 16 << 20  # one line of events.jsonl / telemetry.jsonl, bytes


def loads_json(
    data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int = MAX_JSON_BYTES
) -> Any:
    """Parse JSON within the limits; any bad content raises :class:`ValueError`.

    Bad JSON, bad UTF-8, nesting deeper than ``max_depth`` (RecursionError inside the
    parser, or deep enough to break a later recursive reader) and input too large for
    memory (MemoryError) all come out as one ``ValueError`` saying which.

    >>> loads_json("[" * 100 + "]" * 100)
    Traceback (most recent call last):
    ValueError: nested deeper than 64 levels
    """
    if len(data) > max_bytes:
        raise ValueError(f"larger than the {max_bytes >> 20} MiB limit ({len(data)} bytes)")
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    except MemoryError:
        raise ValueError("too large to hold in memory") from None
    # A document with fewer brackets than the limit cannot nest deeper: skip the walk
    # (one C-speed count instead of visiting every node of an events line).
    opens = (
        data.count(b"[") + data.count(b"{")
        if isinstance(data, bytes)
        else (data.count("[") + data.count("{"))
    )
    if opens > max_depth and deeper_than(obj, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    return obj


def deeper_than(obj: Any, limit: int) -> bool:
    """Whether arrays/objects nest more than ``limit`` levels (iterative: no recursion)."""
    stack = [(obj, 1)] if isinstance(obj, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def read_bytes_bounded(
    path: str | Path, limit: int = MAX_JSON_BYTES, *, root: str | Path | None = None
) -> bytes:
    """The bytes of ``path``; :class:`ValueError` when it holds more than ``limit`` bytes.

    Reads at most ``limit + 1`` bytes, so a file growing while read costs no more memory
    than the limit. OSError (missing, unreadable) passes through, and so does
    :class:`~acceptrun.errors.UnsafeFileError` (also an OSError): not a regular file, or
    a symlink below ``root`` (see :func:`~acceptrun._util.confined.open_regular`).
    """
    with open_regular(path, root=root) as f:
        # A regular file says its size: one over the limit is refused unread (a sparse
        # gigabyte costs nothing); a file growing meanwhile is cut at limit + 1 bytes.
        st = os.fstat(f.fileno())
        if st.st_size > limit:
            raise ValueError(f"larger than the {limit >> 20} MiB limit")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than the {limit >> 20} MiB limit")
    return data


def read_json(path: str | Path, *, root: str | Path | None = None) -> Any:
    """Read a JSON file of a record; a damaged one raises :class:`RecordError`.

    Damaged means: not JSON, not UTF-8, nested deeper than :data:`MAX_JSON_DEPTH`
    levels, or larger than :data:`MAX_JSON_BYTES` (64 MiB); not a regular file, or a
    symlink below ``root``, raises :class:`~acceptrun.errors.UnsafeFileError`.
    """
    try:
        return loads_json(read_bytes_bounded(path, root=root))
    except ValueError as exc:
        raise RecordError(
            f"{path} is not valid JSON ({exc}); the record is damaged. "
            "Restore it from a copy, or run `acceptrun index rebuild` to skip it."
        ) from exc


def jsonl_line(obj: Any, *, raw: bool = False) -> bytes:
    """One JSON record as a compact line of bytes, newline included; its strings
    redacted (:func:`acceptrun._util.redact.redact_record`) unless ``raw=True``."""
    if not raw:
        obj = redact_record(obj)
    return (json.dumps(obj, separators=(",", ":"), default=_json_default) + "\n").encode()


def append_jsonl(path: str | Path, obj: Any, *, sync: bool = False) -> None:
    """Append one JSON record as a line, with a single ``write(2)``.

    ``sync=True`` also fsyncs (lifecycle events); per-step events skip it because an fsync
    per step would stall the training loop, and the page cache survives a process crash.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        write_appended(fd, jsonl_line(obj), path)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


# The record an append writes after terminating a torn last line (see write_appended).
REPAIRED_KIND = "log_repaired"
_TAIL_SCAN = 1 << 20  # bytes searched back for the start of a torn line


def write_appended(fd: int, data: bytes, path: str | Path) -> None:
    """Append ``data`` to the O_APPEND descriptor ``fd``: every byte, after a whole line.

    A full disk can tear the last line (a ``write(2)`` that writes only part of a
    record, or a process killed mid-write). Appending to it would glue the next record
    onto the fragment and both would read as one garbled line, so a file that does not
    end with a newline is first terminated (the fragment stays, as evidence, and readers
    skip it as a damaged line) and a ``log_repaired`` record says how many bytes were
    torn. A short write is continued until every byte is written; a write that fails
    (ENOSPC, EFBIG, EROFS) raises its OSError with a note saying how much was written.
    ``fd`` must be open for reading too (O_RDWR), to look at the last byte.

    Every writer of a log holds an exclusive ``flock`` on it from the look at the last
    byte to the end of its write: without it, a writer would take another process's
    append still in flight (a large write(2) is not seen whole by a concurrent reader) for
    a torn line and cut into it. A writer killed mid-write drops its lock with its life,
    so the next one finds the true fragment. Where the file system has no locks (ENOLCK),
    the append goes ahead unlocked and leaves the last line as it is: a repair is only
    safe under the lock.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        locked = True
    except OSError:
        locked = False
    try:
        _write_appended(fd, data, path, check_torn=locked)
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _write_appended(fd: int, data: bytes, path: str | Path, *, check_torn: bool) -> None:
    size = os.fstat(fd).st_size if check_torn else 0
    if size and os.pread(fd, 1, size - 1) != b"\n":
        tail = os.pread(fd, min(size, _TAIL_SCAN), max(0, size - _TAIL_SCAN))
        cut = tail.rfind(b"\n")
        torn = len(tail) - cut - 1 if cut >= 0 else size if size <= _TAIL_SCAN else None
        repair = {"t": round(time.time(), 6), "kind": REPAIRED_KIND, "torn_bytes": torn,
                  "offset": None if torn is None else size - torn}  # fmt: skip
        data = b"\n" + jsonl_line(repair) + data
    view, done = memoryview(data), 0
    while done < len(data):
        try:
            n = os.write(fd, view[done:])
        except OSError as exc:
            exc.add_note(f"{path}: {done} of {len(data)} bytes of this append were written")
            raise
        if n <= 0:  # never for a regular file; fail loudly rather than loop forever
            raise OSError(
                errno.EIO, f"write(2) wrote nothing of {len(data) - done} bytes", str(path)
            )
        done += n


class HeldWrites(abc.ABC):
    """Records held briefly and written together (:class:`AppendLog`, the step log's writer).

    :meth:`_hold` keeps a record (under ``_lock``) and writes what is held, through the
    subclass's ``_write_held``, once ``FLUSH_RECORDS`` are held or the oldest is
    ``FLUSH_S`` old. A flusher thread writes what is still held ``FLUSH_S`` after it was
    first held, so a process that stops appending (blocked in a collective, an
    evaluation, a hang) still shows its last records. It sleeps on an event while nothing
    is held (a process that logs nothing, or has ended its loop, costs no wake-ups). A
    forked child (a data-loader worker) calls :meth:`_forget_parent`: the parent's held
    records are the parent's to write, and its lock may have been held at the fork.
    """

    FLUSH_S = 0.2
    FLUSH_RECORDS = 256
    FLUSHER_NAME = "acceptrun-flush"
    _pid: int  # the process that holds the records
    _lock: threading.Lock
    _held: list[Any]
    _flusher: threading.Thread | None
    _holding: threading.Event  # set while records are held: wakes the flusher

    def __init__(self) -> None:
        self._forget_parent()
        self._held_since = 0.0

    @abc.abstractmethod
    def _write_held(self) -> None:
        """Write every held record and clear ``_held`` (called under ``_lock``)."""

    def _hold(self, rec: Any) -> None:
        self._held.append(rec)
        now = time.monotonic()
        if len(self._held) == 1:
            self._held_since = now
            if self._flusher is None:
                self._start_flusher()
            self._holding.set()
        elif len(self._held) >= self.FLUSH_RECORDS or now - self._held_since >= self.FLUSH_S:
            self._write_held()

    def _start_flusher(self) -> None:
        pid, holding = os.getpid(), self._holding

        def flush_held() -> None:
            while self._pid == pid:  # a forked child starts its own
                holding.wait()
                with self._lock:
                    due = self._held_since + self.FLUSH_S - time.monotonic()
                    if self._held and due <= 0:
                        with contextlib.suppress(OSError):  # the next append reports it
                            self._write_held()
                    if not self._held:
                        holding.clear()  # under the lock: an append sets it again
                        continue
                time.sleep(max(due, 0.01))

        self._flusher = threading.Thread(target=flush_held, name=self.FLUSHER_NAME, daemon=True)
        self._flusher.start()

    def _forget_parent(self) -> None:
        self._pid, self._lock, self._held = os.getpid(), threading.Lock(), []
        self._flusher, self._holding = None, threading.Event()


class AppendLog(HeldWrites):
    """A JSONL file kept open for appending, for writers on a hot path.

    Opening the file for each record cost about 0.1 ms inside a training loop (whose
    caches the step had just evicted), and even one ``write(2)`` per step costs tens of
    microseconds there. So the descriptor stays open, and records appended with
    ``defer=True`` (step events) are held for at most ``FLUSH_S`` seconds or
    ``FLUSH_RECORDS`` records, then encoded and written together. Any other record writes the held ones
    first, in order, in the same ``write(2)``: a lifecycle event is never written ahead
    of the steps before it. What is still held is written by a flusher thread
    (:class:`HeldWrites`), so a process killed with SIGKILL loses at most the last
    ``FLUSH_S`` or so of deferred records. The descriptor is ``O_APPEND`` (records of
    several processes never interleave) and ``O_CLOEXEC``; a forked child drops what its
    parent held.
    """

    FLUSHER_NAME = "acceptrun-events"

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._fd: int | None = None

    def append(self, obj: Any, *, sync: bool = False, defer: bool = False) -> None:
        """Append one record; ``defer`` may hold it briefly, ``sync`` also fsyncs.

        A held record is encoded when it is written (one pass over many records is
        cheaper than one per step); it must not be changed after this call.
        """
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            if defer:
                self._hold(obj)
            else:
                self._write(obj, sync)

    def flush(self) -> None:
        """Write what is held now."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            if self._held:
                self._write_held()

    def _write_held(self) -> None:
        self._write(None, False)

    def _write(self, obj: Any, sync: bool) -> None:
        records = [*self._held, obj] if obj is not None else self._held
        self._held = []
        data = b"".join(jsonl_line(r) for r in records)
        if self._fd is None:
            self._fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
            )
        write_appended(self._fd, data, self.path)
        if sync:
            os.fsync(self._fd)

    def _after_fork(self) -> None:
        self._forget_parent()
        self._fd = None

    def close(self) -> None:
        """Write what is held and close the descriptor (in the process that opened it)."""
        if self._pid != os.getpid():
            return
        with contextlib.suppress(OSError):
            self.flush()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:
        self.close()


def read_jsonl(
    path: str | Path, *, damaged: list[str] | None = None, root: str | Path | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the records of a JSON Lines file; a torn or damaged line is skipped.

    A damaged line (not JSON, not an object, not UTF-8, nested deeper than
    :data:`MAX_JSON_DEPTH`, longer than :data:`MAX_JSONL_LINE_BYTES`) is skipped and,
    when ``damaged`` is given, described there (``"events.jsonl line 7: ..."``). A last
    line without its newline is one a writer is still writing or died writing: skipped
    silently (the next append terminates it, see :class:`AppendLog`). A line costs at
    most the line limit in memory, however long it is. A file that is not a regular one
    (a FIFO, a device, a directory, a symlink: a JSON Lines file is a log acceptrun
    appends to, never a link; with ``root``, no link below it either) is not read: it
    yields nothing, and is described in ``damaged`` when given.
    """
    name = Path(path).name
    try:
        f = open_regular(path, root=Path(path).parent if root is None else root)
    except FileNotFoundError:
        return
    except UnsafeFileError as exc:
        if damaged is not None:
            damaged.append(f"{name}: {exc.what}, neither followed nor read")
        return
    try:
        number = 0
        while raw := f.readline(MAX_JSONL_LINE_BYTES + 1):
            number += 1
            if not raw.endswith(b"\n"):
                if len(raw) <= MAX_JSONL_LINE_BYTES:
                    break  # torn last line: a writer died mid-record
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass  # skip the rest of an overlong line, a MiB at a time
                if damaged is not None:
                    limit = MAX_JSONL_LINE_BYTES >> 20
                    damaged.append(f"{name} line {number}: longer than the {limit} MiB limit")
                continue
            if raw.isspace():
                continue  # an empty line (a repaired tear raced by another writer)
            try:
                obj = loads_json(raw)
            except ValueError as exc:
                if damaged is not None:
                    damaged.append(f"{name} line {number}: skipped, {_first_line(exc)}")
                continue
            if isinstance(obj, dict):
                yield obj
            elif damaged is not None:
                damaged.append(f"{name} line {number}: skipped, not a JSON object")
    finally:
        f.close()


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        return item()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON: {obj!r}")
