"""The input items of a batch inference run: read, identified, cut into shards.

An input is a JSONL file (one JSON value a line), a text file (one item a line), a
directory of such files (sorted by name, hidden files skipped) or an fsspec URL of
either. Blank lines are not items. Each item has a stable id: its index over the whole
input (0, 1, ...), or with ``inference.id_field`` the value of that JSONL field, which
must be unique. Shard ``s`` holds items ``s * shard_size`` to ``(s + 1) * shard_size - 1``,
so the same input always gives the same shards. The supervisor side (coverage at close)
and the workload side (handing out shards) both read the input through this module; it
imports only the standard library (fsspec lazily, for URLs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from acceptrun._util.durable import loads_json
from acceptrun._util.hashing import new_hasher
from acceptrun.errors import UserError

__all__ = ["Item", "ShardInput", "input_files", "iter_items", "iter_shards"]

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


@dataclass(frozen=True, slots=True)
class Item:
    """One input item: ``id`` (stable), ``index`` (position in the input), ``value``."""

    id: Any
    index: int
    value: Any
    raw: bytes  # the input line, hashed into the shard's input hash


@dataclass(frozen=True, slots=True)
class ShardInput:
    """The items of shard ``index`` and the hash of their input lines."""

    index: int
    items: list[Item]
    input_hash: str


def input_files(source: str) -> list[str]:
    """The files an input names, in the order their items are numbered."""
    if "://" in source:
        return _remote_files(source)
    path = Path(source)
    if path.is_dir():
        files = sorted(
            str(p)
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise UserError(
                f"inference.input: the directory {source} holds no files; put the JSONL or "
                "text files of the items there"
            )
        return files
    if not path.is_file():
        raise UserError(
            f"inference.input: {source} does not exist; give a JSONL or text file, a "
            "directory of them, or an fsspec URL"
        )
    return [str(path)]


def _remote_files(url: str) -> list[str]:
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is a dependency
        raise UserError(f"inference.input: {url} needs fsspec (pip install fsspec)") from None
    fs, root = fsspec.core.url_to_fs(url)
    protocol = url.split("://", 1)[0]
    if fs.isdir(root):
        found = sorted(p for p in fs.find(root) if not Path(p).name.startswith("."))
        return [f"{protocol}://{p}" for p in found]
    if not fs.exists(root):
        raise UserError(f"inference.input: {url} does not exist")
    return [url]


def _open(name: str) -> IO[bytes]:
    if "://" in name:
        import fsspec

        f: IO[bytes] = fsspec.open(name, "rb").open()
        return f
    return open(name, "rb")


def iter_items(source: str, *, fmt: str = "auto", id_field: str | None = None) -> Iterator[Item]:
    """Every item of the input, in order; raises UserError naming a bad line."""
    index = 0
    seen: set[Any] = set()
    for name in input_files(source):
        jsonl = fmt == "jsonl" or (fmt == "auto" and name.lower().endswith(JSONL_SUFFIXES))
        with _open(name) as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.rstrip(b"\r\n")
                if not line.strip():
                    continue
                value = _parse(line, name, lineno) if jsonl else line.decode("utf-8")
                item_id: Any = index
                if id_field is not None:
                    item_id = _id_of(value, id_field, name, lineno)
                    if item_id in seen:
                        raise UserError(
                            f"inference.id_field: {id_field} = {item_id!r} at {name}:{lineno} "
                            "is not unique; ids must name one item each (or leave id_field "
                            "unset to number the items)"
                        )
                    seen.add(item_id)
                yield Item(item_id, index, value, line)
                index += 1


def _parse(line: bytes, name: str, lineno: int) -> Any:
    try:
        return loads_json(line)
    except ValueError as exc:
        raise UserError(
            f"inference.input: {name}:{lineno} is not JSON ({exc}); fix the line, or set "
            'inference.format = "text" to take lines as plain text'
        ) from None


def _id_of(value: Any, id_field: str, name: str, lineno: int) -> Any:
    if not isinstance(value, dict) or id_field not in value:
        raise UserError(
            f"inference.id_field: {name}:{lineno} has no field {id_field!r}; every record "
            "needs one, or leave id_field unset to number the items"
        )
    item_id = value[id_field]
    if not isinstance(item_id, str | int) or isinstance(item_id, bool):
        raise UserError(
            f"inference.id_field: {id_field} = {item_id!r} at {name}:{lineno} is not a string "
            "or an integer"
        )
    return item_id


def iter_shards(
    source: str, shard_size: int, *, fmt: str = "auto", id_field: str | None = None
) -> Iterator[ShardInput]:
    """The input cut into shards of ``shard_size`` items (the last one may be shorter)."""
    items: list[Item] = []
    index = 0
    for item in iter_items(source, fmt=fmt, id_field=id_field):
        items.append(item)
        if len(items) == shard_size:
            yield _shard(index, items)
            index += 1
            items = []
    if items:
        yield _shard(index, items)


def _shard(index: int, items: list[Item]) -> ShardInput:
    h = new_hasher()
    for item in items:
        h.update(item.raw)
        h.update(b"\n")
    return ShardInput(index, items, f"xxh3_128:{h.hexdigest()}")
