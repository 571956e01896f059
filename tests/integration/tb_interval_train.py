"""A black box that writes TensorBoard scalars and saves its own checkpoint every 500 iterations (tests only).

Its counter counts iterations done (``i + 1``), and a resume starts it again from 0: the
first scalar after resuming from the save of iteration 500 is step 500 again, so the steps
alone cannot tell the restart from a counter that went on. It writes the loss as
``Loss/train`` with tensorboard's own event writer (no torch), flushed at each scalar,
and saves ``out/ckpt.json`` in place right after the scalar of the same iteration.

Attempt 1 saves once (iteration 500), logs on to 1500 and a little beyond, then waits for
the injected ``kill@step=1500``: the kill comes mid-interval, after a checkpoint exists,
however slow the machine. Attempt 2 runs ``--iters`` iterations from 0 and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from corpus_replay import _read, _wait  # beside this script: its sys.path[0]
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

p = argparse.ArgumentParser()
p.add_argument("--resume", action="store_true")
p.add_argument("--iters", type=int, default=2000)
p.add_argument("--every", type=int, default=500)
p.add_argument("--pace", type=float, default=0.004)  # seconds per iteration
p.add_argument("--hold", type=float, default=600.0)
args = p.parse_args()

attempt = int(os.environ.get("ACCEPTRUN_ATTEMPT", "1"))
resumed = None
if args.resume:
    with open("out/ckpt.json") as f:
        resumed = json.load(f)
    print(f"resumed from {resumed}; counting from 0 again", flush=True)
os.makedirs("out", exist_ok=True)
writer = EventFileWriter("tb")


def scalar(step: int, loss: float) -> None:
    value = summary_pb2.Summary.Value(tag="Loss/train", simple_value=loss)
    event = event_pb2.Event(wall_time=time.time(), step=step)
    event.summary.CopyFrom(summary_pb2.Summary(value=[value]))
    writer.add_event(event)
    writer.flush()


stop = 1500 + 100 if attempt == 1 else args.iters
saved = False
for i in range(stop):
    time.sleep(args.pace)
    done = i + 1
    if done % args.every == 0:
        scalar(done, 1.0 / done)
        if not (attempt == 1 and saved):
            if attempt == 1:
                # The save comes once acceptrun has read its scalar: a capture dated
                # before that is an estimate until a later scalar proves its step.
                _wait(f"step {done} to be read", lambda d=done: _read(d, attempt))
            tmp = "out/.ckpt.json.tmp"
            with open(tmp, "w") as f:
                json.dump({"iters": done, "attempt": attempt}, f)
            os.replace(tmp, "out/ckpt.json")
            saved = True
writer.close()
if attempt == 1:
    time.sleep(args.hold)
    sys.exit(f"attempt 1 was not killed within --hold {args.hold:g} s")
