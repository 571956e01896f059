"""PyTorch training state without pickle: stage, write, load for a bit-exact resume.

A checkpoint of training state is two files in one directory:

- ``tensors.safetensors``: every tensor, keyed ``<object>/<path>`` (``model/encoder.weight``,
  ``optimizer/state/3/exp_avg``), streamed in the safetensors format;
- ``state.json``: everything else, with ``{"__tensor__": key}`` where a tensor was, plus
  the RNG states (Python, NumPy, torch CPU and CUDA) and the versions.

The load path reads only these two files, with ``json`` and this module's own reader of
the safetensors format (the writer is its own too, so restoring needs no package the save
did not): no pickle, no ``torch.load``, so a checkpoint from an untrusted mirror cannot
run code. The price is
that a state_dict may hold only tensors, numbers, strings, None, lists, tuples, dicts,
numpy arrays, dtypes and devices; anything else raises :class:`TypeError` naming it.
torch itself is optional: a process that never imported it saves and loads plain values
and numpy arrays without it (see :func:`_loaded_torch`).

Saving is split so that an async save blocks the training loop only for :func:`stage`
(copies to host memory); :func:`write_staged` can run on a background thread. With
``defer=True``, :func:`stage` copies only what may change before the next optimizer step
and leaves the parameters and optimizer state to :meth:`Staged.copy_pending`, which a
background thread runs beside the next forward and backward (see
:class:`~acceptrun.checkpoint.saver.Checkpointer`, which makes the optimizer wait for it)::

    buffers = StagingBuffers()                     # reused across saves
    staged = stage({"model": model, "optimizer": opt, "scheduler": sched,
                    "loader": loader, "extra": {"epoch": epoch}}, buffers=buffers)
    write_staged(staged, writer)                   # writer.open(name) -> binary file
    ...
    out = load_into(path, {"model": model, "optimizer": opt, "scheduler": sched,
                           "loader": loader, "extra": None})
    epoch = out["values"]["extra"]["epoch"]
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import random
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from acceptrun._util.durable import loads_json, read_bytes_bounded
from acceptrun.errors import (
    AcceptrunError,
    AcceptrunRuntimeError,
    AcceptrunTypeError,
    AcceptrunValueError,
    RecordError,
    UserError,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "STATE",
    "TENSORS",
    "Staged",
    "StagingBuffers",
    "StateChangedDuringCopy",
    "TensorsHashMismatch",
    "load_into",
    "load_ranked",
    "rank_dir",
    "restore_values",
    "stage",
    "write_staged",
]

TENSORS = "tensors.safetensors"
STATE = "state.json"
FORMAT = "acceptrun.torch-state"
FORMAT_VERSION = 1

# torch dtype name -> safetensors dtype code (the ones this torch has, see _dtypes()).
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


def _loaded_torch() -> ModuleType | None:
    """torch if this process imported it, else None: then nothing here is a torch object.

    Saving never imports torch on a script's behalf: a workload that checkpoints plain
    values, numpy arrays or a JAX model's host copy does not pay torch's start-up (seconds
    of CPU, hundreds of MB). Loading imports it only for a checkpoint that holds tensors
    or a torch RNG state.
    """
    return sys.modules.get("torch")


def _is_tensor(value: Any) -> bool:
    torch = _loaded_torch()
    return torch is not None and isinstance(value, torch.Tensor)


def _is_generator(value: Any) -> bool:
    torch = _loaded_torch()
    return torch is not None and isinstance(value, torch.Generator)


def _is_module(value: Any) -> bool:
    torch = _loaded_torch()
    return torch is not None and isinstance(value, torch.nn.Module)


def _uint8() -> torch.dtype:
    import torch

    return torch.uint8


_DTYPES_CACHE: dict[Any, str] = {}


def _dtypes() -> dict[torch.dtype, str]:
    """torch dtype -> safetensors dtype code, for the dtypes this torch has."""
    if not _DTYPES_CACHE:
        import torch

        for name, code in _DTYPE_CODES:
            dtype = getattr(torch, name, None)
            if isinstance(dtype, torch.dtype):
                _DTYPES_CACHE[dtype] = code
    return _DTYPES_CACHE


_TAGS = frozenset(
    {"__tensor__", "__tuple__", "__dict__", "__float__", "__ndarray__", "__dtype__", "__device__"}
)
_RNG = "__rng__"  # tensor-key prefix of RNG states; object names may not start with "__"
_CHUNK = 16 << 20  # bytes per write(): bounds what a hashing writer handles at once


class BinarySink(Protocol):
    """The file side of a writer: what ``writer.open(name)`` yields."""

    def write(self, data: bytes | memoryview, /) -> object: ...


class StateWriter(Protocol):
    """Anything with ``open(name)`` returning a context manager over a binary file.

    :class:`acceptrun.checkpoint.store.CheckpointWriter` is one; tests pass a small one.
    """

    def open(self, name: str) -> AbstractContextManager[BinarySink]: ...


def _numpy() -> ModuleType | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


# ---------------------------------------------------------------------------------------
# codec: state_dict <-> JSON + a flat dict of tensors


class _Encoder:
    """Walks a value; returns its JSON form and collects tensors (not yet copied)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._torch = _loaded_torch()

    def encode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value  # json writes repr(): the exact same float reads back
            return {"__float__": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        torch = self._torch
        if torch is not None:
            if isinstance(value, torch.Tensor):
                return {"__tensor__": self._add_tensor(value, path)}
            if isinstance(value, torch.dtype):
                return {"__dtype__": str(value).removeprefix("torch.")}
            if isinstance(value, torch.device):
                return {"__device__": str(value)}
        if isinstance(value, Mapping):
            if all(isinstance(k, str) for k in value) and not _TAGS.intersection(value):
                return {k: self.encode(v, f"{path}/{k}") for k, v in value.items()}
            # Non-str keys (optimizer state is keyed by int param ids) or a key that
            # looks like one of our tags: a list of pairs keeps the keys' types.
            return {
                "__dict__": [
                    [self.encode(k, f"{path}/<key {k!r}>"), self.encode(v, f"{path}/{k}")]
                    for k, v in value.items()
                ]
            }
        if isinstance(value, tuple):
            return {"__tuple__": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        np = _numpy()
        if np is not None and isinstance(value, np.ndarray | np.generic):
            return _encode_ndarray(np, value, path)
        raise AcceptrunTypeError(_unsupported(value, path))

    def _add_tensor(self, tensor: torch.Tensor, path: str) -> str:
        import torch

        dtypes = _dtypes()
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            raise AcceptrunTypeError(
                f"{path}: cannot save a {type(tensor).__name__} (a tensor subclass) without "
                "pickle; convert it to a plain tensor in state_dict() (for a DTensor: "
                ".full_tensor(), or save sharded state with torch.distributed.checkpoint)"
            )
        if tensor.layout != torch.strided or tensor.dtype not in dtypes:
            raise AcceptrunTypeError(
                f"{path}: cannot save a {tensor.layout} tensor of {tensor.dtype} in "
                f"safetensors; convert it to a dense tensor of one of "
                f"{sorted(str(d) for d in dtypes)} in state_dict()"
            )
        key, n = path, 1
        while key in self.tensors:  # "a/b" + "c" and "a" + "b/c" could meet
            key, n = f"{path}#{n}", n + 1
        self.tensors[key] = tensor
        return key


def _unsupported(value: Any, path: str) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if callable(value):
        return (
            f"{path}: cannot save a function without pickle ({shown}); keep the function "
            "in code and save only the plain data it is built from. torch's LambdaLR and "
            "MultiplicativeLR already leave plain functions and lambdas out of "
            "state_dict(), but save a callable object's attributes, which must be plain data"
        )
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return (
        f"{path}: cannot save a {kind} object without pickle ({shown}); make state_dict() "
        "return only tensors, numbers, strings, None, lists, tuples, dicts and numpy arrays"
    )


def _encode_ndarray(np: ModuleType, value: Any, path: str) -> dict[str, Any]:
    arr = np.asarray(value)
    if arr.dtype.kind in "OV":  # objects need pickle; structured dtypes lose fields in .str
        raise AcceptrunTypeError(_unsupported(value, path))
    return {
        "__ndarray__": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii"),
        "dtype": arr.dtype.str,  # with byte order, e.g. "<u4"
        "shape": list(arr.shape),
        "scalar": isinstance(value, np.generic),
    }


def _decode(value: Any, tensors: Mapping[str, torch.Tensor], path: str) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        try:
            return tensors[value["__tensor__"]]
        except KeyError:
            raise RecordError(
                f"{path}: tensor {value['__tensor__']!r} is missing from {TENSORS}; the "
                "checkpoint is damaged, resume from an earlier one"
            ) from None
    if "__tuple__" in value:
        return tuple(_decode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value["__tuple__"]))
    if "__dict__" in value:
        return {
            _decode(k, tensors, path): _decode(v, tensors, f"{path}/{k}")
            for k, v in value["__dict__"]
        }
    if "__float__" in value:
        return float(value["__float__"])  # "nan", "inf", "-inf"
    if "__dtype__" in value:
        import torch

        dtype = getattr(torch, value["__dtype__"], None)
        if not isinstance(dtype, torch.dtype):
            raise RecordError(f"{path}: unknown torch dtype {value['__dtype__']!r}")
        return dtype
    if "__device__" in value:
        import torch

        return torch.device(value["__device__"])
    if "__ndarray__" in value:
        np = _numpy()
        if np is None:
            raise RecordError(f"{path}: holds a numpy array; install numpy to load it")
        dtype = np.dtype(value["dtype"])
        if dtype.hasobject:  # never from our writer: object arrays would need pickle
            raise RecordError(f"{path}: numpy dtype {dtype} holds Python objects; refused")
        raw = base64.b64decode(value["__ndarray__"])
        arr = np.frombuffer(raw, dtype=dtype).reshape(value["shape"]).copy()
        return arr[()] if value.get("scalar") else arr
    return {k: _decode(v, tensors, f"{path}/{k}") for k, v in value.items()}


# ---------------------------------------------------------------------------------------
# staging: a host-memory snapshot, taken on the training thread


class StagingBuffers:
    """Host buffers reused across saves, one per tensor key.

    A fresh 500 MB host tensor costs ~0.1 s of page faults on first write, every save;
    reusing the same memory avoids that. Buffers for CUDA tensors are pinned, so the
    device-to-host copies run asynchronously. One snapshot at a time: a :class:`Staged`
    from these buffers must be written (or released) before the next :func:`stage`,
    which raises otherwise rather than overwrite a snapshot still being written.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[torch.Tensor, bool]] = {}
        self._in_use = False

    @property
    def nbytes(self) -> int:
        """Host memory held, in bytes."""
        return sum(t.numel() * t.element_size() for t, _ in self._buffers.values())

    def _acquire(self) -> None:
        if self._in_use:
            raise AcceptrunRuntimeError(
                "StagingBuffers still hold an unwritten snapshot; call write_staged() (or "
                "Staged.release()) before staging again, or use one StagingBuffers per save"
            )
        self._in_use = True

    def _release(self) -> None:
        self._in_use = False

    def _take(self, key: str, like: torch.Tensor) -> torch.Tensor:
        pin = like.is_cuda
        held = self._buffers.get(key)
        if held is not None:
            buf, pinned = held
            if buf.shape == like.shape and buf.dtype == like.dtype and pinned == pin:
                return buf
        # pin_memory costs a cudaHostAlloc (slow, ms per MB): paid on the first save only.
        import torch

        buf = torch.empty(like.shape, dtype=like.dtype, pin_memory=pin)
        self._buffers[key] = (buf, pin)
        return buf

    def _keep_only(self, keys: set[str]) -> None:
        for key in set(self._buffers) - keys:
            del self._buffers[key]


@dataclass
class Staged:
    """A host-memory snapshot of training state, ready for :func:`write_staged`."""

    tensors: dict[str, torch.Tensor]
    """CPU, contiguous, none sharing storage with another or with the live state."""
    meta: dict[str, Any]
    """JSON-able: the encoded state of each object, RNG states, versions."""
    nbytes: int
    """Bytes of tensor data."""
    _buffers: StagingBuffers | None = field(default=None, repr=False, compare=False)
    pending: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    """Live tensors not copied yet (``stage(defer=True)``): :meth:`copy_pending` copies them."""
    _versions: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def release(self) -> None:
        """Give the staging buffers back without writing (write_staged does this itself)."""
        self.pending = {}
        if self._buffers is not None:
            self._buffers._release()
            self._buffers = None

    def copy_pending(self) -> float:
        """Copy the deferred tensors into the snapshot; returns the seconds it took.

        Runs on a background thread while the training loop goes on; whoever may change
        these tensors in place (the optimizer's step) must wait for it to return. Each
        tensor's version counter, read when it was staged, is read again after its copy:
        a tensor changed in place before or while it was copied raises
        :class:`StateChangedDuringCopy` naming it, so a snapshot that is not the state of
        its step is never written.
        """
        if not self.pending:
            return 0.0
        import time

        t0 = time.perf_counter()
        for key, src in self.pending.items():
            dst = self.tensors[key]
            dst.copy_(src)
            if src._version != self._versions[key]:
                raise StateChangedDuringCopy(
                    f"{key!r} was changed in place after the save was called and before it "
                    "was copied, by something other than a torch.optim optimizer's step() "
                    "(which waits for the copy): the checkpoint of this step would not hold "
                    'its state, so it was not written. Set [checkpoint] staging = "block" '
                    "(the copy then finishes inside the save call), or change parameters in "
                    "place only in the optimizer's step()"
                )
        self.pending = {}
        return time.perf_counter() - t0


class StateChangedDuringCopy(AcceptrunRuntimeError):
    """A tensor left to the background copy changed before it was copied (see staging)."""


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _check_names(objects: Mapping[str, Any]) -> None:
    for name in objects:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("__"):
            raise AcceptrunValueError(
                f"object name {name!r}: use a non-empty name without '/' that does not "
                "start with '__', e.g. 'model' or 'optimizer'"
            )


def stage(
    objects: Mapping[str, Any],
    *,
    rng: bool = True,
    buffers: StagingBuffers | None = None,
    defer: bool = False,
) -> Staged:
    """Snapshot ``objects`` (and the RNG states) into host memory.

    Each value of ``objects`` has ``state_dict()``/``load_state_dict()`` (module, optimizer,
    scheduler, GradScaler, ResumableLoader, ...) or is a plain value (``{"epoch": 3}``).
    Blocks the training loop for the copies (~memory bandwidth; see StagingBuffers); the
    returned tensors are copies, so optimizer steps after this cannot change them.
    Raises TypeError naming the key path of anything that cannot be saved without pickle.

    ``defer=True`` (with ``buffers``) leaves out of the blocking copy the tensors that only
    a torch.optim optimizer's ``step()`` changes, when ``objects`` hold such an optimizer:
    the parameters of the modules and the optimizers' state, in host memory. They stay in
    :attr:`Staged.pending` for :meth:`Staged.copy_pending`. Everything else (buffers,
    which a forward may change; tensors of any other object; CUDA tensors) is copied now.
    """
    _check_names(objects)
    enc = _Encoder()
    entries: dict[str, Any] = {}
    deferrable: set[str] = set()
    defer = defer and buffers is not None and _has_optimizer(objects)
    for name, obj in objects.items():
        before = set(enc.tensors) if defer else set()
        if _is_generator(obj):
            # A generator of the workload's own (batch sampling, augmentation): its state
            # is a byte tensor, restored with set_state.
            entry = {"kind": "generator", "state": enc.encode(obj.get_state(), name)}
        elif _is_stateful(obj):
            sd = obj.state_dict()
            entry = {"kind": "state_dict", "state": enc.encode(sd, name)}
            # nn.Module's state_dict carries per-submodule versions that its
            # load_state_dict uses to upgrade old layouts; keep them.
            module_meta = getattr(sd, "_metadata", None)
            if isinstance(module_meta, dict):
                entry["module_metadata"] = enc.encode(dict(module_meta), f"{name}/_metadata")
        else:
            entry = {"kind": "value", "state": enc.encode(obj, name)}
        entries[name] = entry
        if defer:
            added = {k: t for k, t in enc.tensors.items() if k not in before}
            deferrable |= _changed_only_by_step(obj, added)
    np = _numpy()
    torch = _loaded_torch()
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "torch_version": None if torch is None else torch.__version__,
        "numpy_version": None if np is None else np.__version__,
        "objects": entries,
        "rng": _capture_rng(enc, np) if rng else None,
    }
    if buffers is not None:
        buffers._acquire()
    pending = {k: t.detach() for k, t in enc.tensors.items() if k in deferrable}
    try:
        tensors = _copy_to_host(enc.tensors, buffers, skip=set(pending))
    except BaseException:
        if buffers is not None:
            buffers._release()
        raise
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    meta["tensors"] = {"file": TENSORS, "count": len(tensors), "nbytes": nbytes}
    return Staged(
        tensors=tensors, meta=meta, nbytes=nbytes, _buffers=buffers, pending=pending,
        _versions={k: t._version for k, t in pending.items()},
    )  # fmt: skip


def _has_optimizer(objects: Mapping[str, Any]) -> bool:
    torch = _loaded_torch()
    return torch is not None and any(
        isinstance(obj, torch.optim.Optimizer) for obj in objects.values()
    )


def _changed_only_by_step(obj: Any, added: Mapping[str, torch.Tensor]) -> set[str]:
    """The keys of ``added`` (tensors ``obj``'s state_dict gave) that change only in an
    optimizer's step(): an optimizer's own state, and a module's parameters (not its
    buffers: a forward changes running statistics). Host tensors only: a CUDA tensor's
    copy is queued on its stream at once and does not block for long."""
    import torch

    host = {k: t for k, t in added.items() if t.device.type == "cpu"}
    if isinstance(obj, torch.optim.Optimizer):
        return set(host)
    if isinstance(obj, torch.nn.Module):
        params = {p.data_ptr() for p in obj.parameters() if p.device.type == "cpu"}
        return {k for k, t in host.items() if t.data_ptr() in params and t.numel()}
    return set()


def _copy_to_host(
    live: dict[str, torch.Tensor],
    buffers: StagingBuffers | None,
    skip: AbstractSet[str] = frozenset(),
) -> dict[str, torch.Tensor]:
    """A host copy of each tensor; those in ``skip`` get their buffer only (copied later)."""
    out: dict[str, torch.Tensor] = {}
    if buffers is not None:
        buffers._keep_only(set(live))
    if not live:  # plain values only: torch may not even be imported
        return out
    import torch

    cuda_devices: set[torch.device] = set()
    for key, tensor in live.items():
        src = tensor.detach()
        if key in skip:
            assert buffers is not None
            out[key] = buffers._take(key, src)
            continue
        if src.is_cuda:
            cuda_devices.add(src.device)
        # Always a new contiguous host tensor per key: tied weights get one copy each,
        # and nothing staged shares storage with the live state.
        if buffers is None:
            dst = torch.empty(src.shape, dtype=src.dtype)
            dst.copy_(src)  # from CUDA: a blocking copy into pageable memory
        else:
            dst = buffers._take(key, src)
            dst.copy_(src, non_blocking=src.is_cuda)
        out[key] = dst
    # The only blocking part of an async save: the writer thread reads these buffers, so
    # the copies must have landed (synchronize waits for all queued work on the device).
    for device in cuda_devices:
        torch.cuda.synchronize(device)
    return out


def _capture_rng(enc: _Encoder, np: ModuleType | None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": enc.encode(random.getstate(), f"{_RNG}/python"),
        "torch": None,
        "numpy": None if np is None else enc.encode(np.random.get_state(), f"{_RNG}/numpy"),
        "cuda": None,
    }
    if _loaded_torch() is None:  # no torch random number was drawn: none to restore
        return state
    import torch

    state["torch"] = enc.encode(torch.get_rng_state(), f"{_RNG}/torch")
    # Not initialized means no CUDA random number was drawn in this process, and asking
    # would create a CUDA context (~0.5 GB of GPU memory, ~1 s) in a CPU-only job.
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = {
            "device_count": torch.cuda.device_count(),
            "states": enc.encode(torch.cuda.get_rng_state_all(), f"{_RNG}/cuda"),
        }
    return state


# ---------------------------------------------------------------------------------------
# writing: safetensors streamed tensor by tensor, then state.json


def write_staged(staged: Staged, writer: StateWriter) -> None:
    """Write ``staged`` as TENSORS then STATE through ``writer.open(name)``.

    Safe to run on a background thread; gives the staging buffers back when done.
    """
    try:
        if staged.pending:
            raise AcceptrunRuntimeError(
                f"{len(staged.pending)} tensors of this snapshot were not copied yet: call "
                "Staged.copy_pending() before write_staged()"
            )
        with writer.open(TENSORS) as f:
            _write_safetensors(f, staged.tensors, {"format": "pt", FORMAT: str(FORMAT_VERSION)})
        with writer.open(STATE) as f:
            f.write(json.dumps(staged.meta, separators=(",", ":"), allow_nan=False).encode())
    finally:
        staged.release()


def _write_safetensors(
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
    dtypes = _dtypes() if tensors else {}
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


# ---------------------------------------------------------------------------------------
# loading: JSON and safetensors only


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = loads_json(read_bytes_bounded(path))
    except FileNotFoundError:
        raise RecordError(
            f"{path} is missing; a training-state checkpoint holds {STATE} and {TENSORS}"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable, not JSON, too deep, too large
        raise RecordError(
            f"cannot read {path} ({exc}); the checkpoint is damaged, resume from an earlier one"
        ) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise RecordError(f"{path} is not an acceptrun training-state file (format {found!r})")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(
            f"{path}: format version {version!r} is not one this acceptrun reads "
            f"({FORMAT_VERSION}); it was written by another acceptrun version: load it "
            "with that version"
        )
    return meta


def load_into(
    path: str | Path,
    objects: Mapping[str, Any],
    *,
    device: str | torch.device | None = None,
    rng: bool = True,
    strict: bool = True,
    expect: str | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint written by :func:`write_staged` into ``objects``.

    ``expect``: the manifest's hash of TENSORS (``"xxh3_128:..."``). The file is then
    hashed as it is read, in the same pass, and a mismatch raises
    :class:`TensorsHashMismatch` before any object is changed: with
    ``CheckpointStore.verify(step, defer=[TENSORS])`` first, a restore reads the bytes
    once instead of twice.

    Calls ``load_state_dict`` on each object that has one; plain values saved under a
    name come back in ``result["values"]``. Tensors are loaded onto ``device`` (default
    CPU) and each object copies them onto its own device (modules copy into their
    parameters; optimizers cast their state to the parameter's device). With ``rng``,
    the Python, NumPy, torch and CUDA RNG states are restored last. With ``strict``, the
    names must match the checkpoint's exactly and modules load strictly.

    Returns ``{"values": {...}, "meta": {...}, "notes": [...]}``; notes say what was not
    restored (CUDA RNG on a machine with fewer GPUs, names skipped when not strict).

    >>> out = load_into(ckpt_dir, {"model": model, "optimizer": opt, "extra": None})
    """
    return _load(
        Path(path), objects, device=device, rng=rng, strict=strict, world_size=1, expect=expect
    )


class TensorsHashMismatch(RecordError):
    """TENSORS did not hash to its manifest's value while it was read; nothing was loaded."""


def restore_values(registered: Mapping[str, Any], saved: Mapping[str, Any]) -> dict[str, Any]:
    """Put saved plain values back into what is registered under the same names.

    Mutable values are restored in place, so the script's own references see them: a
    dict is cleared and updated, a list slice-assigned, a tensor or numpy array copied
    into (``copy_`` without autograd; same shape and dtype). Immutable values (numbers,
    strings, tuples, None) cannot change in place: the saved value is returned. Returns
    ``{name: value}`` for every name in both; every value is checked before any is
    changed, and one that cannot be restored raises :class:`UserError` naming it.

    >>> history = []
    >>> _ = restore_values({"history": history}, {"history": [1.0]}); history
    [1.0]
    """
    plan: list[tuple[str, Any, Any]] = []
    for name, value in saved.items():
        if name in registered:
            plan.append((name, registered[name], _checked_value(name, registered[name], value)))
    out: dict[str, Any] = {}
    for name, current, value in plan:
        if _is_tensor(current):
            import torch

            with torch.no_grad():  # a parameter or a leaf that requires grad
                current.copy_(value)
            value = current
        elif isinstance(current, MutableMapping):
            current.clear()
            current.update(value)
            value = current
        elif isinstance(current, list):
            current[:] = value
            value = current
        elif _is_ndarray(current):
            current[...] = value
            value = current
        out[name] = value
    return out


_NUMBERS = (bool, int, float)


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")  # a numpy array exists only if numpy was imported
    return np is not None and isinstance(value, np.ndarray)


def _checked_value(name: str, current: Any, value: Any) -> Any:
    """``value`` if it can replace (or fill) ``current``; else a UserError naming ``name``."""

    def refuse(why: str) -> UserError:
        return UserError(
            f"run.restore(): cannot restore {name!r}: {why}. Register the same kind of value "
            f"under {name!r} as the checkpoint holds, or rename it to start it fresh"
        )

    def kind(v: Any) -> str:
        if _is_tensor(v) or _is_ndarray(v):
            return f"{type(v).__name__} of shape {tuple(v.shape)} and dtype {v.dtype}"
        return type(v).__name__

    if _is_tensor(current) or _is_ndarray(current):
        if type(value) is not type(current) and not (_is_tensor(current) and _is_tensor(value)):
            raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
        if tuple(value.shape) != tuple(current.shape) or value.dtype != current.dtype:
            raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
        return value
    if isinstance(current, MutableMapping) and not isinstance(value, Mapping):
        raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
    if isinstance(current, list) and not isinstance(value, list):
        raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
    if current is None or value is None:
        return value
    if isinstance(current, _NUMBERS) and isinstance(value, _NUMBERS):
        return value
    if not isinstance(value, type(current)) and not isinstance(current, type(value)):
        raise refuse(f"saved as a {kind(value)}, registered as a {kind(current)}")
    return value


def rank_dir(rank: int) -> str:
    """The directory of rank ``rank``'s own state inside a multi-process checkpoint."""
    return f"rank-{rank}"


def load_ranked(
    path: str | Path,
    shared: Mapping[str, Any],
    own: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    device: str | torch.device | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Restore a multi-process (gathered) checkpoint on rank ``rank`` of ``world_size``.

    ``shared`` (model, optimizer: the same on every rank) loads from the step directory
    itself, ``own`` and this rank's RNG states from its ``rank-<r>/``. The checkpoint
    must have been saved by as many ranks: resharding is not supported.

    >>> load_ranked(ckpt, {"model": m, "optimizer": opt}, {"loader": loader}, rank=1, world_size=2)
    """
    root = Path(path)
    out = _load(root, shared, device=device, rng=False, strict=strict, world_size=world_size)
    mine = _load(
        root / rank_dir(rank), own, device=device, rng=True, strict=strict, world_size=world_size
    )
    return {
        "values": {**out["values"], **mine["values"]},
        "meta": out["meta"],
        "notes": out["notes"] + mine["notes"],
    }


def _saved_world_size(meta: Mapping[str, Any]) -> int:
    ranks = meta.get("ranks")
    return int(ranks.get("world_size", 1)) if isinstance(ranks, dict) else 1


def _load(
    root: Path,
    objects: Mapping[str, Any],
    *,
    device: str | torch.device | None,
    rng: bool,
    strict: bool,
    world_size: int,
    expect: str | None = None,
) -> dict[str, Any]:
    _check_names(objects)
    meta = _read_meta(root / STATE)
    saved_world = _saved_world_size(meta)
    if saved_world != world_size:
        raise UserError(
            f"{root}: saved by a run of {saved_world} process(es), loaded by one of "
            f"{world_size}; resume it with resources.processes = {saved_world} (a "
            "checkpoint cannot be resharded to another number of processes)"
        )
    modules = {name for name, obj in objects.items() if _is_module(obj)}
    tensors = _load_tensors(
        root / TENSORS, meta, device, expect,
        views=lambda key: key.split("/", 1)[0] in modules,
    )  # fmt: skip

    try:
        values, loads, rng_state, notes = _decode_all(root, meta, tensors, objects, rng, strict)
    except AcceptrunError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as exc:
        # Valid JSON of the wrong shape: a damaged (or hand-edited) state file.
        raise RecordError(
            f"{root / STATE} does not describe saved objects ({type(exc).__name__}: {exc}); "
            "the checkpoint is damaged, resume from an earlier one (`acceptrun ckpt verify`)"
        ) from exc

    for name, obj, state in loads:
        try:
            if _is_generator(obj):
                obj.set_state(state.cpu())
            elif _is_module(obj):
                obj.load_state_dict(state, strict=strict)
            else:
                before = _group_values(obj)
                obj.load_state_dict(state)
                _keep_group_identity(obj, before)
        except AcceptrunError as exc:
            exc.add_note(f"while loading {name!r} from {root}")
            raise
        except Exception as exc:
            # The object refused the state: saved from another model, or damaged.
            error = AcceptrunRuntimeError(
                f"{name!r} does not load from {root}: {exc} (a checkpoint of another model, "
                "or a damaged one: `acceptrun ckpt verify` tells which)"
            )
            error.add_note(f"while loading {name!r} from {root}")
            raise error from exc
    if rng_state is not None:
        notes += _restore_rng(rng_state)
    elif rng:
        notes.append("no RNG state in this checkpoint (saved with rng=False)")
    return {"values": values, "meta": meta, "notes": notes}


def _load_tensors(
    path: Path,
    meta: Mapping[str, Any],
    device: str | torch.device | None,
    expect: str | None = None,
    views: Callable[[str], bool] | None = None,
) -> Mapping[str, torch.Tensor]:
    """The tensors of TENSORS, read by this module's own reader (no safetensors package).

    The writer above is this module's own, and so is the reader: restoring a checkpoint
    needs nothing the save did not, so a workload that could save can always load. When
    state.json counts no tensors the file is checked and torch is not imported. With
    ``expect`` the bytes are hashed as they are read (the header, then the tensors in
    file order, which cover the rest exactly) and compared before anything is returned.

    ``views`` names the keys whose tensors are only copied from (a module's
    load_state_dict copies into its parameters): on the host those come back as views of
    a private memory map of the file, with no new memory to fault in and no read into it;
    every other tensor is its own copy, as without ``views``.
    """
    counted = meta.get("tensors")
    try:
        with open(path, "rb") as raw:
            size = os.fstat(raw.fileno()).st_size
            f: Any = raw if expect is None else _HashingReader(raw, expect)
            entries = _read_header(f, size)
            if isinstance(counted, dict) and counted.get("count") == 0:
                if entries:
                    raise ValueError(
                        f"it holds {len(entries)} tensor(s), where {STATE} counts none"
                    )
                out: Mapping[str, torch.Tensor] = {}
            elif views is not None and _on_host(device) and any(views(e.key) for e in entries):
                out = _map_tensors(raw, f, entries, size, views)
            else:
                out = _read_tensors(f, entries, device)
            if isinstance(f, _HashingReader):
                f.check(path, size)
            return out
    except FileNotFoundError:
        raise RecordError(f"{path} is missing; the checkpoint is incomplete") from None
    except (OSError, ValueError) as exc:
        raise RecordError(
            f"{path} is not a readable safetensors file ({exc}); the checkpoint "
            "is damaged, resume from an earlier one"
        ) from exc


class _HashingReader:
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
class _Entry:
    key: str
    code: str
    shape: tuple[int, ...]
    start: int  # absolute file offsets
    end: int


def _read_header(f: io.BufferedReader, size: int) -> list[_Entry]:
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
    entries: list[_Entry] = []
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
        entries.append(_Entry(key, code, tuple(shape), base + offsets[0], base + offsets[1]))
    entries.sort(key=lambda e: (e.start, e.end))
    at = base
    for e in entries:  # the tensors cover the data exactly: no gap, no overlap
        if e.start != at:
            raise ValueError(f"tensor {e.key!r} starts at byte {e.start}, expected {at}")
        at = e.end
    if at != size:
        raise ValueError(f"the tensors end at byte {at}, the file at {size}")
    return entries


def _on_host(device: str | torch.device | None) -> bool:
    return device is None or str(device).split(":")[0] == "cpu"


def _map_tensors(
    raw: io.BufferedReader,
    f: io.BufferedReader | _HashingReader,
    entries: list[_Entry],
    size: int,
    views: Callable[[str], bool],
) -> dict[str, torch.Tensor]:
    """The tensors out of a private memory map of the file (hashed from it when ``f``
    hashes; :func:`~acceptrun._util.mapped.map_private`): views where ``views(key)``,
    copies otherwise."""
    import torch

    from acceptrun._util.mapped import map_private

    by_code = {code: dtype for dtype, code in _dtypes().items()}
    mapped = map_private(raw.fileno(), size)
    if isinstance(f, _HashingReader):
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


def _read_tensors(
    f: io.BufferedReader, entries: list[_Entry], device: str | torch.device | None
) -> dict[str, torch.Tensor]:
    import torch

    by_code = {code: dtype for dtype, code in _dtypes().items()}
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


def _decode_all(
    root: Path,
    meta: dict[str, Any],
    tensors: Mapping[str, torch.Tensor],
    objects: Mapping[str, Any],
    rng: bool,
    strict: bool,
) -> tuple[dict[str, Any], list[tuple[str, Any, Any]], Any, list[str]]:
    """Decode every saved entry against ``objects``: (values, loads, RNG state, notes)."""
    saved: dict[str, Any] = meta["objects"]
    missing = [n for n in objects if n not in saved]
    unexpected = [n for n in saved if n not in objects]
    notes: list[str] = []
    if missing or unexpected:
        problem = f"names not in the checkpoint: {missing}; only in the checkpoint: {unexpected}"
        if strict:
            raise UserError(f"{root}: {problem}; pass the names it was saved with, or strict=False")
        notes.append(f"not strict, skipped {problem}")

    # Decode and check everything first: a damaged checkpoint leaves the objects untouched.
    values: dict[str, Any] = {}
    loads: list[tuple[str, Any, Any]] = []
    for name, entry in saved.items():
        state = _decode(entry["state"], tensors, name)
        obj = objects.get(name)
        if entry["kind"] == "generator" or _is_generator(obj):
            if name in objects and not (entry["kind"] == "generator" and _is_generator(obj)):
                raise UserError(
                    f"{name}: saved as {entry['kind']} but a {type(obj).__name__} was passed"
                )
            if name in objects:
                loads.append((name, obj, state))
            continue
        if name in objects and (entry["kind"] == "value") == _is_stateful(obj):
            saved_as = "a plain value" if entry["kind"] == "value" else "state_dict()"
            raise UserError(
                f"{name}: saved as {saved_as} but a {type(obj).__name__} was passed; pass None "
                "for a plain value (it comes back in result['values']) and the object itself "
                "for a model, optimizer, ..."
            )
        if entry["kind"] == "value":
            values[name] = state
        elif name in objects:
            if "module_metadata" in entry:  # nn.Module reads versions from this attribute
                ordered: Any = OrderedDict(state)
                ordered._metadata = _decode(entry["module_metadata"], tensors, name)
                state = ordered
            loads.append((name, obj, state))
    rng_state = _decode(meta["rng"], tensors, _RNG) if rng and meta.get("rng") else None
    return values, loads, rng_state, notes


def _group_values(obj: Any) -> list[dict[str, Any]] | None:
    """An optimizer's param_group values before a load (None for anything else)."""
    groups = getattr(obj, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return None
    return [dict(g) for g in groups]


def _keep_group_identity(obj: Any, before: list[dict[str, Any]] | None) -> None:
    """Put back the optimizer's own objects where a load left equal copies.

    torch builds every param_group from one ``defaults`` dict, so its groups share
    objects (Adam's ``betas`` tuple). Loaded from JSON each group gets its own copy:
    equal values, but ``torch.save(opt.state_dict())`` pickles shared and separate
    objects differently, so the script's own save after a resume would differ byte for
    byte from the uninterrupted run's. Only a value equal to the one it replaces (same
    type) is swapped back; changed ones (a scheduled ``lr``) stay as loaded.
    """
    groups = getattr(obj, "param_groups", None)
    if before is None or not isinstance(groups, list) or len(groups) != len(before):
        return
    for group, old in zip(groups, before, strict=True):
        for key, value in group.items():
            if key == "params" or key not in old:
                continue
            previous = old[key]
            if previous is not value and type(previous) is type(value) and _same(previous, value):
                group[key] = previous


def _same(a: Any, b: Any) -> bool:
    """Equal plain values (no tensors: their == is elementwise)."""
    if _is_tensor(a) or _is_tensor(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an exotic value whose == raises: keep the loaded one
        return False


def _restore_rng(state: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    random.setstate(state["python"])
    if state.get("torch") is not None:  # saved where torch was imported
        import torch

        torch.set_rng_state(state["torch"].cpu())
    if state.get("numpy") is not None:
        np = _numpy()
        if np is None:
            notes.append("NumPy RNG not restored: numpy is not importable here")
        else:
            np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda is not None:
        import torch

        saved_count = cuda["device_count"]
        here = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if here < saved_count:
            notes.append(
                f"CUDA RNG not restored: saved with {saved_count} GPU(s), {here} here; "
                "random numbers drawn on the GPU (dropout) differ from the original run"
            )
        else:
            for index, rng_state in enumerate(cuda["states"]):
                torch.cuda.set_rng_state(rng_state.cpu(), index)
    return notes
