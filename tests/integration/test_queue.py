"""The local queue: scheduler rules, then real workers running real ``acceptrun run``s.

Workers are child processes (``acceptrun worker --slots N``) on CPU slots; jobs are tiny
specs whose workload writes its environment to a file or takes steps with the client
API and checkpoints through the store (no torch, so each run starts in about 2 s).
"""

from __future__ import annotations

import contextlib
import json
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

from acceptrun._util.durable import read_jsonl
from acceptrun.queue.db import Job, QueueDB
from acceptrun.record.workspace import RunRecord

PYTHON = sys.executable

# Writes its environment to argv[1], then sleeps argv[2] seconds, or until file argv[3]
# exists when given.
ENV_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    keys = ("ACCEPTRUN_SLOTS", "CUDA_VISIBLE_DEVICES", "ACCEPTRUN_QUEUE_JOB", "ACCEPTRUN_RUN_ID",
            "PYTHONUNBUFFERED")
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

    def wait(self, predicate: Any, timeout: float = 300.0, what: str = "") -> Any:
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


def _workload_pid(record: RunRecord) -> int | None:
    starts = [e for e in read_jsonl(record.events_path) if e.get("kind") == "attempt_start"]
    return int(starts[-1]["pid"]) if starts else None


def test_submit_refuses_a_bad_spec_and_queues_nothing(queue: Queue) -> None:
    good = queue.submit(queue.spec("good", ["out.json", "0"]), priority=3)
    bad = queue.root / "bad.toml"
    bad.write_text('name = "bad"\ncommand = []\n[resources]\ngpus = -1\n')
    proc = queue.cli("submit", str(bad))
    assert proc.returncode == 2
    assert "SpecError" in proc.stderr and "resources.gpus" in proc.stderr
    missing = queue.spec("missing", [], extra="")
    missing.write_text('name = "missing"\ncommand = ["no-such-program-here"]\n')
    proc = queue.cli("submit", str(missing))
    assert proc.returncode == 2 and "no-such-program-here" in proc.stderr
    listing = queue.cli("queue", "--json")
    assert listing.returncode == 0, listing.stderr
    jobs = json.loads(listing.stdout)["jobs"]
    assert [(j["id"], j["name"], j["state"], j["priority"]) for j in jobs] == [
        (good, "good", "queued", 3)
    ]


def test_gpu_worker_gives_each_job_its_gpus(queue: Queue) -> None:
    """A GPU worker (in process, running the commands directly as the benchmark does)."""
    from acceptrun.queue.submit import submit_spec
    from acceptrun.queue.worker import Worker, WorkerConfig
    from acceptrun.record.workspace import Workspace

    ws = Workspace.create(queue.ws)
    one = submit_spec(
        queue.spec("one", [str(queue.root / "one.json"), "0.3"], extra="[resources]\ngpus = 1\n"),
        ws,
    )
    two = submit_spec(
        queue.spec("two", [str(queue.root / "two.json"), "0"], extra="[resources]\ngpus = 2\n"), ws
    )
    cpu = submit_spec(queue.spec("cpu", [str(queue.root / "cpu.json"), "0"]), ws)
    config = WorkerConfig(kind="gpu", devices=(5, 7, 9), poll_s=0.1, once=True, direct=True)
    assert Worker(ws, config).run() == 0
    jobs = queue.jobs()
    assert (jobs[one.id].state, jobs[two.id].state, jobs[cpu.id].state) == (
        "done",
        "done",
        "queued",
    )
    assert json.loads((queue.root / "one.json").read_text())["CUDA_VISIBLE_DEVICES"] == "5"
    assert json.loads((queue.root / "two.json").read_text())["CUDA_VISIBLE_DEVICES"] == "7,9"
    # A direct job's output reaches its log live, as under a supervisor (python_unbuffered).
    assert json.loads((queue.root / "one.json").read_text())["PYTHONUNBUFFERED"]
    assert jobs[one.id].kind == "gpu" and jobs[two.id].slots == 2 and jobs[cpu.id].kind == "cpu"


@pytest.mark.slow
def test_priority_order_devices_and_backfill(queue: Queue) -> None:
    low = queue.submit(queue.spec("low", [str(queue.root / "low.json"), "0.2"]), priority=0)
    # The big job runs until the low one has started (its environment file exists): the
    # low job can only start in the small one's slot, so the order below holds however
    # long each run takes to start and end on this machine.
    gate = str(queue.root / "low.json")
    big = queue.submit(
        queue.spec(
            "big", [str(queue.root / "big.json"), "120", gate], extra="[resources]\ncpus = 3\n"
        ),
        priority=5,
    )
    huge = queue.submit(
        queue.spec("huge", [str(queue.root / "huge.json"), "0"], extra="[resources]\ncpus = 4\n"),
        priority=5,
    )
    small = queue.submit(queue.spec("small", [str(queue.root / "small.json"), "0.2"]), priority=1)
    worker = queue.worker("--slots", "4", "--once")
    assert worker.wait(timeout=120) == 0, queue.worker_log(0)
    jobs = queue.jobs()
    assert {j.state for j in jobs.values()} == {"done"}, jobs
    # Highest priority first; the small job backfills beside the big one while the job
    # that needs all 4 slots waits; the low-priority job goes after the small one.
    assert jobs[big].devices == (0, 1, 2) and jobs[small].devices == (3,)
    assert jobs[small].started_at < jobs[big].ended_at  # type: ignore[operator]
    assert jobs[big].started_at <= jobs[small].started_at < jobs[low].started_at  # type: ignore[operator]
    assert jobs[huge].started_at >= max(jobs[big].ended_at, jobs[low].ended_at)  # type: ignore[operator, type-var]
    assert jobs[huge].devices == (0, 1, 2, 3)
    # Each job saw exactly its slots, no GPU, and its own job and run ids.
    for name, job_id in (("big", big), ("small", small), ("huge", huge), ("low", low)):
        env = json.loads((queue.root / f"{name}.json").read_text())
        assert env["ACCEPTRUN_SLOTS"] == ",".join(map(str, jobs[job_id].devices))
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["ACCEPTRUN_QUEUE_JOB"] == str(job_id)
        assert env["ACCEPTRUN_RUN_ID"] == jobs[job_id].run_id
        assert queue.record(jobs[job_id]).state["verdict"] == "accepted"
    table = queue.cli("queue")
    assert table.returncode == 0 and "huge" in table.stdout and "done" in table.stdout


@pytest.mark.slow
def test_preemption_stops_gracefully_and_resumes_the_same_run(queue: Queue) -> None:
    # The low job steps once a second before its preemption: 30 s of work, so even a
    # loaded machine preempts it long before it could finish on its own.
    low = queue.submit(queue.spec("low", ["30", "1.0", "0"], script="step_job.py"), priority=0)
    worker = queue.worker("--slots", "1", "--preempt-after", "0")
    first = queue.wait(lambda: queue.jobs()[low].run_id and queue.jobs()[low], what="low started")
    ckpts = queue.ws / "runs" / str(first.run_id) / "checkpoints"
    queue.wait(lambda: (ckpts / "step-3").is_dir(), what="a checkpoint of the low job")
    high = queue.submit(queue.spec("high", [str(queue.root / "high.json"), "0"]), priority=9)
    queue.wait(lambda: queue.jobs()[low].state == "done", timeout=120, what="low done")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == 0
    jobs = queue.jobs()
    assert jobs[high].state == "done"
    assert jobs[low].preemptions == 1 and jobs[low].attempts == 2
    assert jobs[low].run_id == first.run_id  # the same run, resumed
    # The high job ran between the preemption and the resume.
    record = queue.record(jobs[low])
    events = list(read_jsonl(record.events_path))
    stop = next(e for e in events if e["kind"] == "audit" and e.get("action") == "stop")
    assert stop["reason"] == f"queue job {low} preempted"
    resume = next(e for e in events if e["kind"] == "audit" and e.get("action") == "resume")
    assert resume["from_step"] >= 3
    assert jobs[high].started_at > stop["t"] and jobs[high].ended_at < resume["t"]  # type: ignore[operator]
    state = record.state
    assert state["attempts"] == 2 and state["verdict"] == "accepted"
    first_exit = record.read_json("attempts/1/exit.json")
    second_exit = record.read_json("attempts/2/exit.json")
    assert first_exit["outcome"] == "stopped"
    assert second_exit["work"]["resumed_from"] == resume["from_step"]
    assert second_exit["work"]["first_step"] == resume["from_step"] + 1
    assert "preempted" in queue.worker_log(0)


@pytest.mark.slow
def test_restarted_worker_adopts_a_live_job_and_requeues_a_dead_one(queue: Queue) -> None:
    release = queue.root / "release"
    alive = queue.submit(queue.spec("alive", [str(queue.root / "alive.json"), "120", str(release)]))
    dead = queue.submit(queue.spec("dead", ["60", "0.2", "0"], script="step_job.py"))
    first = queue.worker("--slots", "2")

    def both_running() -> bool:
        jobs = queue.jobs()
        return all(
            jobs[j].pid is not None and (queue.ws / "runs" / str(jobs[j].run_id) / "events.jsonl").exists()
            and _workload_pid(queue.record(jobs[j])) is not None
            for j in (alive, dead)
        )  # fmt: skip

    queue.wait(both_running, what="both jobs running")
    queue.wait(
        lambda: (
            queue.ws / "runs" / str(queue.jobs()[dead].run_id) / "checkpoints" / "step-2"
        ).is_dir(),
        what="a checkpoint of the job that dies",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    # The worker is gone; so is the supervisor of one job (and its workload).
    before = queue.jobs()
    record = queue.record(before[dead])
    workload = _workload_pid(record)
    _kill_group(before[dead].pid)  # type: ignore[arg-type]
    assert workload is not None
    _kill_group(workload)
    second = queue.worker("--slots", "2", "--once")
    queue.wait(lambda: "adopted" in (queue.jobs()[alive].note or ""), what="the live job adopted")
    release.touch()
    assert second.wait(timeout=120) == 0, queue.worker_log(1)
    jobs = queue.jobs()
    log = queue.worker_log(1)
    assert "adopted" in log and jobs[alive].state == "done", (log, jobs[alive])
    assert jobs[alive].attempts == 1 and queue.record(jobs[alive]).state["attempts"] == 1
    assert (
        jobs[dead].state == "done"
        and jobs[dead].attempts == 2
        and jobs[dead].run_id == before[dead].run_id
    )
    state = record.state
    assert state["attempts"] == 2 and state["verdict"] == "accepted"
    resume = [e for e in read_jsonl(record.events_path) if e.get("action") == "resume"]
    assert len(resume) == 1 and resume[0]["from_step"] >= 2


@pytest.mark.slow
def test_cancel_a_queued_and_a_running_job(queue: Queue) -> None:
    running = queue.submit(queue.spec("long", [str(queue.root / "long.json"), "60"]))
    waiting = queue.submit(queue.spec("next", [str(queue.root / "next.json"), "0"]))
    worker = queue.worker("--slots", "1")
    job = queue.wait(
        lambda: (
            (j := queue.jobs()[running]).run_id
            and (queue.ws / "runs" / str(j.run_id) / "events.jsonl").exists()
            and _workload_pid(queue.record(j))
            and j
        ),
        what="the long job running",
    )
    out = queue.cli("cancel", str(waiting))
    assert out.returncode == 0 and "removed from the queue" in out.stdout, out
    assert queue.jobs()[waiting].state == "cancelled"
    out = queue.cli("cancel", str(running))
    assert out.returncode == 0 and "cancelling" in out.stdout, out
    queue.wait(lambda: queue.jobs()[running].state == "cancelled", what="the long job cancelled")
    record = queue.record(job)
    stops = [e for e in read_jsonl(record.events_path) if e.get("action") == "stop"]
    assert len(stops) == 1 and stops[0]["reason"] == f"queue job {running} cancelled"
    assert record.read_json("attempts/1/exit.json")["outcome"] == "stopped"
    assert not (queue.root / "next.json").exists()  # the cancelled queued job never ran
    again = queue.cli("cancel", str(running))
    assert again.returncode == 2 and "nothing to cancel" in again.stderr
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == 0
    listing = json.loads(queue.cli("queue", "--json").stdout)
    assert listing["workers"] == []  # it left the table on its way out
