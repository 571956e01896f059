"""PyTorch training state without pickle: the format, and the codec of a state_dict.

A checkpoint of training state is two files in one directory:

- ``tensors.safetensors``: every tensor, keyed ``<object>/<path>`` (``model/encoder.weight``,
  ``optimizer/state/3/exp_avg``), streamed in the safetensors format;
- ``state.json``: everything else, with ``{"__tensor__": key}`` where a tensor was, plus
  the RNG states (Python, NumPy, torch CPU and CUDA) and the versions.

The load path (checkpoint/restore.py) reads only these two files, with ``json`` and
acceptrun's own reader of the safetensors format (checkpoint/tensorfile.py; the writer is
its own too, so restoring needs no package the save did not): no pickle, no
``torch.load``, so a checkpoint from an untrusted mirror cannot run code. The price is
that a state_dict may hold only tensors, numbers, strings, None, lists, tuples, dicts,
numpy arrays, dtypes and devices; anything else raises :class:`TypeError` naming it.
torch itself is optional: a process that never imported it saves and loads plain values
and numpy arrays without it (see :func:`loaded_torch`). A save is staged then written
(checkpoint/staging.py)::

    buffers = StagingBuffers()                     # reused across saves
    staged = stage({"model": model, "optimizer": opt, "scheduler": sched,
                    "loader": loader, "extra": {"epoch": epoch}}, buffers=buffers)
    write_staged(staged, writer)                   # writer.open(name) -> binary file
    ...
    out = load_into(path, {"model": model, "optimizer": opt, "scheduler": sched,
                           "loader": loader, "extra": None})
    epoch = out["values"]["extra"]["epoch"]

This module holds the format: the file names, the version, and the codec between a
state_dict and JSON plus a flat dict of tensors.
"""

from __future__ import annotations

import base64
import math
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from acceptrun.checkpoint.tensorfile import dtype_codes
from acceptrun.errors import AcceptrunTypeError, AcceptrunValueError, RecordError

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "RNG_KEY",
    "STATE",
    "TENSORS",
    "Encoder",
    "check_names",
    "decode",
    "is_generator",
    "is_module",
    "is_stateful",
    "is_tensor",
    "loaded_torch",
    "numpy_module",
    "rank_dir",
]

TENSORS = "tensors.safetensors"
STATE = "state.json"
FORMAT = "acceptrun.torch-state"
FORMAT_VERSION = 1


def loaded_torch() -> ModuleType | None:
    """torch if this process imported it, else None: then nothing here is a torch object.

    Saving never imports torch on a script's behalf: a workload that checkpoints plain
    values, numpy arrays or a JAX model's host copy does not pay torch's start-up (seconds
    of CPU, hundreds of MB). Loading imports it only for a checkpoint that holds tensors
    or a torch RNG state.
    """
    return sys.modules.get("torch")


def is_tensor(value: Any) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.Tensor)


def is_generator(value: Any) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.Generator)


def is_module(value: Any) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.nn.Module)


_TAGS = frozenset(
    {"__tensor__", "__tuple__", "__dict__", "__float__", "__ndarray__", "__dtype__", "__device__"}
)
RNG_KEY = "__rng__"  # tensor-key prefix of RNG states; object names may not start with "__"


def numpy_module() -> ModuleType | None:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def check_names(objects: Mapping[str, Any]) -> None:
    for name in objects:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("__"):
            raise AcceptrunValueError(
                f"object name {name!r}: use a non-empty name without '/' that does not "
                "start with '__', e.g. 'model' or 'optimizer'"
            )


def rank_dir(rank: int) -> str:
    """The directory of rank ``rank``'s own state inside a multi-process checkpoint."""
    return f"rank-{rank}"


# ---------------------------------------------------------------------------------------
# codec: state_dict <-> JSON + a flat dict of tensors


class Encoder:
    """Walks a value; returns its JSON form and collects tensors (not yet copied)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._torch = loaded_torch()

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
        np = numpy_module()
        if np is not None and isinstance(value, np.ndarray | np.generic):
            return _encode_ndarray(np, value, path)
        raise AcceptrunTypeError(_unsupported(value, path))

    def _add_tensor(self, tensor: torch.Tensor, path: str) -> str:
        import torch

        dtypes = dtype_codes()
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


def decode(value: Any, tensors: Mapping[str, torch.Tensor], path: str) -> Any:
    if isinstance(value, list):
        return [decode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]
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
        return tuple(decode(v, tensors, f"{path}[{i}]") for i, v in enumerate(value["__tuple__"]))
    if "__dict__" in value:
        return {
            decode(k, tensors, path): decode(v, tensors, f"{path}/{k}")
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
        np = numpy_module()
        if np is None:
            raise RecordError(f"{path}: holds a numpy array; install numpy to load it")
        dtype = np.dtype(value["dtype"])
        if dtype.hasobject:  # never from our writer: object arrays would need pickle
            raise RecordError(f"{path}: numpy dtype {dtype} holds Python objects; refused")
        raw = base64.b64decode(value["__ndarray__"])
        arr = np.frombuffer(raw, dtype=dtype).reshape(value["shape"]).copy()
        return arr[()] if value.get("scalar") else arr
    return {k: decode(v, tensors, f"{path}/{k}") for k, v in value.items()}
