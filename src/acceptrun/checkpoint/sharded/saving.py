"""The sharded saves: :func:`save` (synchronous) and :func:`async_save` (in the background).

An async save blocks the caller only while its shards are copied into host memory; the
files are written, hashed, fsynced and committed by a background thread whose
collectives use a gloo group of their own (:func:`background_group`), never the training
loop's; :func:`wait` and the process's exit wait for the newest save of a directory. A
save of either kind first settles the one in flight on the same directory.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from acceptrun.checkpoint.dcp_storage import JsonSavePlanner, check_values
from acceptrun.checkpoint.overlap import Overlap
from acceptrun.checkpoint.sharded.write import ONE_PROCESS, begin, rank_of, write_and_commit
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import RecordError, UserError

__all__ = ["AsyncSave", "async_save", "background_group", "save", "wait"]


def save(
    store: CheckpointStore,
    step: int,
    state_dict: dict[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    meta: Mapping[str, Any] | None = None,
    process_group: Any = None,
    planner: JsonSavePlanner | None = None,
) -> CheckpointInfo:
    """Save a sharded ``state_dict`` as checkpoint ``step``: every rank calls it, together.

    ``state_dict`` holds tensors and DTensors (each rank writes only its local shards;
    replicated tensors are written once), Stateful objects, and JSON values. Returns the
    committed checkpoint on every rank. Blocks until the commit; on any failure (on any
    rank) nothing is committed and an error is raised on every rank that is still alive.
    An :func:`async_save` in flight on the same directory is waited for first.
    ``planner``: a :class:`JsonSavePlanner` with other options (default: a new one).

    ::

        sharded.save(store, step, {"model": model_sd, "optim": optim_sd, "step": step})
    """
    check_values(state_dict)
    _settle_previous(store, step)
    rank, world = rank_of(process_group)
    if world == 1 and not dist.is_initialized():
        warnings.filterwarnings("ignore", message=ONE_PROCESS)
    writer = begin(store, step, rank, world, process_group)
    return write_and_commit(
        store, writer, state_dict, rank=rank, world=world, group=process_group,
        metrics=metrics, meta=meta, planner=planner,
    )  # fmt: skip


# ---- the asynchronous save --------------------------------------------------------------------


class AsyncSave:
    """One sharded save in flight: staged in host memory, persisted by a background thread.

    ``step``, ``stall_s`` (seconds the caller was blocked: waiting for the previous save
    plus the host copy) and ``nbytes`` (bytes this rank staged) are known at once.
    """

    def __init__(self, store: CheckpointStore, step: int, stall_s: float, nbytes: int) -> None:
        self.store = store
        self.step = step
        self.stall_s = stall_s
        self.nbytes = nbytes
        self.persist_s: float | None = None  # seconds from staged to committed (or failed)
        self._done = threading.Event()
        self._settled = threading.Event()  # done, and the older checkpoints pruned
        self._info: CheckpointInfo | None = None
        self._error: RecordError | None = None
        self._reported = False  # the error was raised to the caller at least once

    def done(self) -> bool:
        """True once the save is committed or has failed (never blocks)."""
        return self._done.is_set()

    def wait(self) -> CheckpointInfo:
        """Block until the save ends: the committed checkpoint, or its :class:`RecordError`.

        A failure on any rank (an error, a rank killed) is raised on every rank still
        alive, and nothing was committed: the previous checkpoint is still LATEST.
        """
        self._done.wait()
        if self._error is not None:
            self._reported = True
            raise self._error
        assert self._info is not None, "a finished save has a checkpoint or an error"
        return self._info

    def result(self) -> CheckpointInfo:
        """The same as :meth:`wait` (the name ``concurrent.futures.Future`` uses)."""
        return self.wait()

    def _run(
        self, staged: dict[str, Any], group: Any, later: _Deferred | None, **kwargs: Any
    ) -> None:
        """The background thread: the deferred copies, then begin or join, write this
        rank's shards, commit (rank 0)."""
        t0 = time.perf_counter()
        rank, world = kwargs["rank"], kwargs["world"]
        refused: Exception | None = None
        if later is not None:
            try:
                later.run(self)
            except RecordError as exc:  # written into DCP's save: every rank fails it
                refused = exc
        try:
            writer = begin(self.store, self.step, rank, world, group)
            self._info = write_and_commit(
                self.store, writer, staged, group=group, retain=False, refuse=refused, **kwargs
            )
        except BaseException as exc:  # kept for wait(), recorded now: never silent
            error = exc if isinstance(exc, RecordError) else None
            if error is None:
                error = RecordError(
                    f"the sharded save of step {self.step} failed (rank {rank} of {world}): "
                    f"{type(exc).__name__}: {exc}. Nothing was committed; earlier checkpoints "
                    "are intact"
                )
                error.__cause__ = exc
            self._error = error
            _emit(self.store, "checkpoint_failed", {"step": self.step, "error": str(error)})
        finally:
            staged.clear()  # the staged tensors stay in the buffers for the next save
            self.persist_s = time.perf_counter() - t0
            self._done.set()
        # After wait() returned: the retired checkpoints go while the loop trains on; the
        # next save (and the process's exit) waits for this, so two never overlap.
        try:
            if rank == 0 and self._info is not None:
                self.store.apply_retention()  # a failed delete is an event of its own
        except Exception as exc:  # the save is committed; say the pruning failed
            print(
                f"acceptrun: pruning older checkpoints of {self.store.root} after step "
                f"{self.step} failed: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
        finally:
            self._settled.set()


@dataclasses.dataclass
class _Slot:
    """One checkpoint directory's asynchronous saves: the newest, and the staging buffers."""

    handle: AsyncSave | None = None
    buffers: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


_slots: dict[str, _Slot] = {}  # by the store's absolute root: stores of one directory share
_slots_lock = threading.Lock()
_groups: dict[tuple[int, int], Any] = {}  # (default group, process group) ids -> gloo group
_exit_hook = False


def _slot(store: CheckpointStore) -> _Slot:
    with _slots_lock:
        return _slots.setdefault(os.path.abspath(store.root), _Slot())


def _emit(store: CheckpointStore, kind: str, fields: dict[str, Any]) -> None:
    """Record an event through the store's sink; a failing sink is reported, not raised."""
    try:
        store._emit(kind, fields)
    except Exception as exc:  # the event sink is the run's record: say so, keep saving
        print(f"acceptrun: could not record {kind} {fields}: {exc}", file=sys.stderr)


def _settle_previous(store: CheckpointStore, step: int) -> None:
    """Wait for the save in flight on ``store``'s directory; raise its unreported failure."""
    previous = _slot(store).handle
    if previous is None:
        return
    previous._settled.wait()
    if previous._error is not None and not previous._reported:
        previous._reported = True
        raise RecordError(
            f"the sharded save of step {previous.step} in {store.root} was not committed "
            f"({previous._error}); the save of step {step} was not started. Fix the cause "
            "and save again"
        ) from previous._error


def background_group(process_group: Any = None, *, timeout: timedelta | None = None) -> Any:
    """The gloo group that background saves over ``process_group`` use; made once, collectively.

    A collective from the saving thread must not share a process group with the training
    loop's collectives (the two would interleave). Every rank of the default group calls
    it the first time (``async_save`` does, on its first call), or every rank of
    ``process_group`` when one is given. ``timeout``: how long a background collective
    waits for a rank that stopped answering (default: the training group's timeout).
    """
    default = dist.group.WORLD
    key = (id(default), id(process_group))
    group = _groups.get(key)
    if group is None:
        timeout = timeout or _timeout_of(process_group or default)
        if process_group is None:
            group = dist.new_group(backend="gloo", timeout=timeout)
        else:
            ranks = dist.get_process_group_ranks(process_group)
            group = dist.new_group(
                ranks, backend="gloo", timeout=timeout, use_local_synchronization=True
            )
        # The groups are kept, so the ids of the key cannot be reused by new objects.
        _groups[key] = (default, process_group, group)
        return group
    return group[2]


def _timeout_of(group: Any) -> timedelta | None:
    """A group's collective timeout, read from its CPU backend (None: not readable)."""
    try:
        value = group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):  # no CPU backend, or another torch
        return None
    return value if isinstance(value, timedelta) else None


@torch.no_grad()
def _stage(
    value: Any,
    path: str,
    old: dict[str, torch.Tensor],
    new: dict[str, torch.Tensor],
    later: _Deferred | None = None,
) -> Any:
    """A copy of ``value`` in host memory that no later step can change.

    Tensors are copied into the buffers of the previous save (``old``) when shape, dtype
    and pinning match, else into new ones (pinned for CUDA tensors); DTensors keep their
    sharding with a host copy of the local shard. JSON values are deep-copied. A host
    tensor that ``later`` holds (an overlapped optimizer's parameter or state) gets its
    buffer now and its copy in the background (:class:`_Deferred`).
    """
    if isinstance(value, torch.Tensor):
        local = value.to_local() if isinstance(value, DTensor) else value.detach()
        pin = local.device.type == "cuda"
        buf = old.get(path)
        if (
            buf is None
            or buf.shape != local.shape
            or buf.dtype != local.dtype
            or buf.is_pinned() != pin
        ):
            buf = torch.empty(local.shape, dtype=local.dtype, pin_memory=pin)
        if later is not None and later.takes(local):
            later.add(path, local, buf)
        else:
            buf.copy_(local, non_blocking=pin)  # the copy the training loop waits for
        new[path] = buf
        if isinstance(value, DTensor):
            # The same spec (mesh, placements, global shape) over the host copy, as torch's
            # own stager builds it: DTensor.from_local would move it back to a GPU mesh.
            return DTensor(buf, value._spec, requires_grad=False)  # type: ignore[no-untyped-call]
        return buf
    if isinstance(value, Mapping):
        return {k: _stage(v, f"{path}.{k}", old, new, later) for k, v in value.items()}
    if isinstance(value, list | tuple) and any(
        isinstance(v, torch.Tensor | Mapping | list | tuple) for v in value
    ):
        items = [_stage(v, f"{path}.{i}", old, new, later) for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    if callable(getattr(value, "state_dict", None)):
        raise UserError(
            f"sharded checkpoint value {path!r} is a {type(value).__name__} inside the state "
            "dict: only top-level Stateful objects are saved (as DCP does); put it at the "
            "top level or pass its state_dict()"
        )
    return copy.deepcopy(value)  # a JSON value (checked): a later change must not leak in


class _Deferred:
    """An async save's copies left to its background thread (``async_save(overlap=)``).

    Holds the storage addresses of the overlapped optimizers' parameters and state: a
    host tensor of the state dict at one of them changes only in their ``step()``. Its
    :class:`~acceptrun.checkpoint.overlap.Overlap` makes any optimizer step wait for it.
    """

    def __init__(self, addresses: dict[int, torch.Tensor]) -> None:
        # Storage address -> the optimizer's own (local) tensor there. Its version counter
        # is the one an in-place change bumps: a state dict's DTensor may hold another
        # tensor object over the same memory, with a counter of its own.
        self.addresses = addresses
        self.copies: list[tuple[str, torch.Tensor, torch.Tensor, tuple[int, int]]] = []
        self.overlap: Overlap | None = None  # set by arm()

    @classmethod
    def of(cls, overlap: Any) -> _Deferred | None:
        if overlap is None:
            return None
        optimizers = [overlap] if isinstance(overlap, torch.optim.Optimizer) else list(overlap)
        addresses: dict[int, torch.Tensor] = {}
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise UserError(
                    f"async_save(overlap=...) takes torch.optim optimizers, not a "
                    f"{type(opt).__name__}: the copy may overlap only what their step() changes"
                )
            tensors = [p for group in opt.param_groups for p in group["params"]]
            tensors += [v for state in opt.state.values() for v in state.values()]
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    local = t.to_local() if isinstance(t, DTensor) else t
                    if local.device.type == "cpu" and local.numel():
                        addresses[local.data_ptr()] = local
        return cls(addresses)

    def takes(self, local: torch.Tensor) -> bool:
        return (
            local.device.type == "cpu" and local.numel() > 0 and local.data_ptr() in self.addresses
        )

    def add(self, path: str, local: torch.Tensor, buf: torch.Tensor) -> None:
        self.copies.append((path, local, buf, self._versions(local)))

    def _versions(self, local: torch.Tensor) -> tuple[int, int]:
        return local._version, self.addresses[local.data_ptr()]._version

    def arm(self, handle: AsyncSave) -> None:
        """From now until the copies are done, any optimizer step waits for them."""
        self.overlap = Overlap(
            handle.step, handle.stall_s, handle.nbytes,
            lambda kind, fields: _emit(handle.store, kind, fields),
        )  # fmt: skip
        self.overlap.arm()

    def run(self, handle: AsyncSave) -> None:
        """Copy (background thread); raises RecordError naming a tensor changed before it."""
        assert self.overlap is not None, "arm() comes first"
        try:
            handle.stall_s += self.overlap.run(lambda: self._copy(handle.step))
        finally:
            self.copies = []

    def _copy(self, step: int) -> None:
        for path, local, buf, versions in self.copies:
            buf.copy_(local)
            if self._versions(local) != versions:
                raise RecordError(
                    f"the sharded save of step {step}: {path!r} was changed in place after "
                    "async_save() and before it was copied, by something other than a "
                    "torch.optim optimizer's step() (which waits for the copy); the save "
                    "was refused rather than commit a state that is not its step's. Pass "
                    "overlap=None (the copy then finishes inside the call), or change these "
                    "tensors in place only in the optimizer's step()"
                )


def async_save(
    store: CheckpointStore,
    step: int,
    state_dict: dict[str, Any],
    *,
    metrics: Mapping[str, float] | None = None,
    meta: Mapping[str, Any] | None = None,
    process_group: Any = None,
    planner: JsonSavePlanner | None = None,
    overlap: Any = None,
) -> AsyncSave:
    """:func:`save`, with only the host copy of this rank's shards on the caller's time.

    Every rank calls it at the same step. It waits for the previous save of this
    directory (at most one in flight; a failure of it not yet raised by ``wait()`` is
    raised now, and this save is not started), copies ``state_dict``'s tensors into host
    buffers reused from save to save (Stateful objects: their ``state_dict()``, taken
    now), and returns; a background thread then writes, hashes, fsyncs and commits
    exactly as :func:`save` does, with its collectives on :func:`background_group`.
    ``wait()`` on the result (or :func:`wait`) returns the committed checkpoint or
    raises the failure as :class:`RecordError` on every rank still alive. A process
    that exits with a save in flight waits for it, and prints a failure to stderr.

    ::

        pending = sharded.async_save(store, step, {"model": msd, "optim": osd, "step": step})
        loss = train_step()                                # the save proceeds meanwhile
        pending.wait()                                     # before stopping

    ``overlap`` (a torch.optim optimizer, or several) takes even the copy off the
    caller's time for what only their ``step()`` changes: the host tensors of
    ``state_dict`` that are their parameters or state are copied by the background
    thread beside the next forward and backward, and the next ``step()`` of any torch.optim
    optimizer waits for that copy (a global step pre-hook). A tensor changed in place some
    other way before it was copied fails the save on every rank, naming it
    (:meth:`AsyncSave.wait` raises), rather than commit a state that is not its step's.
    Everything else (buffers, JSON values, CUDA tensors) is copied in the call.
    """
    t0 = time.perf_counter()
    state = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
    check_values(state)
    _settle_previous(store, step)
    rank, world = rank_of(process_group)
    distributed = dist.is_available() and dist.is_initialized()
    group = background_group(process_group) if distributed else None
    if not distributed:
        warnings.filterwarnings("ignore", message=ONE_PROCESS)
    slot = _slot(store)
    staged, later = _stage_all(state, slot, overlap)
    nbytes = sum(b.nbytes for b in slot.buffers.values())
    handle = AsyncSave(store, step, time.perf_counter() - t0, nbytes)
    if later is None:
        _emit(
            store,
            "checkpoint_stage",
            {"step": step, "stall_s": round(handle.stall_s, 6), "bytes": nbytes},
        )
    else:
        later.arm(handle)
    thread = threading.Thread(
        target=handle._run,
        args=(staged, group, later),
        kwargs={
            "rank": rank,
            "world": world,
            "metrics": dict(metrics or {}),
            "meta": {**(meta or {}), "async": True},
            "planner": planner,
        },
        name=f"acceptrun-sharded-save-{step}",
        daemon=True,  # the exit hook waits for it, so that a failure is still reported
    )
    _set_in_flight(slot, handle)
    thread.start()
    return handle


def _stage_all(
    state: dict[str, Any], slot: _Slot, overlap: Any
) -> tuple[dict[str, Any], _Deferred | None]:
    """Copy ``state``'s tensors into the slot's host buffers (reused from the last save);
    the ones ``overlap``'s optimizers alone change are left to the background copy."""
    fresh: dict[str, torch.Tensor] = {}
    later = _Deferred.of(overlap)
    staged = {k: _stage(v, k, slot.buffers, fresh, later) for k, v in state.items()}
    if later is not None and not later.copies:
        later = None
    if any(b.is_pinned() for b in fresh.values()):
        torch.cuda.synchronize()  # the device-to-host copies were queued; the loop waits
    slot.buffers = fresh
    return staged, later


def _set_in_flight(slot: _Slot, handle: AsyncSave) -> None:
    """``handle`` is the directory's save in flight; the first one registers the exit hook."""
    global _exit_hook
    with _slots_lock:
        slot.handle = handle
        if not _exit_hook:
            atexit.register(_wait_at_exit)
            _exit_hook = True


def wait(store: CheckpointStore) -> CheckpointInfo | None:
    """Wait for the newest :func:`async_save` of ``store``'s directory (None: there was none).

    Returns its committed checkpoint or raises its :class:`RecordError`. Call it before a
    graceful stop ends the process and before ``dist.destroy_process_group()``. Unlike
    :meth:`AsyncSave.wait`, which returns at the commit, it also waits for the pruning of
    older checkpoints that follows it (rank 0), so nothing of the save is left running.
    """
    handle = _slot(store).handle
    if handle is None:
        return None
    handle._settled.wait()
    return handle.wait()


def _wait_at_exit() -> None:
    """At process exit: finish every save in flight, and say which were not committed."""
    with _slots_lock:
        slots = list(_slots.items())
    for root, slot in slots:
        handle = slot.handle
        if handle is None:
            continue
        if not handle.done():
            print(
                f"acceptrun: waiting for the sharded save of step {handle.step} in {root} "
                "before exiting",
                file=sys.stderr,
            )
        handle._settled.wait()
        if handle._error is not None and not handle._reported:
            print(
                f"acceptrun: the sharded save of step {handle.step} in {root} was NOT "
                f"committed: {handle._error}",
                file=sys.stderr,
            )
