"""A sharded save's begin, write and commit: what the synchronous and the background save share.

Rank 0 begins the step's staging directory and broadcasts its path (as bytes, not
pickled); every rank writes its shards through DCP into it; rank 0 adopts every rank's
file hashes and commits (checkpoint/sharded/__init__.py tells the whole protocol).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from acceptrun.checkpoint.dcp_storage import DCPWriter, JsonSavePlanner
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.checkpoint.writer import CheckpointWriter
from acceptrun.errors import RecordError

__all__ = ["ONE_PROCESS", "begin", "broadcast_text", "describe", "rank_of", "write_and_commit"]

# DCP warns that a save without a process group is "a single process": that is the intent
# here. The filter is set once, on the caller's thread (catch_warnings is not thread-safe).
ONE_PROCESS = "torch.distributed is disabled, unavailable or uninitialized"


def rank_of(group: Any) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def broadcast_text(text: str | None, group: Any) -> str:
    """Rank 0's ``text`` on every rank, sent as bytes in tensors (no pickle)."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    data = torch.tensor(list((text or "").encode()), dtype=torch.uint8)
    size = torch.tensor([data.numel() if text is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    if text is None:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    if size.item():
        dist.broadcast(data, src=src, group=group)
    return bytes(data.tolist()).decode()


def begin(store: CheckpointStore, step: int, rank: int, world: int, group: Any) -> CheckpointWriter:
    """Rank 0 begins the save of ``step``; the others join its staging directory."""
    if rank == 0:
        writer: CheckpointWriter | None = None
        try:
            store.remove_stale_staging()
            writer = store.begin(step)
        finally:
            if world > 1:  # tell the others even when begin failed ("" = no save)
                broadcast_text(str(writer.path) if writer else "", group)
        return writer
    path = broadcast_text(None, group)
    if not path:
        raise RecordError(f"rank 0 could not begin the sharded save of step {step}; see its error")
    return store.join(step, path)


def describe(exc: BaseException) -> str:
    """An error's words; DCP's CheckpointException: each failed rank's, without tracebacks."""
    if isinstance(exc, CheckpointException):
        return "; ".join(
            f"rank {r}: {e}" if isinstance(e, RecordError) else f"rank {r}: {type(e).__name__}: {e}"
            for r, (e, _) in sorted(exc.failures.items())
        ).rstrip(".")
    return str(exc).rstrip(".")


def write_and_commit(
    store: CheckpointStore,
    writer: CheckpointWriter,
    state_dict: dict[str, Any],
    *,
    rank: int,
    world: int,
    group: Any,
    metrics: Mapping[str, float] | None,
    meta: Mapping[str, Any] | None,
    planner: JsonSavePlanner | None,
    retain: bool = True,
    refuse: Exception | None = None,
) -> CheckpointInfo:
    """DCP writes this rank's shards into ``writer``; rank 0 commits once all have written.

    ``retain=False``: rank 0 leaves the pruning of older checkpoints to the caller.
    ``refuse``: this rank's write fails with it, inside DCP's save, so that every rank
    fails the save at the same collective (none waits for the others forever)."""
    step = writer.step
    storage = DCPWriter(
        store, writer, metrics=metrics, meta={**(meta or {}), "world_size": world},
        retain=retain, refuse=refuse,
    )  # fmt: skip
    try:
        dcp_save(
            state_dict,
            storage_writer=storage,
            planner=planner or JsonSavePlanner(),
            process_group=group,
            no_dist=world == 1 and not dist.is_initialized(),
        )
    except BaseException as exc:
        if writer.state == "committed":
            # Every rank had written (the commit runs after DCP's gather of the writes);
            # only telling the others failed, so the checkpoint is whole.
            info = store.get(step)
            if info is not None:
                return info
        store.abort(writer)  # the owner removes the staging directory; a joined rank leaves it
        if isinstance(exc, Exception | CheckpointException):
            raise RecordError(
                f"the sharded save of step {step} failed (rank {rank} of {world}): "
                f"{describe(exc)}. Nothing was committed; earlier checkpoints are intact"
            ) from exc
        raise
    info = storage.info if storage.info is not None else store.get(step)
    if info is None:
        raise RecordError(
            f"the sharded save of step {step} finished but {store.root}/step-{step} has no manifest"
        )
    return info
