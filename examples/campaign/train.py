"""The campaign's tiny workload: a linear model fitted by SGD in NumPy, deterministic.

Seeded, one process, no torch: a run of 40 steps takes about a second, so a campaign of a
dozen fault kinds (one run each) takes a minute or two on two cores.
"""

import os
import time

import numpy as np

import acceptrun

run = acceptrun.init()
data = np.random.default_rng(0)
xs = data.normal(size=(256, 8))
ys = xs @ data.normal(size=8) + 0.1 * data.normal(size=256)
weights = np.zeros(8)
batches = np.random.default_rng(1)  # its state goes into every checkpoint
start = run.restore(weights=weights, batches=batches.bit_generator.state)
if start:
    batches.bit_generator.state = run.restored["batches"]
for step in run.steps(start, 40):
    with run.data_wait():
        idx = batches.integers(0, len(xs), size=32)
    error = xs[idx] @ weights - ys[idx]
    weights -= 0.05 * (xs[idx].T @ error) / len(idx)
    run.update_state(batches=batches.bit_generator.state)
    time.sleep(0.02)  # a step of a real model takes longer than saving this one
    run.log(step, loss=float(np.mean(error**2)))
    run.maybe_checkpoint(step)
os.makedirs("out", exist_ok=True)
np.save("out/weights.npy", weights)
run.output("weights", "out/weights.npy")
run.metric("final/loss", float(np.mean((xs @ weights - ys) ** 2)))
