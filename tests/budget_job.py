"""A budget job for the budget tests of both tiers: a client workload with a counter, a
workspace price list at 1 USD a second, and a spec with the given limits."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

# No torch import before the first step: the budget clock starts at launch, so the first
# step usually comes well before the stop (torch is imported by the checkpoint at the stop,
# inside the grace period). On a loaded machine the stop may still come first: the test
# accepts both orders.
WORKLOAD = """
import time, acceptrun

class Counter:
    def __init__(self): self.n = 0
    def state_dict(self): return {"n": self.n}
    def load_state_dict(self, state): self.n = state["n"]

counter = Counter()
run = acceptrun.init()
start = run.restore(counter=counter)
for step in run.steps(start, 100000):
    counter.n += 1
    time.sleep(0.02)
    run.log(step, loss=1.0 / (1 + step))
    run.maybe_checkpoint(step)
"""

# A price list of the workspace: 3600 USD/h billed per second, so 1 USD a second.
PRICES = """
[[price]]
provider = "testcloud"
instance = "fast"
gpus = 0
price_per_hour = 3600.0
billing = "per_second"
minimum_s = 1
start_rule = "launch"
storage_per_gib_month = 0.0
source = "a test price list"
date = "2026-11-30"
"""


def make(
    tmp_path: Path, limits: str, cost: str = 'provider = "testcloud"\ninstance = "fast"'
) -> tuple[Path, Path]:
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(textwrap.dedent(WORKLOAD))
    (job / "spec.toml").write_text(
        f'name = "budget"\ncommand = ["{sys.executable}", "train.py"]\n'
        f"[checkpoint]\nevery_steps = 1000000\n[cost]\n{cost}\n[limits]\n{limits}\n"
    )
    ws = tmp_path / "ws" / ".acceptrun"
    ws.mkdir(parents=True)
    (ws / "prices.toml").write_text(PRICES)
    return job / "spec.toml", ws
