"""The safetensors file of a training-state checkpoint: acceptrun's own writer and reader.

The writer streams tensor by tensor (:func:`write_safetensors`); the reader checks the
header against the format and the file size (:func:`read_header`) and reads the tensors
in file order (:func:`read_tensors`) or maps them (:func:`map_tensors`), hashing the
bytes on the way when asked (:class:`HashingReader`). Both are this package's own, so
restoring needs no package the save did not, and nothing here unpickles.
"""

from __future__ import annotations

import io
import json
import math
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from acceptrun.errors import AcceptrunRuntimeError, RecordError

if TYPE_CHECKING:
    import torch

__all__ = [
    "BinarySink",
    "Entry",
    "HashingReader",
    "TensorsHashMismatch",
    "dtype_codes",
    "map_tensors",
    "on_host",
    "read_header",
    "read_tensors",
    "write_safetensors",
]

# torch dtype name -> safetensors dtype code (the ones this torch has, see dtype_codes()).
_DTYPE_CODES = [
    ("float64", "F64"),
    ("float32", "F32"),
    ("float16", "F16"),
    ("bfloat16", "BF16"),
    ("int64", "I64"),
    ("int32", "I32"),
    ("int16", "I16"),
    ("int8", "I8"),
    ("uint8", "U8"),
    ("bool", "BOOL"),
    ("complex64", "C64"),
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
]


def _uint8() -> torch.dtype:
    import torch

    return torch.uint8


_DTYPES_CACHE: dict[Any, str] = {}


def dtype_codes() -> dict[torch.dtype, str]:
    """torch dtype -> safetensors dtype code, for the dtypes this torch has."""
    if not _DTYPES_CACHE:
        import torch

        for name, code in _DTYPE_CODES:
            dtype = getattr(torch, name, None)
            if isinstance(dtype, torch.dtype):
                _DTYPES_CACHE[dtype] = code
    return _DTYPES_CACHE


_CHUNK = 16 << 20  # bytes per write(): bounds what a hashing writer handles at once


class BinarySink(Protocol):
    """The file side of a writer: what ``writer.open(name)`` yields."""

    def write(self, data: bytes | memoryview, /) -> object: ...


def write_safetensors(
    f: BinarySink, tensors: Mapping[str, torch.Tensor], meta: dict[str, str]
) -> None:
    """8-byte little-endian header length, JSON header padded to 8 bytes, raw data."""
    if sys.byteorder != "little":
        raise AcceptrunRuntimeError(
            "safetensors stores little-endian data; this host is big-endian"
        )
    # Widest elements first: with the 8-byte-aligned header every tensor starts at a
    # multiple of its element size, so readers can map it without copying.
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    dtypes = dtype_codes() if tensors else {}
    header: dict[str, Any] = {}
    offset = 0
    for key in order:
        t = tensors[key]
        end = offset + t.numel() * t.element_size()
        header[key] = {
            "dtype": dtypes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for key in order:
        # A uint8 view of the tensor's own memory: no copy, any dtype (bf16 has no numpy).
        data = tensors[key].reshape(-1).view(_uint8()).numpy().data
        for start in range(0, len(data), _CHUNK):
            f.write(data[start : start + _CHUNK])


class TensorsHashMismatch(RecordError):
    """TENSORS did not hash to its manifest's value while it was read; nothing was loaded."""


class HashingReader:
    """A file read forward only, hashed on the way: the one pass of a verified restore."""

    def __init__(self, f: io.BufferedReader, expect: str) -> None:
        from acceptrun._util.hashing import new_hasher, split_hash

        self._f = f
        self._expect = expect
        self._hasher = new_hasher(split_hash(expect)[0])
        self._at = 0

    def read(self, n: int) -> bytes:
        data = self._f.read(n)
        self._hasher.update(data)
        self._at += len(data)
        return data

    def readinto(self, view: Any) -> int:
        k = self._f.readinto(view)
        if k:
            self._hasher.update(view[:k])
            self._at += k
        return k or 0

    def hash_through(self, mapped: Any, end: int) -> None:
        """Hash the file's bytes from here to ``end`` out of ``mapped`` (a map of the file)."""
        from acceptrun._util.mapped import hash_range

        hash_range(self._hasher, mapped, self._at, end)
        self._at = max(self._at, end)
        self._f.seek(self._at)

    def seek(self, offset: int) -> int:
        if offset != self._at:  # the reader goes forward, without a gap: never the case
            raise ValueError(f"a hashed read seeks to byte {offset} from byte {self._at}")
        return offset

    def check(self, path: Path, size: int) -> None:
        """Hash what is left (nothing, for a file this module wrote) and compare."""
        while chunk := self._f.read(_CHUNK):
            self._hasher.update(chunk)
            self._at += len(chunk)
        from acceptrun._util.hashing import split_hash

        algorithm = split_hash(self._expect)[0]
        got = f"{algorithm}:{self._hasher.hexdigest()}"
        if got != self._expect or self._at != size:
            raise TensorsHashMismatch(
                f"{path}: wrong hash ({got}, manifest {self._expect}) while it was read; "
                "nothing was loaded from it. The checkpoint is damaged: resume from an "
                "earlier one (`acceptrun ckpt verify` names the file)"
            )


_HEADER_MAX = 100 << 20  # the safetensors format's own limit on its JSON header

# safetensors dtype code -> bytes per element (every code _DTYPE_CODES writes)
_CODE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "C64": 8, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E4M3FNUZ": 1,
    "F8_E5M2": 1, "F8_E5M2FNUZ": 1,
}  # fmt: skip


@dataclass(frozen=True)
class Entry:
    key: str
    code: str
    shape: tuple[int, ...]
    start: int  # absolute file offsets
    end: int


def read_header(f: io.BufferedReader, size: int) -> list[Entry]:
    """The tensors a safetensors file holds, checked against the format and the file size.

    The rules are the format's: a little-endian u64 header length, a JSON object of
    ``{key: {dtype, shape, data_offsets}}`` (and ``__metadata__`` of strings), offsets
    relative to the end of the header, the tensors covering the data exactly, each one's
    bytes its shape's product times its element size.
    """
    raw = f.read(8)
    if len(raw) < 8:
        raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw)
    if n > min(size - 8, _HEADER_MAX):
        raise ValueError(f"a header of {n} bytes in a file of {size}")
    text = f.read(n)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    base = 8 + n
    entries: list[Entry] = []
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise ValueError("__metadata__ is not a map of strings")
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"tensor {key!r}: its entry is not an object")
        code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if code not in _CODE_SIZES:
            raise ValueError(f"tensor {key!r}: unknown dtype {code!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"tensor {key!r}: shape {shape!r} is not a list of sizes")
        if not (
            isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]
        ):  # fmt: skip
            raise ValueError(f"tensor {key!r}: data_offsets {offsets!r} are not [start, end]")
        count = math.prod(shape)
        if (offsets[1] - offsets[0]) != count * _CODE_SIZES[code]:
            raise ValueError(
                f"tensor {key!r}: {offsets[1] - offsets[0]} bytes for shape {shape} of {code}"
            )
        entries.append(Entry(key, code, tuple(shape), base + offsets[0], base + offsets[1]))
    entries.sort(key=lambda e: (e.start, e.end))
    at = base
    for e in entries:  # the tensors cover the data exactly: no gap, no overlap
        if e.start != at:
            raise ValueError(f"tensor {e.key!r} starts at byte {e.start}, expected {at}")
        at = e.end
    if at != size:
        raise ValueError(f"the tensors end at byte {at}, the file at {size}")
    return entries


def on_host(device: str | torch.device | None) -> bool:
    return device is None or str(device).split(":")[0] == "cpu"


def map_tensors(
    raw: io.BufferedReader,
    f: io.BufferedReader | HashingReader,
    entries: list[Entry],
    size: int,
    views: Callable[[str], bool],
) -> dict[str, torch.Tensor]:
    """The tensors out of a private memory map of the file (hashed from it when ``f``
    hashes; :func:`~acceptrun._util.mapped.map_private`): views where ``views(key)``,
    copies otherwise."""
    import torch

    from acceptrun._util.mapped import map_private

    by_code = {code: dtype for dtype, code in dtype_codes().items()}
    mapped = map_private(raw.fileno(), size)
    if isinstance(f, HashingReader):
        f.hash_through(mapped, size)
    data = torch.frombuffer(mapped, dtype=torch.uint8)
    out: dict[str, torch.Tensor] = {}
    for e in entries:
        dtype = by_code.get(e.code)
        if dtype is None:
            raise ValueError(f"tensor {e.key!r} is {e.code}, a dtype this torch does not have")
        part = data[e.start : e.end]
        if e.start % _CODE_SIZES[e.code]:  # not aligned for its dtype: a copy is
            part = part.clone()
        t = part.view(dtype).reshape(e.shape)
        out[e.key] = t if views(e.key) else t.clone()
    return out


def read_tensors(
    f: io.BufferedReader, entries: list[Entry], device: str | torch.device | None
) -> dict[str, torch.Tensor]:
    import torch

    by_code = {code: dtype for dtype, code in dtype_codes().items()}
    target = torch.device("cpu" if device is None else device)
    out: dict[str, torch.Tensor] = {}
    for e in entries:  # in file order: one forward read
        dtype = by_code.get(e.code)
        if dtype is None:
            raise ValueError(f"tensor {e.key!r} is {e.code}, a dtype this torch does not have")
        buf = torch.empty(e.end - e.start, dtype=torch.uint8)
        view = buf.numpy().data  # a writable memoryview of the tensor's own bytes
        f.seek(e.start)
        got = 0
        while got < len(view):
            k = f.readinto(view[got:])
            if not k:
                raise ValueError(f"tensor {e.key!r}: the file ends {len(view) - got} bytes short")
            got += k
        t = buf.view(dtype).reshape(e.shape)
        out[e.key] = t if target.type == "cpu" else t.to(target)
    return out
