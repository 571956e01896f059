"""Staging a checkpoint of training state: a host-memory snapshot, then its write.

An async save blocks the training loop only for :func:`stage` (copies to host memory);
:func:`write_staged` can run on a background thread. With ``defer=True``, :func:`stage`
copies only what may change before the next optimizer step and leaves the parameters and
optimizer state to :meth:`Staged.copy_pending`, which a background thread runs beside the
next forward and backward (see :class:`~acceptrun.checkpoint.saver.Checkpointer`, which
makes the optimizer wait for it). The format is checkpoint/state.py; loading is
checkpoint/restore.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from acceptrun.checkpoint.state import (
    FORMAT,
    FORMAT_VERSION,
    RNG_KEY,
    STATE,
    TENSORS,
    Encoder,
    check_names,
    is_generator,
    is_stateful,
    loaded_torch,
    numpy_module,
)
from acceptrun.checkpoint.tensorfile import BinarySink, write_safetensors
from acceptrun.errors import AcceptrunRuntimeError

if TYPE_CHECKING:
    import torch

__all__ = [
    "Staged",
    "StagingBuffers",
    "StateChangedDuringCopy",
    "StateWriter",
    "stage",
    "write_staged",
]


class StateWriter(Protocol):
    """Anything with ``open(name)`` returning a context manager over a binary file.

    :class:`acceptrun.checkpoint.writer.CheckpointWriter` is one; tests pass a small one.
    """

    def open(self, name: str) -> AbstractContextManager[BinarySink]: ...


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
    check_names(objects)
    enc = Encoder()
    entries: dict[str, Any] = {}
    deferrable: set[str] = set()
    defer = defer and buffers is not None and _has_optimizer(objects)
    for name, obj in objects.items():
        before = set(enc.tensors) if defer else set()
        if is_generator(obj):
            # A generator of the workload's own (batch sampling, augmentation): its state
            # is a byte tensor, restored with set_state.
            entry = {"kind": "generator", "state": enc.encode(obj.get_state(), name)}
        elif is_stateful(obj):
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
    np = numpy_module()
    torch = loaded_torch()
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
    torch = loaded_torch()
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


def _capture_rng(enc: Encoder, np: ModuleType | None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": enc.encode(random.getstate(), f"{RNG_KEY}/python"),
        "torch": None,
        "numpy": None if np is None else enc.encode(np.random.get_state(), f"{RNG_KEY}/numpy"),
        "cuda": None,
    }
    if loaded_torch() is None:  # no torch random number was drawn: none to restore
        return state
    import torch

    state["torch"] = enc.encode(torch.get_rng_state(), f"{RNG_KEY}/torch")
    # Not initialized means no CUDA random number was drawn in this process, and asking
    # would create a CUDA context (~0.5 GB of GPU memory, ~1 s) in a CPU-only job.
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = {
            "device_count": torch.cuda.device_count(),
            "states": enc.encode(torch.cuda.get_rng_state_all(), f"{RNG_KEY}/cuda"),
        }
    return state


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
            write_safetensors(f, staged.tensors, {"format": "pt", FORMAT: str(FORMAT_VERSION)})
        with writer.open(STATE) as f:
            f.write(json.dumps(staged.meta, separators=(",", ":"), allow_nan=False).encode())
    finally:
        staged.release()
