"""Loading a sharded checkpoint: rank 0 chooses, each rank hashes its share, the ranks agree.

Rank 0 picks the newest checkpoint whose manifest, metadata and file sizes check; each
rank hashes its share of the shard files (its own one through a private memory map that
the load then copies from); the ranks agree before any tensor of the state dict changes,
and a bad shard is quarantined and the next older checkpoint tried.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from acceptrun._util.hashing import hash_bytes, hash_file, new_hasher, split_hash
from acceptrun._util.mapped import hash_range, map_private
from acceptrun.checkpoint.dcp_storage import FORMAT, DCPReader, JsonLoadPlanner
from acceptrun.checkpoint.sharded.write import broadcast_text, rank_of
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import RecordError, UserError

__all__ = ["load"]


def load(
    store: CheckpointStore,
    state_dict: dict[str, Any],
    *,
    step: int | None = None,
    process_group: Any = None,
) -> CheckpointInfo | None:
    """Fill ``state_dict`` in place from the newest verified checkpoint (or ``step``).

    Every rank calls it with its own (sharded) state dict, in any number of ranks. The
    checkpoint is verified against its manifest before any tensor of ``state_dict``
    changes, in one read of its bytes: rank 0 checks the manifest, the metadata and every
    file's size; each rank hashes its share of the shard files as it reads them, its own
    through a memory map the load then copies from; all agree. One that fails is quarantined and the
    previous one is used (``step`` given: it must verify). Returns the checkpoint
    loaded, or None when there is none (a fresh start). JSON values are replaced by what
    was saved (tuples come back as lists).

    The store of a restore drill (``run.checkpoint_store()`` under ``acceptrun ckpt
    drill``) carries hooks, read here: ``restore_source``, the run's own store, which the
    load reads (without quarantining anything: a drill changes no checkpoint);
    ``restore_step``, the step the drill verified and restores (as ``step``); and
    ``on_sharded_load(info, seconds, rank, world)``, which tells the run that this rank
    restored, so that the drill counts the load as its restore (a run's own store has
    that one too: a ``restored`` event).
    """
    rank, world = rank_of(process_group)
    source: CheckpointStore = getattr(store, "restore_source", None) or store
    if step is None:
        step = getattr(store, "restore_step", None)
    skip: set[int] = set()  # steps found bad without quarantining them (a drill's source)
    while True:
        info = _choose(source, step, skip, rank, world, process_group, store)
        if info is None:
            return None
        if info.meta.get("format") != FORMAT:
            raise UserError(
                f"{info.path} was not saved by sharded.save; load it with acceptrun.checkpoint.restore.load_into"
            )
        t0 = time.perf_counter()
        # One read of the tensor bytes: each rank hashes its share of the shard files as it
        # reads them (its own file mapped for the load); all agree before any tensor of
        # the state dict changes. Any failure here is this rank's word in the agreement,
        # never an exception that leaves the others waiting in it.
        problem, preloaded = "", {}
        try:
            preloaded = _read_share(info, rank, world)
        except RecordError as exc:
            problem = str(exc)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        verdict = _agree(problem, rank, world, process_group, info, source, store, step, skip)
        if verdict == "retry":
            continue
        break
    # no_dist: each rank plans its own reads from the JSON metadata, so no plans are
    # exchanged (DCP pickles those between ranks); ranks may differ in number from the save.
    with warnings.catch_warnings():  # DCP warns that no_dist means "a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(
            state_dict,
            storage_reader=DCPReader(info, preloaded=preloaded),
            planner=JsonLoadPlanner(),
            no_dist=True,
        )
    report = getattr(store, "on_sharded_load", None)
    if report is not None:
        report(info, time.perf_counter() - t0, rank, world)
    return info


_SHARD = re.compile(r"shard-(\d+)\.bin")


def _is_shard(name: str) -> bool:
    """A rank's tensor bytes (``shard-<r>.bin``): hashed by the ranks as they read them."""
    return _SHARD.fullmatch(name) is not None


def _choose(
    source: CheckpointStore,
    step: int | None,
    skip: set[int],
    rank: int,
    world: int,
    group: Any,
    store: CheckpointStore,
) -> CheckpointInfo | None:
    """Rank 0 picks the checkpoint (every file checked but the shards, which the ranks
    hash as they read them) and tells the others; None: there is none."""
    chosen: str | None = None
    if rank == 0:
        try:
            if step is None:
                info = source.latest_verified(
                    quarantine=source is store, defer=_is_shard, skip=skip
                )
            else:
                result = source.verify(step, defer=_is_shard)
                result.raise_for_problems()
                info = source.get(step)
            chosen = "" if info is None else str(info.step)
        finally:
            if world > 1:
                broadcast_text("error" if chosen is None else chosen, group)
    else:
        chosen = broadcast_text(None, group)
        if chosen == "error":
            raise RecordError("rank 0 could not choose a sharded checkpoint to load; see its error")
    if not chosen:
        return None
    info = source.get(int(chosen))
    if info is None:
        raise RecordError(
            f"checkpoint step-{chosen} of {source.root} disappeared before it was loaded"
        )
    return info


def _read_share(info: CheckpointInfo, rank: int, world: int) -> dict[str, torch.Tensor]:
    """Hash this rank's share of the shard files (``shard-<k>.bin`` with k % world ==
    rank) against the manifest; returns the one this rank loads itself, mapped into
    memory and hashed in one pass (:func:`_read_hashed`), so the load reads no byte twice.
    Raises RecordError naming a file whose bytes are not the ones committed."""
    kept: dict[str, torch.Tensor] = {}
    for name, entry in sorted(info.files.items()):
        match = _SHARD.fullmatch(name)
        if match is None or int(match.group(1)) % world != rank:
            continue
        path, expected = info.path / name, str(entry["hash"])
        algorithm = split_hash(expected)[0]
        if int(match.group(1)) == rank:
            data, digest = _read_hashed(path, int(entry["size"]), algorithm)
            kept[name] = data
        else:
            digest = hash_file(path, algorithm)[0]
        if digest != expected:
            raise RecordError(
                f"{info.path.name}/{name}: wrong hash ({digest}, manifest {expected})"
            )
    return kept


def _read_hashed(path: Path, size: int, algorithm: str) -> tuple[torch.Tensor, str]:
    """The file's bytes as a uint8 tensor over a private memory map, hashed in one pass
    (:func:`~acceptrun._util.mapped.map_private`): the load then copies each tensor from
    it into the state dict, so the bytes are read once, hashed once and copied once."""
    if size == 0:
        return torch.empty(0, dtype=torch.uint8), hash_bytes(b"", algorithm)
    with open(path, "rb") as f:
        actual = os.fstat(f.fileno()).st_size
        if actual != size:
            raise RecordError(f"{path}: {actual} bytes, its manifest says {size}")
        mapped = map_private(f.fileno(), size)
    hasher = new_hasher(algorithm)
    hash_range(hasher, mapped, 0, size)
    return torch.frombuffer(mapped, dtype=torch.uint8), f"{algorithm}:{hasher.hexdigest()}"


def _agree(
    problem: str,
    rank: int,
    world: int,
    group: Any,
    info: CheckpointInfo,
    source: CheckpointStore,
    store: CheckpointStore,
    step: int | None,
    skip: set[int],
) -> str:
    """Every rank's share checked: "ok" to load; "retry" after rank 0 set the bad checkpoint
    aside (quarantined, or skipped in a drill); a RecordError on every rank for a named
    ``step`` that failed."""
    problems = [problem] if world == 1 else _gather_text(problem, group)
    verdict = "ok"
    if rank == 0:
        bad = [f"rank {r}: {p}" if world > 1 else p for r, p in enumerate(problems) if p]
        if bad and step is not None:
            verdict = "fail:" + "; ".join(bad)
        elif bad:
            if source is store:
                source.quarantine(info.path, "failed verification: " + "; ".join(bad))
            else:
                skip.add(info.step)
            verdict = "retry"
    if world > 1:
        verdict = broadcast_text(verdict if rank == 0 else None, group)
        if verdict == "retry":
            skip.add(info.step)
    if verdict.startswith("fail:"):
        raise RecordError(
            f"checkpoint step-{info.step} of {source.root} does not verify: {verdict[5:]}"
        )
    return verdict


def _gather_text(text: str, group: Any) -> list[str]:
    """Every rank's ``text``, in rank order, on every rank (bytes in tensors, no pickle)."""
    world = dist.get_world_size(group)
    data = (
        torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
        if text
        else torch.empty(0, dtype=torch.uint8)
    )
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64), group=group)
    longest = max(int(n.item()) for n in sizes)
    if not longest:
        return [""] * world
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: data.numel()] = data
    out = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [o[: int(n.item())].numpy().tobytes().decode() for o, n in zip(out, sizes, strict=True)]
