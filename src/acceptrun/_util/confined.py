"""Opening a file to read it: only a regular file, and never through a link out of its root.

Every file acceptrun reads may have been replaced by something hostile: a symlink to the
user's private key or to ``/dev/zero``, a FIFO (opening one for reading blocks until a
writer comes, which may be never), a device, a directory. :func:`open_regular` is the one
way the readers open a file (:mod:`acceptrun._util.durable`'s bounded readers, the step
log, the liveness probe, the bundle, the board):

- it opens with ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for a writer) and
  ``O_NOCTTY``, then ``fstat``\\s the open descriptor: anything but a regular file is
  closed unread and refused, so what is checked is what would be read (no race between a
  check and the open);
- given ``root`` (a run record, a workspace), it walks from ``root`` one part at a time
  with ``openat`` and ``O_NOFOLLOW``: a symlink anywhere below ``root`` is refused, never
  followed, whether it leads out or stays inside. acceptrun never writes a symlink into a
  record, so one found there was put there by someone else, and following even an inside
  link would let a later swap of its target escape. ``root`` itself is opened as given
  (a workspace the user placed behind a link of their own is the user's choice).

A refusal is :class:`~acceptrun.errors.UnsafeFileError` (a RecordError and an OSError, so a
reader that skips an unreadable file skips this one too), naming the file and what it is,
never the target of a link: a link's target path may itself show a user's home layout.

    with open_regular(run_dir / "events.jsonl", root=run_dir) as f: ...
    open_regular(ws / "prices.toml", root=ws)   # UnsafeFileError: ... is a symbolic link ...
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from acceptrun._util.paths import escape_problem
from acceptrun.errors import UnsafeFileError

__all__ = ["describe_mode", "open_regular"]

_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
_DIR = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY | os.O_NOFOLLOW

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def describe_mode(mode: int) -> str:
    """What a ``st_mode`` is, in words (``"a FIFO (named pipe)"``); ``"a regular file"``."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _refuse(path: Path, what: str) -> UnsafeFileError:
    fix = "replace it with the file it stands for (restore it from a copy) or remove it"
    return UnsafeFileError(
        f"{path} is {what}, not a regular file, so it is neither followed nor read; {fix}",
        path=str(path), what=what,
    )  # fmt: skip


def _what_at(dir_fd: int, name: str) -> str | None:
    """What ``name`` in ``dir_fd`` is when it is not a regular file (lstat: links not followed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return None if stat.S_ISREG(st.st_mode) else describe_mode(st.st_mode)


def _parts(root: Path, path: Path) -> list[str]:
    """``path``'s parts below ``root`` (lexically), refused when it is not below it."""
    root, path = Path(os.path.abspath(root)), Path(os.path.abspath(path))  # lexical only
    rel = path.relative_to(root) if path.is_relative_to(root) else None
    text = rel.as_posix() if rel is not None else ""
    if rel is None or text == "." or (why := escape_problem(text)) is not None:
        why = "not under it" if rel is None or text == "." else why
        raise UnsafeFileError(
            f"{path} is not a file inside {root} ({why}); acceptrun reads only the files "
            "of the record it was given",
            path=str(path), what="outside its root",
        )  # fmt: skip
    return list(rel.parts)


def _open_below(root: Path, path: Path) -> int:
    """A descriptor of ``path`` opened from ``root`` without following any link below it."""
    parts = _parts(root, path)
    fd = os.open(root, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                what = _what_at(fd, part)
                if what is not None and what != "a directory":
                    raise _refuse(root.joinpath(*parts[: i + 1]), what) from None
                raise OSError(
                    exc.errno, exc.strerror, str(root.joinpath(*parts[: i + 1]))
                ) from None
            os.close(fd)
            fd = nxt
        try:
            return os.open(parts[-1], _READ | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link
                raise _refuse(path, "a symbolic link") from None
            raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        os.close(fd)


def open_regular(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> BinaryIO:
    """``path`` open for reading (binary) when it is a regular file; else UnsafeFileError.

    With ``root``, ``path`` must lie under it and no part below ``root`` may be a link;
    without, links are followed (a spec given on the command line may be one) but what
    they lead to must still be a regular file. A missing file raises FileNotFoundError.
    """
    path = Path(path)
    fd = _open_below(Path(root), path) if root is not None else os.open(path, _READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, describe_mode(st.st_mode))
        # Blocking reads again: O_NONBLOCK was only for the open (a FIFO's), and a regular
        # file ignores it anyway.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
