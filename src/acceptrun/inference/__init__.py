"""Batch inference runs: the input cut into shards, outputs committed exactly once.

``run.inference`` (:class:`BatchJob`) hands out shards of the ``[inference]`` input;
``shard.commit(outputs)`` writes them atomically and marks them done in the record;
:mod:`.summary` checks coverage, throughput and cost per item at close. See
docs/inference.md, "Batch inference".
"""

from __future__ import annotations

from acceptrun.inference.batch import BatchJob, Shard
from acceptrun.inference.items import Item

__all__ = ["BatchJob", "Item", "Shard"]
