"""Watched files that exist before a fresh run's first attempt: named, then refused, moved
aside or declared the starting point.

A script that loads its snapshot whenever the file exists continues from whatever an
earlier run left there, and a run that began from a file it did not write must say so.
Before the first attempt of a new record, preflight lists every match of
``checkpoint.watch`` (:func:`find_leftovers`: path, size, hash, mtime; provenance keeps the
list) and ``checkpoint.existing`` says what happens:

- ``"refuse"`` (the default): preflight fails, naming each file and both fixes;
- ``"move"``: each file or directory is renamed into the record's ``leftovers/`` (kept as
  evidence, never deleted) before the first attempt;
- ``"start"``: kept where it is and declared the run's starting point; the verdict names
  it.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from acceptrun._util.hashing import hash_bytes, hash_file
from acceptrun._util.paths import inside
from acceptrun._util.units import format_bytes

__all__ = ["describe", "find_leftovers", "move_aside", "watched_matches"]


def watched_matches(
    patterns: Iterable[str], workdir: Path, exclude: Sequence[str | os.PathLike[str]] = ()
) -> tuple[list[str], list[tuple[str, str]]]:
    """(absolute paths the globs match inside ``workdir``, (path, target) of symlinks out).

    Hidden names are never matched; ``exclude`` (the store, the record) is skipped.
    """
    skip = [os.path.realpath(x) for x in exclude]
    found: set[str] = set()
    out: list[tuple[str, str]] = []
    for pattern in patterns:
        full = os.path.join(str(workdir), os.path.expanduser(pattern))
        for hit in glob.glob(full, recursive=True):
            path = os.path.abspath(hit)
            real = os.path.realpath(path)
            if any(real == x or real.startswith(x + os.sep) for x in skip):
                continue
            if not inside(workdir, path):
                out.append((path, real))
                continue
            found.add(path)
    return sorted(found), out


def find_leftovers(
    patterns: Iterable[str], workdir: Path, exclude: Sequence[str | os.PathLike[str]] = ()
) -> list[dict[str, Any]]:
    """Each existing match: path (relative to the workdir), bytes, files, hash, mtime."""
    entries = []
    for path in watched_matches(patterns, workdir, exclude)[0]:
        files = (
            [Path(r) / f for r, _, fs in os.walk(path) for f in sorted(fs)]
            if os.path.isdir(path)
            else [Path(path)]
        )
        size, digests, mtime = 0, [], os.stat(path).st_mtime
        for f in files:
            st = f.stat()
            size += st.st_size
            mtime = max(mtime, st.st_mtime)
            digests.append(hash_file(f)[0])
        entries.append(
            {
                "path": os.path.relpath(path, workdir),
                "bytes": size,
                "files": len(files),
                # a directory's hash is that of its files' hashes, in name order
                "hash": digests[0] if len(files) == 1 and not os.path.isdir(path) else _of(digests),
                "mtime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime)),
            }
        )
    return entries


def _of(digests: list[str]) -> str:
    return hash_bytes("\n".join(digests).encode())


def describe(entry: dict[str, Any]) -> str:
    """``out/snapshot.pt (12.0 MB, xxh3_128:1f2e3d4c..., modified 2026-12-03T10:00:00Z)``."""
    files = f", {entry['files']} files" if entry.get("files", 1) != 1 else ""
    return (
        f"{entry['path']} ({format_bytes(entry['bytes'])}{files}, {str(entry['hash'])[:25]}..., "
        f"modified {entry['mtime']})"
    )


def move_aside(entries: list[dict[str, Any]], workdir: Path, into: Path) -> list[str]:
    """Rename each entry into ``into`` (same relative path); returns where each went.

    A rename only, so nothing is copied half-way: a file on another filesystem than the
    record raises OSError naming it and the fix, and what was moved before it stays moved.
    """
    moved = []
    for entry in entries:
        source = workdir / entry["path"]
        dest = into / entry["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(source, dest)
        except OSError as exc:
            raise OSError(
                f'checkpoint.existing = "move": {source} could not be moved to {dest} '
                f"({exc.strerror}); move it aside by hand, or set checkpoint.existing = "
                '"start" to begin from it'
            ) from exc
        moved.append(str(dest))
    return moved
