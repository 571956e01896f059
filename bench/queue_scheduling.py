"""How well the local queue packs a pool: 200 jobs on 8 slots, against Slurm.

A synthetic trace (fixed seed) of jobs wanting 1, 2, 4 or 8 slots and sleeping 0.5-3 s
runs three ways:

1. the scheduler alone (:func:`acceptrun.queue.scheduler.plan`) in a discrete-event
   simulation with exact durations: its packing, free of process overhead;
2. a real worker (:class:`acceptrun.queue.worker.Worker`, 8 CPU slots) over a real
   ``queue.sqlite``, each job a ``sleep`` spec submitted like ``acceptrun submit`` does.
   The worker runs the spec's command directly (``WorkerConfig.direct``): a supervised
   ``acceptrun run`` costs about 2 s of CPU per job (provenance, preflight, verdict),
   which on a small machine would measure the CPU, not the scheduler;
3. the same trace through a real single-node Slurm with 8 CPUs
   (``tools/slurm_local.py``): ``sbatch --cpus-per-task=<slots> --wrap "sleep <d>"``, all
   submitted held and released at once so both queues start full.

Each job's ``limits.expected_runtime`` max is its exact sleep (the scheduler's EASY
backfill reads it). Slurm runs the trace twice, with its FIFO scheduler (builtin) and its
default backfill scheduler; Slurm's time limits are whole minutes, so its backfill sees
every job of this trace as one minute long. Prints the makespan, its
ratio to the lower bound ``max(slot-seconds / 8, longest job)``, and the idle slot
fraction ``1 - busy slot-seconds / (8 x makespan)``, busy counted from each job's
measured start and end.

    python bench/queue_scheduling.py [--jobs 200] [--seed 0] [--reserve-after 0] [--no-slurm]
                          [--slurm-scheduler builtin,backfill]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's queue module: keep its directory off
# sys.path, or `import queue` anywhere (concurrent.futures, urllib3) would load it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime  # noqa: E402

from acceptrun.queue.scheduler import Active, Pending, Policy, plan  # noqa: E402
from acceptrun.queue.submit import queue_db, submit_spec  # noqa: E402
from acceptrun.queue.worker import Worker, WorkerConfig  # noqa: E402
from acceptrun.record.workspace import Workspace  # noqa: E402

SLOTS = 8
SIZES = {1: 0.4, 2: 0.3, 4: 0.2, 8: 0.1}  # slots wanted: share of the jobs
MIN_S, MAX_S = 0.5, 3.0  # seconds of sleep, uniform, in tenths


@dataclass(frozen=True, slots=True)
class TraceJob:
    index: int
    slots: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Result:
    label: str
    makespan: float  # seconds from the first start to the last end
    busy: float  # slot-seconds the jobs held their slots


def make_trace(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    sizes = rng.choices(list(SIZES), weights=list(SIZES.values()), k=n)
    return [TraceJob(i, s, round(rng.uniform(MIN_S, MAX_S), 1)) for i, s in enumerate(sizes)]


def lower_bound(trace: list[TraceJob]) -> float:
    return max(sum(j.slots * j.seconds for j in trace) / SLOTS, max(j.seconds for j in trace))


# ---- 1. the scheduler alone ---------------------------------------------------------------------


def simulate(trace: list[TraceJob], policy: Policy, label: str) -> Result:
    """Event-driven: at each job end (and each reservation deadline) ask plan() again."""
    pending = [Pending(j.index, 0, j.slots, float(j.index), 0.0, j.seconds) for j in trace]
    by_id = {j.index: j for j in trace}
    running: list[Active] = []
    t, busy = 0.0, 0.0
    while pending or running:
        decided = plan(pending, running, range(SLOTS), t, policy)
        started = {job_id for job_id, _ in decided.start}
        for job_id, devices in decided.start:
            running.append(Active(job_id, 0, devices, t, by_id[job_id].seconds))
            busy += by_id[job_id].slots * by_id[job_id].seconds
        pending = [p for p in pending if p.id not in started]
        wakes = [a.started_at + by_id[a.id].seconds for a in running]
        wakes += [
            p.queued_at + policy.reserve_after
            for p in pending
            if p.queued_at + policy.reserve_after > t
        ]
        t = min(wakes)
        running = [a for a in running if a.started_at + by_id[a.id].seconds > t + 1e-9]
    return Result(label, t, busy)


# ---- 2. a real worker ---------------------------------------------------------------------------


def run_worker(trace: list[TraceJob], policy: Policy, root: Path) -> Result:
    ws = Workspace.create(root / ".acceptrun")
    specs = root / "specs"
    specs.mkdir()
    db = queue_db(ws)
    try:
        for j in trace:
            spec = specs / f"j{j.index:03d}.toml"
            spec.write_text(
                f'name = "j{j.index:03d}"\ncommand = ["sleep", "{j.seconds}"]\n'
                f"[resources]\ncpus = {j.slots}\n[limits]\nexpected_runtime = [0, {j.seconds}]\n"
            )
            submit_spec(spec, ws, db=db)
    finally:
        db.close()
    config = WorkerConfig(
        kind="cpu", devices=tuple(range(SLOTS)), poll_s=0.5, policy=policy, once=True, direct=True
    )
    Worker(ws, config).run()
    db = queue_db(ws)
    try:
        jobs = db.jobs()
    finally:
        db.close()
    bad = [j for j in jobs if j.state != "done"]
    if bad:
        raise SystemExit(f"{len(bad)} jobs did not finish: {bad[0]}")
    start = min(j.started_at or 0.0 for j in jobs)
    end = max(j.ended_at or 0.0 for j in jobs)
    busy = sum(j.slots * j.ran_s for j in jobs)
    after = f"{policy.reserve_after:g}"
    return Result(f"local worker, reserve after {after} s", end - start, busy)


# ---- 3. Slurm -----------------------------------------------------------------------------------


def run_slurm(trace: list[TraceJob], root: Path, scheduler: str = "builtin") -> Result:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from slurm_local import LocalSlurm  # type: ignore[import-not-found, unused-ignore]

    out = root / "out"
    out.mkdir(parents=True)
    # Slurm's time limits are whole minutes: under backfill every job of this trace asks
    # for one, so backfill cannot tell a 0.5 s job from a 3 s one.
    limit = ["--time=1"] if scheduler == "backfill" else []
    with LocalSlurm(root / "slurm", cpus=SLOTS, scheduler=scheduler) as slurm:
        ids = []
        for j in trace:
            proc = subprocess.run(
                ["sbatch", "--parsable", "--hold", f"--cpus-per-task={j.slots}", *limit,
                 f"--job-name=j{j.index:03d}", f"--output={out}/%j.out", "--wrap", f"sleep {j.seconds}"],
                env=slurm.env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            ids.append(proc.stdout.strip().split(";")[0])
        subprocess.run(
            ["scontrol", "release", ",".join(ids)], env=slurm.env, check=True, capture_output=True
        )
        comp = slurm.log_dir / "jobcomp.txt"
        deadline = time.monotonic() + 60 * 30
        lines: list[str] = []
        while time.monotonic() < deadline:
            lines = comp.read_text().splitlines() if comp.exists() else []
            if len(lines) >= len(trace):
                break
            time.sleep(1.0)
        else:
            raise SystemExit(f"Slurm finished {len(lines)} of {len(trace)} jobs in 30 minutes")
    starts, ends, busy = [], [], 0.0
    for line in lines:
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if fields.get("JobState") != "COMPLETED":
            raise SystemExit(f"a Slurm job did not complete: {line}")
        s = datetime.fromisoformat(fields["StartTime"]).timestamp()
        e = datetime.fromisoformat(fields["EndTime"]).timestamp()
        starts.append(s)
        ends.append(e)
        busy += int(fields.get("ProcCnt", fields.get("NCPUS", "1"))) * (e - s)
    label = f"slurm {scheduler}, 8 CPUs (times in whole s)"
    return Result(label, max(ends) - min(starts), busy)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--reserve-after",
        type=float,
        default=Policy().reserve_after,
        help="seconds before a blocked job reserves, for the real worker "
        "(acceptrun worker --reserve-after; default %(default)s, as the worker's)",
    )
    p.add_argument("--no-slurm", action="store_true", help="skip the Slurm comparison")
    p.add_argument(
        "--slurm-scheduler",
        default="builtin,backfill",
        help="Slurm schedulers to compare, comma-separated (default %(default)s)",
    )
    args = p.parse_args()
    trace = make_trace(args.jobs, args.seed)
    bound = lower_bound(trace)
    counts = {s: sum(1 for j in trace if j.slots == s) for s in SIZES}
    slot_s = sum(j.slots * j.seconds for j in trace)
    print(
        f"{len(trace)} jobs ({', '.join(f'{n}x{s}' for s, n in counts.items())} slots), "
        f"sleeps {MIN_S}-{MAX_S} s, seed {args.seed}, {SLOTS} slots"
    )
    print(
        f"lower bound {bound:.1f} s = max({slot_s:.1f} slot-s / {SLOTS}, longest job "
        f"{max(j.seconds for j in trace):.1f} s); reserve after {args.reserve_after:g} s"
    )
    policy = Policy(reserve_after=args.reserve_after)
    results = [
        simulate(trace, Policy(reserve_after=after), f"simulated, reserve after {after:g} s")
        for after in sorted({0.0, 10.0, args.reserve_after})
    ]
    results.append(simulate(trace, Policy(reserve_after=math.inf), "simulated, never reserve"))
    with tempfile.TemporaryDirectory(prefix="acceptrun-bench-queue-") as tmp:
        results.append(run_worker(trace, policy, Path(tmp) / "local"))
        if not args.no_slurm:
            for scheduler in args.slurm_scheduler.split(","):
                results.append(run_slurm(trace, Path(tmp) / f"slurm-{scheduler}", scheduler))
    print()
    print(f"{'':40} {'makespan':>9} {'/ bound':>8} {'idle slots':>11}")
    for r in results:
        idle = 1.0 - r.busy / (SLOTS * r.makespan)
        print(f"{r.label:40} {r.makespan:8.1f}s {r.makespan / bound:8.3f} {idle:10.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
