"""Sharded checkpoints (FSDP2, DTensor) through torch.distributed.checkpoint and the store.

Every rank writes only its own shards, so a model whose full state does not fit one
process is saved without a gather. PyTorch's DCP plans who writes what; acceptrun
supplies the storage (:mod:`~acceptrun.checkpoint.dcp_storage`) so that the save keeps
the store's guarantees:

- one staging directory for the step: rank 0 begins it, the others join it (its path is
  broadcast over the process group as bytes, not pickled);
- each rank writes one ``shard-<r>.bin`` of raw tensor bytes, hashed (xxh3) while written
  and fsynced;
- rank 0 writes DCP's global metadata as acceptrun's own JSON (``dcp-metadata.json``,
  never pickle), adopts every rank's file hashes and commits: MANIFEST last, directory
  fsynced, LATEST, retention, a checkpoint_commit event. If any rank fails or dies
  before that, nothing is committed and the previous checkpoint stays LATEST;
- non-tensor values (step, RNG state, loader position) are stored as JSON; anything else
  (a pickled or arbitrary object) is refused with the name of the value;
- a load verifies the checkpoint against its manifest first (a flipped byte: it is
  quarantined and the previous one is used), reads the metadata as JSON and serves DCP's
  planner reads, so a checkpoint saved by N ranks loads on M. Nothing is unpickled.

:func:`async_save` is the same save with the training loop blocked only while this
rank's shards are copied into host memory (reused buffers); the files are written,
hashed, fsynced and committed by a background thread whose collectives use a gloo group
of their own (:func:`background_group`), never the training loop's.

::

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from acceptrun.checkpoint import CheckpointStore, sharded

    store = CheckpointStore("ckpt", keep_last=2)
    model_sd, optim_sd = get_state_dict(model, opt)        # DTensors: this rank's shards
    sharded.save(store, step, {"model": model_sd, "optim": optim_sd, "step": step})

    pending = sharded.async_save(store, step, {"model": model_sd, "optim": optim_sd})
    ...                                                    # train on; then, or at a stop:
    pending.wait()                                         # the CheckpointInfo, or RecordError

    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    info = sharded.load(store, state)                      # None on a fresh start
    if info is not None:
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        start = state["step"] + 1

The rooms: sharded/write.py is a save's begin, write and commit (both saves share it),
sharded/saving.py the synchronous and the asynchronous save, sharded/loading.py the load
(choose a checkpoint, each rank hashes its share, the ranks agree).
"""

from acceptrun.checkpoint.dcp_storage import (
    FORMAT,
    METADATA,
    DCPReader,
    DCPWriter,
    JsonLoadPlanner,
    JsonSavePlanner,
    check_values,
)
from acceptrun.checkpoint.sharded.loading import load
from acceptrun.checkpoint.sharded.saving import AsyncSave, async_save, background_group, save, wait

__all__ = [
    "FORMAT",
    "METADATA",
    "AsyncSave",
    "DCPReader",
    "DCPWriter",
    "JsonLoadPlanner",
    "JsonSavePlanner",
    "async_save",
    "background_group",
    "check_values",
    "load",
    "save",
    "wait",
]
