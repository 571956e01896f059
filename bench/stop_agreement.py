"""The cost of ``run.should_stop(step)`` per call: one process, and N gloo ranks.

    .venv/bin/python bench/stop_agreement.py [--calls 2000] [--ranks 2]

One process: the call reads the flag the SIGTERM handler set. N ranks (started here
through torchrun): it is one all_reduce of three numbers on acceptrun's own gloo group,
timed next to a bare all_reduce of one number on a gloo group (what the stop agreement
cost before the step number rode along). Each rank builds a Run over a scratch record (no
supervisor), calls each ``--calls`` times after 100 warm-up calls; rank 0 prints the
median and mean microseconds per call, and the load average: on a shared machine other
work moves these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def timed(fn: Callable[[int], object], calls: int) -> list[float]:
    for i in range(100):  # warm-up: the group's first collectives connect
        fn(i)
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def line(name: str, us: list[float]) -> str:
    return (
        f"{name:<44} median {statistics.median(us):8.1f} us   mean {statistics.fmean(us):8.1f} us"
    )


def rank_main(calls: int, record_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from acceptrun.record.workspace import RunRecord
    from acceptrun.workload.run import Run

    dist.init_process_group("gloo")
    run = Run(RunRecord(record_dir), attempt=1, supervised=False)
    should = timed(run.should_stop, calls)
    bare_group = dist.new_group(backend="gloo")

    def bare(_: int) -> None:
        dist.all_reduce(torch.tensor([0], dtype=torch.int32), group=bare_group)

    plain = timed(bare, calls)
    if dist.get_rank() == 0:
        n = dist.get_world_size()
        print(line(f"run.should_stop(step), {n} ranks (gloo)", should))
        print(line(f"bare all_reduce of one number, {n} ranks", plain))
    run.finished = True
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)  # set for the ranks
    args = p.parse_args()
    if args.rank_of:
        rank_main(args.calls, args.rank_of)
        return
    from acceptrun.record.workspace import RunRecord
    from acceptrun.workload.run import Run

    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "run.json").write_text(json.dumps({"status": "running"}))
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
        one = Run(RunRecord(tmp), attempt=1, supervised=False)
        print(line("run.should_stop(step), 1 process (a flag)", timed(one.should_stop, args.calls)))
        one.finished = True
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
             "--nproc-per-node", str(args.ranks), __file__, "--calls", str(args.calls),
             "--rank-of", tmp],
            env=env, check=True,
        )  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
