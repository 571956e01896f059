"""Batch inference runs: the input cut into shards, outputs committed exactly once.

``run.inference`` (:class:`BatchJob`, on the client side: :mod:`acceptrun.workload.batch`)
hands out shards of the ``[inference]`` input; ``shard.commit(outputs)`` writes them
atomically and marks them done in the record; :mod:`.summary` checks coverage, throughput
and cost per item at close. See docs/inference.md, "Batch inference".
"""

from __future__ import annotations

from acceptrun.workload.batch import BatchJob, Shard
from acceptrun.workload.items import Item

__all__ = ["BatchJob", "Item", "Shard"]
