"""Whether a script's checkpoint file is whole, from its own format.

A watched checkpoint (supervisor/external.py) is complete once it held still for
``checkpoint.settle``; a file that no process holds open for writing and whose format
proves it whole is complete at once, and can be trusted after a kill. :func:`whole`
names the test a file passed:

- a zip (``torch.save``'s format since torch 1.6, ``numpy.savez``): the end-of-central-
  directory record is found and every member's data lies inside the file;
- safetensors: the 8-byte header length and the JSON header parse, and the last tensor
  ends exactly at the end of the file;
- ``.npy``: the header parses and the array's bytes end exactly at the end of the file;
- JSON (a file that starts with ``{`` or ``[``, up to 64 MB): it parses.

Anything else (a raw pickle, a format of the script's own) is unknown: it waits for
``settle`` and is not trusted after a kill. A directory is whole when every file in it is
(the caller adds what a directory needs besides: see ``CheckpointWatcher``).

>>> whole(Path("out/ckpt.pt"))          # doctest: +SKIP
'zip: central directory intact, 14 members inside the file'
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

__all__ = ["whole", "whole_dir"]

JSON_MAX = 64 << 20  # bytes of JSON parsed to prove a file whole; larger is not tried


def whole(path: str | os.PathLike[str]) -> str | None:
    """The test ``path`` passed as a whole file of its format, or None (unknown or torn)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04") or (head.startswith(b"PK\x05\x06") and size == 22):
        return _zip(p, size)
    if head.startswith(b"\x93NUMPY"):
        return _npy(p, size)
    if p.suffix == ".safetensors" or _looks_like_safetensors(head, size):
        return _safetensors(p, size)
    if head.lstrip()[:1] in (b"{", b"["):
        return _json(p, size)
    return None


def whole_dir(path: str | os.PathLike[str]) -> tuple[str | None, list[str]]:
    """(a summary of the tests every regular file passed, or None; the relative names)."""
    names: list[str] = []
    tests: dict[str, int] = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, path)
            test = whole(full)
            if test is None:
                return None, names
            names.append(rel)
            kind = test.split(":", 1)[0]
            tests[kind] = tests.get(kind, 0) + 1
    if not names:
        return None, names
    parts = ", ".join(f"{n} {k}" for k, n in sorted(tests.items()))
    return f"directory: all {len(names)} files whole ({parts})", names


def _zip(p: Path, size: int) -> str | None:
    try:
        with zipfile.ZipFile(p) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    for info in infos:
        if info.header_offset + 30 + len(info.filename) + info.compress_size > size:
            return None
    return f"zip: central directory intact, {len(infos)} members inside the file"


def _npy(p: Path, size: int) -> str | None:
    try:
        import numpy as np
        from numpy.lib import format as npformat

        with open(p, "rb") as f:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, _order, dtype = npformat.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _order, dtype = npformat.read_array_header_2_0(f)
            else:
                return None
            if dtype.hasobject:
                return None
            offset = f.tell()
    except (ValueError, OSError, EOFError):
        return None
    count = 1
    for dim in shape:
        count *= int(dim)
    if offset + count * np.dtype(dtype).itemsize != size:
        return None
    return "npy: header and array bytes match the size"


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= size - 8 and head[8:9] == b"{"


def _safetensors(p: Path, size: int) -> str | None:
    try:
        with open(p, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, 100 << 20):
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            return None
        end = max(end, int(offsets[1]))
    if 8 + n + end != size:
        return None
    return f"safetensors: header and {len(header) - ('__metadata__' in header)} tensors end at the file's end"


def _json(p: Path, size: int) -> str | None:
    if size > JSON_MAX:
        return None
    try:
        with open(p, "rb") as f:
            json.loads(f.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return "json: parses"
