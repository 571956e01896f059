"""Content hashes for data, outputs and checkpoints.

Every hash acceptrun records is a string ``"<algorithm>:<hex>"`` so a record stays
readable if the default algorithm ever changes. The default is xxh3-128: not
cryptographic, but about 10x faster than SHA-256 and ample for catching corruption,
truncation and changed files (the threat is bit rot and mistakes, not an adversary).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import xxhash

__all__ = ["ALGORITHM", "Hasher", "hash_bytes", "hash_file", "hash_stream", "new_hasher"]

ALGORITHM = "xxh3_128"
CHUNK = 4 * 1024 * 1024  # bytes read per call; big enough to stream at disk speed


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> Any: ...
    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str = ALGORITHM) -> Hasher:
    """A fresh incremental hasher for ``algorithm`` (``xxh3_128`` or any hashlib name)."""
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    if algorithm in hashlib.algorithms_available:
        return hashlib.new(algorithm)
    raise ValueError(f"unknown hash algorithm {algorithm!r}; use 'xxh3_128' or 'sha256'")


def hash_bytes(data: bytes, algorithm: str = ALGORITHM) -> str:
    """``"xxh3_128:<hex>"`` of ``data``."""
    h = new_hasher(algorithm)
    h.update(data)
    return f"{algorithm}:{h.hexdigest()}"


def hash_stream(chunks: Iterable[bytes], algorithm: str = ALGORITHM) -> tuple[str, int]:
    """Hash an iterable of byte chunks; returns ``(hash, total_bytes)``."""
    h = new_hasher(algorithm)
    size = 0
    for chunk in chunks:
        h.update(chunk)
        size += len(chunk)
    return f"{algorithm}:{h.hexdigest()}", size


def hash_file(path: str | Path, algorithm: str = ALGORITHM) -> tuple[str, int]:
    """Hash a local file in chunks; returns ``(hash, size_in_bytes)``."""
    with open(path, "rb") as f:
        return hash_stream(iter(lambda: f.read(CHUNK), b""), algorithm)


def split_hash(value: str) -> tuple[str, str]:
    """``"xxh3_128:ab12"`` -> ``("xxh3_128", "ab12")``."""
    algorithm, sep, digest = value.partition(":")
    if not sep or not digest:
        raise ValueError(f"not a hash string {value!r}; expected '<algorithm>:<hex>'")
    return algorithm, digest
