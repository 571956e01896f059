"""Files a command writes where the user said (``-o FILE``): never over what the user wrote.

A command's output may replace a file only when that file is the same command's earlier
output (it carries the command's ``mark``: a header comment, a generator tag, a manifest
field), or when ``--force`` says so. It never replaces a file the command reads (the spec
it exports, the data it hashes), not even with ``--force``: the user would lose the
input and keep only what was derived from it. The write itself is atomic
(:func:`acceptrun._util.durable.write_atomic`) and keeps the permission bits of the file
it replaces.

    claim_output(path, mark="# Written by `acceptrun export skypilot`", force=args.force,
                 inputs=[spec_path], what="SkyPilot task")
    write_output(path, text, mark=..., force=..., inputs=..., what=...)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from acceptrun._util.durable import write_atomic
from acceptrun.errors import UserError

__all__ = ["MARK_WINDOW", "claim_output", "is_own_output", "write_output"]

# Bytes at each end of an existing file searched for the mark: a header comment sits in
# the first, the last field of a key-sorted JSON manifest ("kind" after "files") in the
# last. A file of any size is read for at most twice this.
MARK_WINDOW = 8192


def is_own_output(path: Path, mark: str) -> bool:
    """Whether the regular file ``path`` carries ``mark`` near its start or its end."""
    needle = mark.encode("utf-8")
    try:
        with path.open("rb") as f:  # a regular file (the caller checked): no FIFO to block on
            head = f.read(MARK_WINDOW)
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - MARK_WINDOW))
            tail = f.read(MARK_WINDOW)
    except OSError:
        return False
    return needle in head or needle in tail


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (a hard link, a symlink, ``./x`` and ``x``)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is missing: compare what the names resolve to
        return a.resolve() == b.resolve()


def claim_output(
    path: Path,
    *,
    mark: str,
    force: bool,
    inputs: Iterable[Path] = (),
    what: str = "output",
    flag: str = "-o",
    parents: bool = False,
) -> None:
    """Raise :class:`UserError` unless ``path`` may be written as this command's output.

    Refused: any of ``inputs`` (even with ``force``); a folder; an existing file that is
    not this command's earlier output (no ``mark``), a symlink, FIFO or device, unless
    ``force``; a path whose folder is missing (unless ``parents``: the caller creates it).
    Call it before any costly work, so a refusal costs nothing.
    """
    for source in inputs:
        if _same(path, Path(source)):
            raise UserError(
                f"{flag} {path}: refused, it is {source}, which this command reads; give "
                f"another {flag} (--force never replaces a command's own input)"
            )
    try:
        st = path.lstat()
    except FileNotFoundError:
        if not parents and not path.parent.is_dir():
            raise UserError(
                f"{flag} {path}: the folder {path.parent} does not exist; create it or give "
                f"another {flag}"
            ) from None
        return
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot be examined ({exc.strerror}); give another "
                        f"{flag}") from None  # fmt: skip
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {path}: is a folder; give a file name in it, e.g. "
                        f"{flag} {path / 'out'}")  # fmt: skip
    if force:
        return
    if not stat.S_ISREG(st.st_mode):
        why = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise UserError(
            f"{flag} {path}: refused, it exists and is {why}; pass --force to replace it, "
            f"or give another {flag}"
        )
    if not is_own_output(path, mark):
        raise UserError(
            f"{flag} {path}: refused, the file exists and is not a {what} acceptrun wrote "
            f"(it lacks {mark!r}); pass --force to replace it, or give another {flag}"
        )


def write_output(
    path: Path,
    data: str | bytes,
    *,
    mark: str,
    force: bool,
    inputs: Iterable[Path] = (),
    what: str = "output",
    flag: str = "-o",
    mode: int | None = None,
    raw: bool = False,
) -> None:
    """:func:`claim_output`, then write ``data`` atomically.

    ``mode``: the new file's permission bits; None keeps those of the file it replaces
    (a user's chmod survives a re-export), else 0644. ``raw``: as for write_atomic.
    """
    claim_output(path, mark=mark, force=force, inputs=inputs, what=what, flag=flag)
    if mode is None:
        try:
            st = path.stat()
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            write_atomic(path, data, raw=raw)  # a new file: 0644 less the umask
            return
        mode = stat.S_IMODE(st.st_mode)
    write_atomic(path, data, mode=mode, raw=raw)
    path.chmod(mode)  # the umask narrowed the new file; the one it replaced had its own
