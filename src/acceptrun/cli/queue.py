"""``acceptrun submit | queue | worker | cancel``: the local queue, or Slurm's.

``--backend slurm`` hands the same commands to :mod:`acceptrun.backends.slurm`
(imported only in that branch). Imports stay lazy: ``acceptrun --help`` loads none of
this module's dependencies.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import MAX_DURATION_S, file_arg, finite_float, integer, positive_int
from acceptrun._util.console import get_logger
from acceptrun.cli.record import HERE_ONLY, add_run_argument

__all__ = ["register"]

BACKENDS = ("local", "slurm")
RECENT_ENDED = 10  # ended jobs `acceptrun queue` shows without --all


log = get_logger("acceptrun.queue")  # printed by the CLI as "acceptrun: ..." on stderr


def _workspace(args: argparse.Namespace, *, create: bool = False) -> Any:
    from acceptrun.record.workspace import find_workspace

    return find_workspace(args.workspace, create=create)


def _slurm() -> Any:
    """The Slurm backend (acceptrun.backends.slurm), imported only when asked for."""
    import importlib

    return importlib.import_module("acceptrun.backends.slurm")


def _db(ws: Any) -> Any:
    from acceptrun.queue.submit import queue_db

    return queue_db(ws)


# ---- submit -----------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    from acceptrun.queue.submit import check_submittable, submit_spec

    ws = _workspace(args, create=True)
    if args.backend == "slurm":
        spec = check_submittable(args.spec, ws)
        sjob = _slurm().submit(Path(args.spec), ws, priority=args.priority)
        print(f"slurm job {sjob.job_id} submitted: {spec.name}; script {sjob.script}")
        return 0
    db = _db(ws)
    try:
        job = submit_spec(args.spec, ws, priority=args.priority, db=db)
        ahead = sum(
            1
            for j in db.jobs("queued", kind=job.kind)
            if j.id != job.id and j.priority >= job.priority
        )
    finally:
        db.close()
    unit = "GPU" if job.kind == "gpu" else "CPU slot"
    what = f"{job.slots} {unit}{'s' if job.slots != 1 else ''}"
    print(
        f"job {job.id} queued: {job.name}, {what}, priority {job.priority}, {ahead} queued ahead of it"
    )
    flag = "--gpus 0,1,..." if job.kind == "gpu" else f"--slots {job.slots}"
    log.info(f"a worker runs it: `acceptrun worker {flag}`; follow it with `acceptrun queue`")
    return 0


# ---- queue ------------------------------------------------------------------------------------


def cmd_queue(args: argparse.Namespace) -> int:
    if args.backend == "slurm":
        return _queue_slurm(args)
    from acceptrun.queue.db import ACTIVE, ENDED

    ws = _workspace(args)
    db = _db(ws)
    try:
        jobs = db.jobs()
        workers = db.workers()
    finally:
        db.close()
    now = time.time()
    if args.json:
        out = {
            "jobs": [
                {**j.to_dict(), "waited_s": round(j.waited_s(now), 3), "ran_s": round(j.ran_for(now), 3)}
                for j in jobs
            ],
            "workers": [
                {"id": w.id, "pid": w.pid, "host": w.host, "kind": w.kind,
                 "devices": list(w.devices), "heartbeat_age_s": round(now - w.heartbeat, 3)}
                for w in workers
            ],
        }  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    if not args.all:
        ended = sorted((j for j in jobs if j.state in ENDED), key=lambda j: j.ended_at or 0)
        keep = {j.id for j in ended[-RECENT_ENDED:]}
        jobs = [j for j in jobs if j.state not in ENDED or j.id in keep]
    if not jobs:
        print("the queue is empty; add a job with `acceptrun submit SPEC`")
    else:
        _print_jobs(jobs, now)
    live = sum(1 for j in jobs if j.state in ACTIVE)
    queued = sum(1 for j in jobs if j.state == "queued")
    print(f"{queued} queued, {live} running")
    for w in workers:
        label = "GPUs" if w.kind == "gpu" else "CPU slots"
        devices = ",".join(map(str, w.devices))
        print(f"worker {w.id}: {label} {devices}, heartbeat {now - w.heartbeat:.1f}s ago")
    if not workers:
        print("no worker is running; start one with `acceptrun worker --slots N` or `--gpus 0,1`")
    return 0


def _print_jobs(jobs: list[Any], now: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from acceptrun._util.console import rich_cell, styled
    from acceptrun.spec.model import format_duration

    colors = {"queued": "yellow", "running": "green", "preempting": "magenta",
              "done": "bold green", "failed": "red", "cancelled": "dim"}  # fmt: skip
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, justify in (("ID", "right"), ("NAME", "left"), ("PRI", "right"),
                          ("STATE", "left"), ("DEVICES", "left"), ("RUN", "left"),
                          ("WAITED", "right"), ("RAN", "right"), ("NOTE", "left")):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=name != "NOTE")  # type: ignore[arg-type]
    for j in jobs:
        devices = (
            ",".join(map(str, j.devices)) or f"({j.slots} {'GPU' if j.kind == 'gpu' else 'cpu'})"
        )
        state = j.state + (f" x{j.preemptions}" if j.preemptions else "")
        # Values as Text cells (rich_cell): a name or a note is never read as markup.
        table.add_row(
            str(j.id), rich_cell(j.name), str(j.priority),
            rich_cell(state, colors.get(j.state, "")), devices, rich_cell(j.run_id or "-"),
            format_duration(j.waited_s(now)),
            format_duration(j.ran_for(now)) if j.attempts else "-", rich_cell(j.note or ""),
        )  # fmt: skip
    # Its own colours on a terminal (styled: not escaped); the values escaped above.
    console = Console(file=styled(), width=None if sys.stdout.isatty() else 160, highlight=False)
    console.print(table)


def _queue_slurm(args: argparse.Namespace) -> int:
    slurm = _slurm()
    rows: list[dict[str, Any]] = slurm.jobs(_workspace(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no Slurm jobs of this workspace")
        return 0
    from rich.console import Console
    from rich.table import Table

    from acceptrun._util.console import rich_cell, styled

    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("JOB", "NAME", "PRI", "STATE", "RUN", "SUBMITTED", "REASON"):
        table.add_column(name, no_wrap=name != "REASON")
    for r in rows:
        cells = (r.get("job", ""), r.get("name", ""), r.get("priority", ""), r.get("state", ""),
                 r.get("run_id") or "-", r.get("submitted", ""), r.get("reason", ""))  # fmt: skip
        table.add_row(*(rich_cell(c) for c in cells))  # squeue's text: never markup
    # The bold header on a terminal (styled: not escaped); the cells escaped above.
    Console(file=styled(), width=None if sys.stdout.isatty() else 160, highlight=False).print(table)
    return 0


# ---- worker -----------------------------------------------------------------------------------


def _gpu_list(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(g) for g in text.split(",") if g.strip())
    except ValueError:
        gpus = ()
    if not gpus or min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of distinct GPU indices; e.g. --gpus 0,1,2,3"
        )
    return gpus


MAX_PRIORITY = 10**6  # priorities compare; a wider range orders nothing more
MAX_SLOTS = 1_000_000  # CPU slots a worker owns: far past any machine's cores
_seconds = finite_float(least=0.0, most=MAX_DURATION_S, example="30")  # seconds


def cmd_worker(args: argparse.Namespace) -> int:
    from acceptrun.queue.scheduler import Policy
    from acceptrun.queue.worker import Worker, WorkerConfig

    if args.gpus is not None:
        kind, devices = "gpu", args.gpus
    else:
        kind, devices = "cpu", tuple(range(args.slots))
    config = WorkerConfig(
        kind=kind, devices=devices, poll_s=max(args.poll, 0.05), once=args.once,
        policy=Policy(reserve_after=args.reserve_after, preempt_after=args.preempt_after),
    )  # fmt: skip
    worker = Worker(_workspace(args, create=True), config)
    return worker.run()


# ---- cancel -----------------------------------------------------------------------------------


def cmd_cancel(args: argparse.Namespace) -> int:
    from acceptrun.errors import UserError

    ws = _workspace(args)
    if args.backend == "slurm":
        slurm = _slurm()
        slurm.cancel(ws, args.job)
        print(f"slurm job {args.job} cancelled")
        return 0
    db = _db(ws)
    try:
        job = db.job(int(args.job)) if args.job.isdigit() else db.job_by_run(args.job)
        if job is None:
            raise UserError(
                f"no queued job {args.job!r} in {ws.root} ({HERE_ONLY}: a job is cancelled in "
                "the workspace whose queue holds it; run the command in that project's folder "
                "or pass --workspace); `acceptrun queue --all` lists them (a job id, or the "
                "id of its run)"
            )
        return _cancel_local(ws, db, job)
    finally:
        db.close()


def _cancel_local(ws: Any, db: Any, job: Any) -> int:
    from acceptrun.errors import UserError
    from acceptrun.queue.db import ACTIVE, ENDED
    from acceptrun.queue.worker import STALE_AFTER_S, job_process_alive, send_stop, worker_alive

    now = time.time()
    if job.state == "queued" and db.cancel_queued(job.id, now):
        print(f"job {job.id} ({job.name}) cancelled: removed from the queue")
        return 0
    job = db.job(job.id)  # it may have started in the meantime
    if job.state in ENDED:
        raise UserError(f"job {job.id} ({job.name}) is {job.state}: nothing to cancel")
    assert job.state in ACTIVE
    job = db.request_stop(job.id, "cancel", "cancel requested") or db.job(job.id)
    owner = next((w for w in db.workers() if w.id == job.worker_id), None)
    gone = owner is None or not worker_alive(owner, now, STALE_AFTER_S)
    # Nothing runs it any more (its worker and its process are gone): cancelled now.
    if (
        gone
        and not job_process_alive(job)
        and db.settle(job, "cancelled", note="cancelled; its process was gone", now=now)
    ):
        print(f"job {job.id} ({job.name}) cancelled: its process was already gone")
        return 0
    sent = send_stop(ws, db, job, job.pid)
    how = "stop sent to" if sent else "its worker stops"
    print(
        f"job {job.id} ({job.name}) cancelling: {how} run {job.run_id} (checkpoint, then exit); "
        "`acceptrun queue` shows it cancelled once the run has exited"
    )
    return 0


# ---- registration -----------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``submit``, ``queue``, ``worker`` and ``cancel``."""
    submit = sub.add_parser("submit", help="queue a spec for a worker (or Slurm) to run")
    submit.add_argument(
        "spec", type=file_arg, help="the run spec (TOML); checked now, frozen as it is now"
    )
    submit.add_argument(
        "--priority",
        type=integer(-MAX_PRIORITY, MAX_PRIORITY),
        default=0,
        help="higher runs first (default 0); FIFO within one",
    )
    submit.add_argument("--backend", choices=BACKENDS, default="local", help="default: local")
    submit.set_defaults(func=cmd_submit)

    queue = sub.add_parser("queue", help="the queue: jobs, their state, devices, runs; workers")
    queue.add_argument("--backend", choices=BACKENDS, default="local", help="default: local")
    queue.add_argument("--json", action="store_true")
    queue.add_argument(
        "--all", action="store_true", help=f"every ended job (default: the last {RECENT_ENDED})"
    )
    queue.set_defaults(func=cmd_queue)

    worker = sub.add_parser("worker", help="run queued jobs on a set of GPUs or CPU slots")
    own = worker.add_mutually_exclusive_group(required=True)
    own.add_argument("--gpus", type=_gpu_list, metavar="0,1,2,3", help="GPU indices it owns")
    own.add_argument(
        "--slots",
        type=positive_int(MAX_SLOTS, example="8"),
        metavar="N",
        help="N CPU slots it owns",
    )
    worker.add_argument(
        "--once", action="store_true", help="exit once nothing it can run is queued or running"
    )
    worker.add_argument(
        "--poll", type=finite_float(least=0.01, most=86400.0, example="1"), default=1.0,
        metavar="S",
        help="seconds between looks at the queue (default 1); a job's exit wakes it at once",
    )  # fmt: skip
    worker.add_argument(
        "--reserve-after", type=_seconds, default=60.0, metavar="S",
        help="seconds a blocked job waits before smaller jobs may no longer delay it (default 60)",
    )  # fmt: skip
    worker.add_argument(
        "--preempt-after", type=_seconds, default=None, metavar="S",
        help="seconds a blocked job waits before it stops lower-priority jobs (default: never)",
    )  # fmt: skip
    worker.set_defaults(func=cmd_worker)

    cancel = sub.add_parser("cancel", help="cancel a job: out of the queue, or stopped if running")
    add_run_argument(
        cancel,
        "job",
        help="job id (or its run id; a Slurm job id with --backend slurm), in this "
        "workspace's queue",
        here_only=True,
    )
    cancel.add_argument("--backend", choices=BACKENDS, default="local", help="default: local")
    cancel.set_defaults(func=cmd_cancel)
