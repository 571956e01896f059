"""The local queue: scheduler rules, then real workers running real ``acceptrun run``s.

Workers are child processes (``acceptrun worker --slots N``) on CPU slots; jobs are tiny
specs whose workload writes its environment to a file or takes steps with the client
API and checkpoints through the store (no torch, so each run starts in about 2 s).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acceptrun.queue.db import Job, QueueDB
from acceptrun.queue.scheduler import Active, Pending, Policy, plan
from acceptrun.record.workspace import RunRecord

PYTHON = sys.executable

# Writes its environment to argv[1], then sleeps argv[2] seconds, or until file argv[3]
# exists when given.
ENV_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    keys = ("ACCEPTRUN_SLOTS", "CUDA_VISIBLE_DEVICES", "ACCEPTRUN_QUEUE_JOB", "ACCEPTRUN_RUN_ID")
    with open(sys.argv[1], "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
    deadline = time.time() + float(sys.argv[2])
    while time.time() < deadline and not (len(sys.argv) > 3 and os.path.exists(sys.argv[3])):
        time.sleep(0.05)
    """
)

# argv[1] steps of argv[2] seconds (argv[3] in later attempts) with the client API; a
# checkpoint of {"step"} after each step through the store; resumes after the step in
# ACCEPTRUN_RESUME_FROM.
STEP_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import acceptrun
    from acceptrun.checkpoint.store import CheckpointStore

    total, pause = int(sys.argv[1]), float(sys.argv[2])
    if os.environ["ACCEPTRUN_ATTEMPT"] != "1" and len(sys.argv) > 3:
        pause = float(sys.argv[3])
    run = acceptrun.init()
    store = CheckpointStore(Path(os.environ["ACCEPTRUN_CHECKPOINT_DIR"]))
    resume = os.environ.get("ACCEPTRUN_RESUME_FROM")
    start = json.loads((Path(resume) / "state.json").read_text())["step"] + 1 if resume else 0
    for step in run.steps(start, total):
        time.sleep(pause)
        run.log(step, loss=1.0 / (step + 1))
        writer = store.begin(step)
        writer.write_json("state.json", {"step": step})
        store.commit(writer)
    """
)


# ---- the scheduler (pure) ---------------------------------------------------------------------


def test_plan_orders_by_priority_then_fifo() -> None:
    pending = [
        Pending(1, 0, 1, submitted_at=1.0, queued_at=1.0),
        Pending(2, 5, 1, submitted_at=3.0, queued_at=3.0),
        Pending(3, 5, 1, submitted_at=2.0, queued_at=2.0),
    ]
    out = plan(pending, [], [0, 1], now=10.0)
    assert out.start == [(3, (0,)), (2, (1,))]


def test_plan_backfills_beside_a_blocked_job_until_it_reserves() -> None:
    running = [Active(9, 0, (0, 1, 2), started_at=0.0, expected_s=100.0)]
    big = Pending(1, 0, 4, submitted_at=1.0, queued_at=1.0)
    small = Pending(2, 0, 1, submitted_at=2.0, queued_at=2.0, expected_s=500.0)
    policy = Policy(reserve_after=60.0)
    # The big job has waited 9 s: no reservation yet, the small one takes the free slot.
    assert plan([big, small], running, range(4), now=10.0, policy=policy).start == [(2, (3,))]
    # After 60 s it reserves: the shadow is t=100 (job 9's end); the small job would end
    # at t=570 on a slot the big job needs, so it waits.
    out = plan([big, small], running, range(4), now=70.0, policy=policy)
    assert (out.start, out.reserved, out.shadow) == ([], 1, 100.0)
    # A small job that ends before the shadow still backfills (EASY backfill).
    short = Pending(3, 0, 1, submitted_at=3.0, queued_at=3.0, expected_s=20.0)
    assert plan([big, short], running, range(4), now=70.0, policy=policy).start == [(3, (3,))]
    # Unknown runtimes only take devices the reserved job will not need.
    unknown = Pending(4, 0, 1, submitted_at=3.0, queued_at=3.0)
    assert plan([big, unknown], running, range(4), now=70.0, policy=policy).start == []
    wide = [Active(9, 0, (0, 1), started_at=0.0, expected_s=100.0)]
    need3 = Pending(1, 0, 3, submitted_at=1.0, queued_at=1.0)
    out = plan([need3, unknown], wide, range(4), now=70.0, policy=policy)
    assert out.start == [(4, (2,))] and out.shadow == 100.0  # 4 free at t=100, 3 needed


def test_plan_unknown_runtime_of_running_jobs_makes_the_shadow_infinite() -> None:
    running = [Active(9, 0, (0, 1), started_at=0.0)]
    big = Pending(1, 0, 4, submitted_at=1.0, queued_at=1.0)
    short = Pending(2, 0, 1, submitted_at=2.0, queued_at=2.0, expected_s=1.0)
    out = plan([big, short], running, range(4), now=100.0, policy=Policy(reserve_after=0))
    assert out.shadow == math.inf and out.start == [(2, (2,))]


def test_plan_preempts_lower_priority_only_when_it_makes_room() -> None:
    running = [
        Active(7, 1, (0, 1), started_at=0.0),
        Active(8, 0, (2,), started_at=5.0),
        Active(9, 9, (3,), started_at=1.0),
    ]
    urgent = Pending(1, 5, 2, submitted_at=1.0, queued_at=1.0)
    policy = Policy(reserve_after=600.0, preempt_after=30.0)
    assert plan([urgent], running, range(4), now=20.0, policy=policy).preempt == []
    out = plan([urgent], running, range(4), now=40.0, policy=policy)
    # Lowest priority first (job 8, one slot), then job 7; job 9 outranks it.
    assert out.preempt == [(8, 1), (7, 1)] and out.reserved == 1 and out.start == []
    # While they stop, nothing backfills into what they free.
    filler = Pending(2, 0, 1, submitted_at=2.0, queued_at=2.0, expected_s=1.0)
    stopping = [
        Active(a.id, a.priority, a.devices, a.started_at, stopping=a.id in (7, 8)) for a in running
    ]
    out = plan([urgent, filler], stopping, range(4), now=41.0, policy=policy)
    assert out.preempt == [] and out.start == []
    # A job as important as everything running preempts nothing.
    assert plan([Pending(3, 0, 4, 1.0, 1.0)], running, range(4), 99.0, policy).preempt == []


def test_plan_skips_jobs_larger_than_the_worker() -> None:
    out = plan([Pending(1, 9, 8, 0.0, 0.0), Pending(2, 0, 2, 1.0, 1.0)], [], range(4), now=1.0)
    assert out.start == [(2, (0, 1))] and out.reserved is None


# ---- real workers -----------------------------------------------------------------------------


class Queue:
    """A project directory with a workspace, specs, and the acceptrun command."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ws = root / ".acceptrun"
        (root / "env_job.py").write_text(ENV_JOB)
        (root / "step_job.py").write_text(STEP_JOB)
        self.workers: list[subprocess.Popen[bytes]] = []

    def spec(
        self, name: str, args: list[str], *, script: str = "env_job.py", extra: str = ""
    ) -> Path:
        path = self.root / f"{name}.toml"
        command = json.dumps([PYTHON, script, *args])
        path.write_text(f'name = "{name}"\ncommand = {command}\n{textwrap.dedent(extra)}')
        return path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "acceptrun", "--workspace", str(self.ws), *args],
            cwd=self.root, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def submit(self, spec: Path, priority: int = 0) -> int:
        proc = self.cli("submit", str(spec), "--priority", str(priority))
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.split()[1])

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"worker-{len(self.workers)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [PYTHON, "-m", "acceptrun", "--workspace", str(self.ws), "worker", "--poll", "0.2", *args],
            cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self.workers.append(proc)
        return proc

    def worker_log(self, n: int) -> str:
        return (self.root / f"worker-{n}.log").read_text()

    def jobs(self) -> dict[int, Job]:
        db = QueueDB(self.ws / "queue" / "queue.sqlite")
        try:
            return {j.id: j for j in db.jobs()}
        finally:
            db.close()

    def wait(self, predicate: Any, timeout: float = 60.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                logs = "\n".join(self.worker_log(i) for i in range(len(self.workers)))
                pytest.fail(
                    f"timed out after {timeout} s waiting for {what}\n{self.jobs()}\n{logs}"
                )
            time.sleep(0.1)

    def record(self, job: Job) -> RunRecord:
        assert job.run_id is not None
        return RunRecord(self.ws / "runs" / job.run_id)


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    q = Queue(tmp_path)
    yield q
    for proc in q.workers:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Jobs run in their own sessions: end any still running (by their recorded pids).
    if (q.ws / "queue" / "queue.sqlite").exists():
        for job in q.jobs().values():
            if job.pid is not None:
                _kill_group(job.pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
