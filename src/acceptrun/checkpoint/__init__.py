"""Checkpoints that always restore.

- :mod:`~acceptrun.checkpoint.store`: atomic ``step-<N>/`` directories, manifests with
  content hashes, LATEST, verification, quarantine, retention (no torch import);
- :mod:`~acceptrun.checkpoint.state`: PyTorch state without pickle (safetensors + JSON),
  RNG states, device mapping: staged and written by :mod:`~acceptrun.checkpoint.staging`,
  loaded by :mod:`~acceptrun.checkpoint.restore`, the file itself in
  :mod:`~acceptrun.checkpoint.tensorfile`;
- :mod:`~acceptrun.checkpoint.loader`: a sampler and loader wrapper that resume data order
  exactly;
- :mod:`~acceptrun.checkpoint.saver`: async saves (stage, then persist in the background);
- :mod:`~acceptrun.checkpoint.mirror`: copies off the machine through fsspec (the upload
  queue), :mod:`~acceptrun.checkpoint.mirror_remote`: the remote store and fetch;
- :mod:`~acceptrun.checkpoint.sharded`: FSDP2/DTensor state saved shard by shard through
  torch.distributed.checkpoint into the store (JSON metadata, no pickle, resharding),
  synchronously or in the background (``async_save``);
- :mod:`~acceptrun.checkpoint.dcp_storage`: the DCP storage writer/reader and planners
  that sharded saves and loads use.

The torch-dependent names are imported lazily, so the supervisor can use the store
without importing torch.
"""

from __future__ import annotations

from typing import Any

from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore, VerifyResult

__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "ResumableLoader",
    "ResumableSampler",
    "VerifyResult",
]


def __getattr__(name: str) -> Any:
    if name in ("ResumableLoader", "ResumableSampler"):
        from acceptrun.checkpoint import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'acceptrun.checkpoint' has no attribute {name!r}")
