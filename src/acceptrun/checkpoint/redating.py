"""Re-dating several watched checkpoints at once, in an order that frees each new step first.

A watched checkpoint's step can be an estimate proven later (supervisor/external.py):
with scalars and saves every 500 steps read late, each capture is dated one save behind
until the next proves it, so re-dating the older one needs the step the newer one holds
on an estimate. :func:`redate_in_order` makes such moves from the free end of the chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import RecordError, UserError

__all__ = ["redate_in_order"]


def redate_in_order(
    store: CheckpointStore, moves: Mapping[int, tuple[int, Mapping[str, Any]]]
) -> tuple[dict[int, CheckpointInfo], dict[int, Exception]]:
    """Re-date several checkpoints (step -> (new step, meta)): (done, failed), by old step.

    A chain such as 1 -> 500 while 500 -> 1000 is done from the one whose new step is
    free: 500 -> 1000 first, then 1 -> 500 (each :meth:`CheckpointStore.redate`). A move
    whose new step stays held (by a checkpoint not moving, or a cycle), or was held by a
    checkpoint deleted since (:meth:`CheckpointStore.taken`), is left undone, in neither.
    """
    left, done = dict(moves), {}
    failed: dict[int, Exception] = {}
    while left:
        ready = [
            old for old, (new, _) in left.items()
            if new == old or not (store.root / f"step-{new}").exists()
        ]  # fmt: skip
        if not ready:
            break
        for old in sorted(ready, key=lambda o: left[o][0], reverse=True):
            new, meta = left.pop(old)
            if new != old and store.taken(new):
                continue  # a deleted checkpoint's step: never used again
            try:
                done[old] = store.redate(old, new, meta=meta)
            except (UserError, RecordError, OSError) as exc:
                failed[old] = exc
    return done, failed
