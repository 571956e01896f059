"""An acceptrun run (one process) whose last sharded async save is in flight at run.finish().

Saves ``w`` after each of 4 steps through ``run.checkpoint_store()`` with
``sharded.async_save`` and never waits. The last save's background write is held until
``run.finish()`` has begun (``run.finished``) and the mirror has nothing else to do
(steps 1 and 2 uploaded, step 0 retired), so the finish meets the save in flight: it
must wait for the commit before the mirror drains, or step 3 never reaches the mirror.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import acceptrun
from acceptrun.checkpoint import sharded
from acceptrun.checkpoint.mirror_remote import remote_steps

HOLD_S = 120.0  # seconds the held write waits for run.finish() at most

run = acceptrun.init()
store = run.checkpoint_store()


def mirror_idle_and_finishing() -> bool:
    url = f"{run.spec.checkpoint.mirror.rstrip('/')}/{run.run_id}"
    return run.finished and remote_steps(url) == [1, 2]


class UntilFinishing(sharded.JsonSavePlanner):
    """Holds the write (on its first item) until run.finish() has begun, the mirror idle."""

    held = False

    def resolve_data(self, write_item: Any) -> Any:
        deadline = time.monotonic() + HOLD_S
        while not self.held and not mirror_idle_and_finishing():
            if time.monotonic() > deadline:
                raise RuntimeError(f"run.finish() did not begin within {HOLD_S} s")
            time.sleep(0.05)  # polling a condition, not a guess at how long anything takes
        self.held = True
        return super().resolve_data(write_item)


w = torch.zeros(10_000)
for step in run.steps(4):
    w.add_(1.0)
    run.log(step, loss=1.0 / (step + 1))
    planner = UntilFinishing() if step == 3 else None
    sharded.async_save(store, step, {"w": w, "train": {"step": step}}, planner=planner)
run.finish()
