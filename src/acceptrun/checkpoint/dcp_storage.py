"""acceptrun's storage for torch.distributed.checkpoint (DCP): JSON metadata, no pickle.

DCP plans who writes and reads what; these classes put the bytes into a
:class:`~acceptrun.checkpoint.store.CheckpointStore` save and read them back from a
committed, verified one. :mod:`~acceptrun.checkpoint.sharded` is the API that uses them.

- :class:`DCPWriter`: each rank writes one ``shard-<r>.bin`` of raw tensor bytes, hashed
  (xxh3) while written and fsynced; rank 0 (the coordinator) writes DCP's global metadata
  as JSON (``dcp-metadata.json``), adopts every rank's file hashes and commits;
- :class:`DCPReader`: serves DCP's planned reads from those files, so a checkpoint saved
  by N ranks loads on M;
- :class:`JsonSavePlanner` / :class:`JsonLoadPlanner`: DCP's default planners, but
  non-tensor values (step, RNG state, loader position) are JSON, never pickle.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from acceptrun._util.durable import loads_json
from acceptrun._util.hashing import hash_bytes, split_hash
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.checkpoint.writer import CheckpointWriter
from acceptrun.errors import RecordError, UserError

__all__ = [
    "FORMAT",
    "METADATA",
    "DCPReader",
    "DCPWriter",
    "JsonLoadPlanner",
    "JsonSavePlanner",
    "check_values",
    "metadata_from_json",
    "metadata_to_json",
]

METADATA = "dcp-metadata.json"
FORMAT = "acceptrun.dcp"
_SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class _Location:
    """Where one item's bytes are: a shard file, an offset and a length (bytes)."""

    file: str
    offset: int
    length: int
    dtype: str | None = None  # tensors: the dtype and shape of the saved chunk
    shape: tuple[int, ...] | None = None
    file_size: int = 0  # the whole file, as hashed while written (rank 0 adopts it)
    file_hash: str = ""


# ---- JSON values (never pickle) ---------------------------------------------------------------


def _json_bytes(fqn: str, value: Any) -> bytes:
    try:
        return json.dumps(value, allow_nan=False, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise UserError(
            f"sharded checkpoint value {fqn!r} is a {type(value).__name__}, which cannot be "
            f"stored ({exc}): non-tensor values are kept as JSON (numbers, strings, bools, "
            "None, lists, dicts with string keys), never pickled. Convert it (for example "
            "a numpy array -> torch.from_numpy(a), a set -> sorted list) or leave it out"
        ) from None


def check_values(state_dict: Mapping[str, Any], prefix: str = "") -> None:
    """Raise :class:`UserError` naming the first value that is neither a tensor nor JSON.

    Objects with ``state_dict()`` (DCP's Stateful) are skipped: DCP calls them during the
    save, and their non-tensor values are refused then, by :class:`JsonSavePlanner`.
    """
    for key, value in state_dict.items():
        name = f"{prefix}{key}"
        if isinstance(value, torch.Tensor) or callable(getattr(value, "state_dict", None)):
            continue
        if isinstance(value, Mapping):
            check_values(value, f"{name}.")
        elif isinstance(value, list | tuple) and any(
            isinstance(v, torch.Tensor | Mapping) for v in value
        ):
            check_values({str(i): v for i, v in enumerate(value)}, f"{name}.")
        else:
            _json_bytes(name, value)


class JsonSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, but non-tensor values become JSON bytes, not pickle."""

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(_json_bytes(write_item.index.fqn, object))
        return object


class JsonLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values are parsed as JSON (no torch.load)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = loads_json(value.getvalue())
        except ValueError as exc:
            raise RecordError(f"sharded checkpoint value {fqn!r} is not JSON ({exc})") from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


# ---- the metadata as JSON ---------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise RecordError(f"{METADATA}: unknown dtype {name!r}")
    return dtype


def metadata_to_json(md: Metadata) -> dict[str, Any]:
    """DCP's Metadata as plain JSON: entries, planner data (object paths), storage index."""
    entries: dict[str, Any] = {}
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            entries[fqn] = {"type": "bytes"}
            continue
        props = entry.properties
        if props.layout != torch.strided:
            raise UserError(
                f"sharded checkpoint tensor {fqn!r}: layout {props.layout} is not supported (strided only)"
            )
        entries[fqn] = {
            "type": "tensor",
            "dtype": _dtype_name(props.dtype),
            "requires_grad": bool(props.requires_grad),
            "size": list(entry.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in entry.chunks],
        }
    planner: dict[str, list[str | int]] | None = None
    if isinstance(md.planner_data, dict):
        planner = {}
        for fqn, path in md.planner_data.items():
            if not all(isinstance(p, str | int) for p in path):
                raise UserError(
                    f"sharded checkpoint key {fqn!r} has a path {path!r} that JSON cannot hold"
                )
            planner[str(fqn)] = list(path)
    storage = []
    for index, loc in (md.storage_data or {}).items():
        storage.append(
            {
                "fqn": index.fqn,
                "offset": None if index.offset is None else list(index.offset),
                "index": index.index,
                "file": loc.file,
                "at": loc.offset,
                "length": loc.length,
                "dtype": loc.dtype,
                "shape": None if loc.shape is None else list(loc.shape),
            }
        )
    return {
        "kind": FORMAT,
        "schema": _SCHEMA,
        "version": md.version,
        "entries": entries,
        "planner_data": planner,
        "storage": storage,
    }


def metadata_from_json(doc: Any) -> Metadata:
    """The inverse of :func:`metadata_to_json`; a malformed document raises RecordError."""
    if not isinstance(doc, dict) or doc.get("kind") != FORMAT or doc.get("schema") != _SCHEMA:
        raise RecordError(f"{METADATA}: not acceptrun's DCP metadata (schema {_SCHEMA})")
    try:
        sd_md: dict[str, Any] = {}
        for fqn, e in doc["entries"].items():
            if e["type"] == "bytes":
                sd_md[fqn] = BytesStorageMetadata()
                continue
            props = TensorProperties(
                dtype=_dtype(e["dtype"]), requires_grad=bool(e["requires_grad"])
            )
            chunks = [
                ChunkStorageMetadata(offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"]))
                for c in e["chunks"]
            ]
            sd_md[fqn] = TensorStorageMetadata(props, torch.Size(e["size"]), chunks)
        storage: dict[MetadataIndex, _Location] = {}
        for s in doc["storage"]:
            index = MetadataIndex(s["fqn"], s["offset"], s["index"])
            shape = None if s["shape"] is None else tuple(int(x) for x in s["shape"])
            storage[index] = _Location(
                str(s["file"]), int(s["at"]), int(s["length"]), s["dtype"], shape
            )
        planner = doc["planner_data"]
        planner_data = None if planner is None else {k: tuple(v) for k, v in planner.items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise RecordError(f"{METADATA}: malformed ({type(exc).__name__}: {exc})") from None
    return Metadata(
        sd_md, planner_data=planner_data, storage_data=storage, version=doc.get("version")
    )


# ---- storage ----------------------------------------------------------------------------------


def _tensor_bytes(tensor: torch.Tensor) -> tuple[memoryview, str, tuple[int, ...]]:
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # a device-to-host copy: the training loop waits for it
    t = t.contiguous()
    flat = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return memoryview(flat.numpy().data), _dtype_name(t.dtype), tuple(t.shape)


def _portable(exc: Exception, doing: str) -> RecordError:
    """``exc`` as an error DCP can hand to the other ranks, with the same words.

    DCP pickles a rank's error to send it to the others; one whose class cannot be
    rebuilt from its message (DiskFullError takes keyword arguments) would break that
    exchange and leave the other ranks waiting, so only the text travels.
    """
    return RecordError(f"{doing}: {type(exc).__name__}: {exc}")


class DCPWriter(StorageWriter):
    """DCP storage that writes each rank's shards into one acceptrun save, committed by rank 0.

    ``writer`` is this rank's :class:`CheckpointWriter`: the one rank 0 began (owner), or
    one joined to its staging directory. Use through :func:`acceptrun.checkpoint.sharded.save`.
    """

    def __init__(
        self,
        store: CheckpointStore,
        writer: CheckpointWriter,
        *,
        metrics: Mapping[str, float] | None = None,
        meta: Mapping[str, Any] | None = None,
        retain: bool = True,
        refuse: Exception | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.writer = writer
        self.retain = retain  # False: the caller prunes after telling the others
        self.refuse = refuse  # this rank's write fails with it (every rank then fails)
        self.metrics = dict(metrics or {})
        self.meta = dict(meta or {})
        self.is_coordinator = False
        self.info: CheckpointInfo | None = None

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        if is_coordinator != self.writer.owner:
            raise UserError(
                "the DCP coordinator must be the rank that began the save (rank 0 of the "
                "process group); pass the same process_group to sharded.save on every rank"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # Each rank's file is named by its place in the plan list (its rank in the group).
        return [dataclasses.replace(p, storage_data=f"shard-{i}.bin") for i, p in enumerate(plans)]

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> torch.futures.Future[list[WriteResult]]:
        if not isinstance(planner, JsonSavePlanner):
            raise UserError(
                "DCPWriter needs JsonSavePlanner (non-tensor values as JSON, no pickle)"
            )
        name = str(plan.storage_data)
        if self.refuse is not None:
            raise _portable(self.refuse, f"shard file {name}")
        try:
            results = self._write_file(name, plan, planner)
        except Exception as exc:
            raise _portable(exc, f"shard file {name}") from exc
        fut: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def _write_file(self, name: str, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        """This rank's items, one after the other, into ``name``; where each one went."""
        placed: list[tuple[WriteItem, int, int, str | None, tuple[int, ...] | None]] = []
        if plan.items:
            at = 0
            with self.writer.open(name) as f:
                # One file per rank, written sequentially: hashed as written, one fsync.
                for item in plan.items:
                    data = planner.resolve_data(item)
                    if isinstance(data, io.BytesIO):  # a JSON value (JsonSavePlanner)
                        raw: memoryview | bytes = data.getvalue()
                        dtype, shape = None, None
                    else:
                        raw, dtype_name, shape_t = _tensor_bytes(data)
                        dtype, shape = dtype_name, shape_t
                    f.write(raw)
                    placed.append((item, at, len(raw), dtype, shape))
                    at += len(raw)
        entry = self.writer.written()[0].get(name, {"size": 0, "hash": ""})
        return [
            WriteResult(
                index=item.index,
                size_in_bytes=length,
                storage_data=_Location(
                    name, at, length, dtype, shape, entry["size"], entry["hash"]
                ),
            )
            for item, at, length, dtype, shape in placed
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Rank 0, after every rank wrote: metadata JSON, adopt the files, commit."""
        try:
            self._commit(metadata, results)
        except Exception as exc:
            raise _portable(exc, f"committing {self.writer.path}") from exc

    def _commit(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        files: dict[str, dict[str, Any]] = {}
        storage: dict[MetadataIndex, _Location] = {}
        for rank_results in results:
            for r in rank_results:
                loc = r.storage_data
                storage[r.index] = dataclasses.replace(loc, file_size=0, file_hash="")
                files[loc.file] = {"size": loc.file_size, "hash": loc.file_hash}
        own = self.writer.written()[0]
        self.writer.adopt({k: v for k, v in files.items() if k not in own}, [])
        metadata.storage_data = storage
        doc = metadata_to_json(metadata)
        self.writer.write_bytes(
            METADATA, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        )
        meta = {**self.meta, "format": FORMAT, "shard_files": len(files)}
        self.info = self.store.commit(
            self.writer, metrics=self.metrics, meta=meta, retain=self.retain
        )

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.writer.path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class DCPReader(StorageReader):
    """DCP storage that reads a committed, verified acceptrun checkpoint; no unpickling.

    Use through :func:`acceptrun.checkpoint.sharded.load`, which verifies the checkpoint
    before reading it.
    """

    def __init__(
        self, info: CheckpointInfo, *, preloaded: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        super().__init__()
        self.info = info
        self.path = info.path
        self.storage: dict[MetadataIndex, _Location] = {}
        # Files already read (and hashed) whole, as uint8 tensors: served without a read.
        self.preloaded = dict(preloaded or {})

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        entry = self.info.files.get(METADATA)
        if entry is None:
            raise RecordError(f"{self.path} is not a sharded checkpoint: it has no {METADATA}")
        raw = (self.path / METADATA).read_bytes()
        expected = str(entry["hash"])
        if hash_bytes(raw, split_hash(expected)[0]) != expected:
            raise RecordError(
                f"{self.path / METADATA} does not match its manifest hash; verify the checkpoint"
            )
        try:
            doc = loads_json(raw)
        except ValueError as exc:
            raise RecordError(f"{self.path / METADATA}: not JSON ({exc})") from None
        md = metadata_from_json(doc)
        md.storage_meta = StorageMeta(checkpoint_id=str(self.path))
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        if not isinstance(planner, JsonLoadPlanner):
            raise UserError(
                "DCPReader needs JsonLoadPlanner (non-tensor values as JSON, no pickle)"
            )
        by_file: dict[str, list[tuple[ReadItem, _Location]]] = defaultdict(list)
        for item in plan.items:
            loc = self.storage.get(item.storage_index)
            if loc is None:
                raise RecordError(f"{self.path}: {item.storage_index.fqn!r} is not in {METADATA}")
            by_file[loc.file].append((item, loc))
        for name, items in by_file.items():
            if name not in self.info.files:
                raise RecordError(f"{self.path / name} is not in the manifest")
            if name in self.preloaded:
                self._serve(name, self.preloaded[name], items, planner)
                continue
            with open(self.path / name, "rb") as f:
                for item, loc in sorted(items, key=lambda x: x[1].offset):
                    f.seek(loc.offset)
                    raw = f.read(loc.length)
                    if len(raw) != loc.length:
                        raise RecordError(
                            f"{self.path / name}: short read at {loc.offset} ({len(raw)} of {loc.length} bytes)"
                        )
                    if item.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(item, io.BytesIO(raw))
                        continue
                    self._copy_tensor(item, loc, raw, planner)
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _serve(
        self,
        name: str,
        data: torch.Tensor,
        items: list[tuple[ReadItem, _Location]],
        planner: LoadPlanner,
    ) -> None:
        """Items of a file read whole into ``data``: views of it, no second read."""
        for item, loc in items:
            end = loc.offset + loc.length
            if loc.offset < 0 or end > data.numel():
                raise RecordError(
                    f"{self.path / name}: {item.storage_index.fqn!r} at {loc.offset}+"
                    f"{loc.length} is past its end ({data.numel()} bytes)"
                )
            raw = data[loc.offset : end]
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(raw.numpy().tobytes()))
                continue
            self._copy_tensor(item, loc, raw, planner)

    def _copy_tensor(
        self, item: ReadItem, loc: _Location, raw: bytes | torch.Tensor, planner: LoadPlanner
    ) -> None:
        if loc.dtype is None or loc.shape is None:
            raise RecordError(
                f"{self.path / loc.file}: {item.storage_index.fqn!r} has no dtype/shape"
            )
        dtype = _dtype(loc.dtype)
        if isinstance(raw, torch.Tensor):  # a slice of a preloaded file: viewed, not copied
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if raw.numel() % itemsize:
                raise RecordError(
                    f"{self.path / loc.file}: {item.storage_index.fqn!r} holds {raw.numel()} "
                    f"bytes, not a whole number of {loc.dtype} elements"
                )
            aligned = raw if loc.offset % itemsize == 0 else raw.clone()
            saved = aligned.view(dtype).reshape(loc.shape)
        elif raw:
            saved = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(loc.shape)
        else:
            saved = torch.empty(loc.shape, dtype=dtype)
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
            saved = saved.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != saved.size():
            raise RecordError(
                f"{item.dest_index.fqn!r}: the checkpoint holds {tuple(saved.size())} at "
                f"{tuple(item.storage_offsets)}, the state dict wants {tuple(target.size())}"
            )
        target.copy_(saved)
        planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
