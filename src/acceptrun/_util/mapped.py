"""Private memory maps of files: the one read of a verified restore.

A restore maps the file instead of reading it into memory of its own: the map shares the
page cache's pages, so there is no copy into a new buffer and no fresh page to fault in
(on the project's VM touching 100 MB of fresh memory cost 0.3 s, hashing and copying a
mapped file from the page cache 0.01 s). The bytes are hashed from the map, then copied
where they belong.
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

from acceptrun._util.hashing import CHUNK, Hasher

__all__ = ["hash_range", "map_private"]


def map_private(fileno: int, size: int) -> mmap.mmap:
    """``size`` bytes of the open file ``fileno``, mapped private and writable.

    Copy-on-write: nothing written through the map reaches the file, and a tensor made on
    it with ``torch.frombuffer`` needs no read-only warning. No MAP_POPULATE: on a
    writable private map it faults every page in for writing, which copies them (7x
    slower, measured). A file truncated by another process while mapped ends this one
    with SIGBUS when a lost page is touched: map only files that are renamed and
    deleted, never rewritten, and only for as long as a load takes.
    """
    mapped = mmap.mmap(fileno, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with contextlib.suppress(AttributeError, OSError):  # not every platform has madvise
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    return mapped


def hash_range(hasher: Hasher, buffer: Any, start: int, end: int) -> None:
    """Feed ``buffer[start:end]`` to ``hasher`` in chunks, without copying it."""
    view = memoryview(buffer)
    try:
        for at in range(start, end, CHUNK):
            hasher.update(view[at : min(at + CHUNK, end)])
    finally:
        view.release()
