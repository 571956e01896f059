"""``acceptrun worker``: owns a set of devices and runs queued jobs on them.

Each job runs as a child ``acceptrun run --run-id RID SPEC`` (the path a user takes by
hand) in its own session, with ``CUDA_VISIBLE_DEVICES`` set to its GPUs (empty for CPU
jobs) and ``ACCEPTRUN_SLOTS`` to its device numbers. The worker picks the run id before
the start and stores it with the job, so a job always knows its run, even when the
worker dies a moment later. Its output goes to ``queue/logs/job-<id>.log``.

Every ``poll`` seconds (and at once when a child exits) the worker:

1. beats its heartbeat in ``workers``;
2. recovers orphans: jobs marked running by a worker that is gone (its pid dead, or no
   heartbeat for ``stale_after`` seconds). When the job's process (its run's
   supervisor) is still alive and its devices are free here, the worker *adopts* it
   and watches its pid; otherwise the job goes back to the queue with its run id;
3. settles the jobs whose process ended: done (the run was ACCEPTED), failed, cancelled,
   or queued again after a preemption, or after its supervisor died mid-run;
4. delivers pending stops (preemptions, cancels) through ``acceptrun stop``'s code
   (:func:`acceptrun.run.lifecycle.request_stop`): the workload checkpoints and exits;
5. asks the scheduler (:mod:`acceptrun.queue.scheduler`) what to start and preempt.

A job that starts again with a run id whose record exists continues that run with
``acceptrun resume RID --from-scratch`` (from its newest verified checkpoint; from step 0
only when it has none), so a preempted or orphaned job never starts a second run.

SIGTERM or Ctrl-C ends the worker, not its jobs: they run on in their own sessions and
the next worker adopts them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from acceptrun._util import logpump
from acceptrun._util.console import get_logger
from acceptrun._util.durable import read_json, write_atomic
from acceptrun.errors import RecordError, UserError
from acceptrun.queue.db import ACTIVE, Job, QueueDB, WorkerRow, format_devices
from acceptrun.queue.scheduler import Active, Pending, Policy, plan
from acceptrun.queue.submit import queue_db, queue_dir
from acceptrun.record.liveness import last_sign_of_life
from acceptrun.record.status import RUN_OWNED, RUN_SUPERVISED
from acceptrun.record.workspace import RunRecord, Workspace, new_run_id, now_iso

__all__ = [
    "ENV_QUEUE_JOB",
    "ENV_SLOTS",
    "Worker",
    "WorkerConfig",
    "job_process_alive",
    "send_stop",
    "worker_alive",
]

_log = get_logger(__name__)  # what a worker tells: jobs started, ended, adopted

ENV_SLOTS = "ACCEPTRUN_SLOTS"  # the job's device numbers: "0,1" (GPU indices or CPU slots)
ENV_QUEUE_JOB = "ACCEPTRUN_QUEUE_JOB"  # the job's id in the queue
PID_START_SLACK_S = 60.0  # a job's process starts within this many seconds of its claim
STALE_AFTER_S = 30.0  # seconds without a heartbeat before a worker on another host is dead
LOST_SUPERVISOR_RETRIES = 3  # requeues of a job whose supervisor keeps dying, then failed
RUN_STATUSES_ACTIVE = RUN_OWNED  # a supervisor owns the record


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What a worker owns and how it schedules."""

    kind: str  # "gpu" (devices are GPU indices) or "cpu" (devices are slot numbers)
    devices: tuple[int, ...]
    poll_s: float = 1.0  # seconds between looks at the queue; a child's exit wakes it at once
    policy: Policy = field(default_factory=Policy)
    once: bool = False  # exit when nothing this worker can run is left
    stale_after_s: float = STALE_AFTER_S
    # Run each job's command directly, without a run record: for benchmarks of the
    # scheduler only (no provenance, no supervision, no resume).
    direct: bool = False


@dataclass(slots=True)
class _Child:
    job_id: int
    pid: int
    proc: subprocess.Popen[bytes] | None  # None: adopted from a dead worker
    log: IO[bytes] | None = None


class Worker:
    """Runs queued jobs on a fixed set of devices until stopped (or drained with ``once``)."""

    def __init__(
        self,
        workspace: Workspace,
        config: WorkerConfig,
    ) -> None:
        self.ws = workspace
        self.config = config
        self.dir = queue_dir(workspace)
        self.db = queue_db(workspace)
        self.id = f"{socket.gethostname()}:{os.getpid()}:{int(time.time() * 1000) % 100000}"
        self.children: dict[int, _Child] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._warned: set[int] = set()

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Work until SIGTERM/SIGINT (or, with ``once``, until drained); returns 0."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {
                s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
            }
        label = "GPUs" if self.config.kind == "gpu" else "CPU slots"
        self.db.register_worker(
            self.id, pid=os.getpid(), kind=self.config.kind, devices=self.config.devices,
            now=time.time(),
        )  # fmt: skip
        _log.info(f"worker {self.id}: {label} {format_devices(self.config.devices)}")
        try:
            while not self._stopping:
                if self.tick() and self.config.once:
                    break
                self._wake.wait(self.config.poll_s)
                self._wake.clear()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            try:
                self.db.remove_worker(self.id)
            except Exception as exc:  # the jobs' records and rows stay true; say it, go on
                _log.warning(
                    f"worker {self.id}: could not remove its row from the queue ({exc}); "
                    "the next worker sees it as stale and takes over"
                )
            running = sorted(self.children)
            if running:
                _log.info(f"worker exits; jobs {running} run on, the next worker adopts them")
            for child in self.children.values():
                if child.log is not None:
                    child.log.close()
            self.db.close()
        return 0

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        self._stopping = True
        self._wake.set()

    def tick(self) -> bool:
        """One round; True when nothing this worker can run is left (queued or running)."""
        now = time.time()
        self.db.heartbeat(self.id, now)
        self._recover_orphans()
        self._reap()
        mine = {j.id: j for j in self.db.jobs(*ACTIVE) if j.id in self.children}
        for job in mine.values():
            if job.stop_request is not None and job.stop_sent_at is None:
                self._send_stop(job)
        queued = [
            j for j in self.db.jobs("queued", kind=self.config.kind)
            if j.slots <= len(self.config.devices) or self._warn_too_big(j)
        ]  # fmt: skip
        decided = plan(
            [Pending(j.id, j.priority, j.slots, j.submitted_at, j.queued_at, j.expected_s) for j in queued],
            [
                Active(j.id, j.priority, j.devices, j.started_at or now, j.expected_s,
                       stopping=j.stop_request is not None)
                for j in mine.values()
            ],
            self.config.devices,
            now,
            self.config.policy,
        )  # fmt: skip
        for victim, for_job in decided.preempt:
            stopping = self.db.request_stop(
                victim, "preempt", f"preempted by job {for_job}; resumes when devices free up"
            )
            if stopping is not None:
                _log.info(f"job {victim} ({stopping.name}) preempted for job {for_job}")
                self._send_stop(stopping)
        by_id = {j.id: j for j in queued}
        for job_id, devices in decided.start:
            self._start(by_id[job_id], devices)
        return not self.children and not any(
            j.slots <= len(self.config.devices)
            for j in self.db.jobs("queued", kind=self.config.kind)
        )

    def _warn_too_big(self, job: Job) -> bool:
        if job.id not in self._warned:
            self._warned.add(job.id)
            _log.info(
                f"job {job.id} ({job.name}) needs {job.slots} devices; this worker has "
                f"{len(self.config.devices)}: it waits for a larger worker"
            )
        return False

    # ---- starting -------------------------------------------------------------------------

    def _start(self, job: Job, devices: tuple[int, ...]) -> None:
        now = time.time()
        run_id = None if self.config.direct else (job.run_id or new_run_id(job.name))
        if not self.db.claim(job.id, worker_id=self.id, devices=devices, run_id=run_id, now=now):
            return  # another worker took it
        spec_file = self.dir / "specs" / f"job-{job.id}.toml"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        if not spec_file.exists():
            write_atomic(spec_file, job.spec_text, raw=True)  # the spec that runs
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        devs = format_devices(devices)
        env = dict(os.environ)
        env[ENV_SLOTS] = devs
        env[ENV_QUEUE_JOB] = str(job.id)
        env["CUDA_VISIBLE_DEVICES"] = devs if self.config.kind == "gpu" else ""
        cwd = Path(job.spec_path).parent
        resume = run_id is not None and (self.ws.runs_dir / run_id / "run.json").exists()
        if self.config.direct:
            argv, cwd = self._direct_command(spec_file, env)
        elif resume:
            assert run_id is not None
            why = "after a preemption" if job.preemptions else "after its supervisor was lost"
            argv = self._acceptrun(
                "resume", run_id, "--from-scratch", "-q", "--reason", f"queue job {job.id} {why}"
            )
        else:
            assert run_id is not None
            argv = self._acceptrun("run", "--run-id", run_id, "-q", str(spec_file))
        # The job's output reaches its log through the redactor, in a process that outlives
        # this worker as the job does (a direct job's command prints whatever it holds).
        pump = logpump.start(self.dir / "logs" / f"job-{job.id}.log")
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd if cwd.is_dir() else self.ws.root, env=env, stdin=subprocess.DEVNULL,
                stdout=pump.stdin, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            fresh = self.db.job(job.id)
            if fresh is not None:
                self.db.settle(fresh, "failed", note=f"could not start: {exc}", now=time.time())
            _log.info(f"job {job.id} ({job.name}) could not start: {exc}")
            return
        finally:
            if pump.stdin is not None:
                pump.stdin.close()  # the job holds the pipe: the pump ends when it is done
        what = "resuming" if resume else "run"
        self.db.set_pid(job.id, proc.pid, f"{what} {run_id}" if run_id else "running")
        self.children[job.id] = _Child(job.id, proc.pid, proc)
        threading.Thread(target=self._wait_child, args=(proc,), daemon=True).start()
        label = "GPUs" if self.config.kind == "gpu" else "slots"
        where = f"{what} {run_id}" if run_id else f"pid {proc.pid}"
        _log.info(f"job {job.id} ({job.name}) started on {label} {devs}: {where}")

    def _acceptrun(self, *args: str) -> list[str]:
        # `python -m acceptrun`: lifecycle recognises the process as a run's supervisor.
        return [sys.executable, "-m", "acceptrun", "--workspace", str(self.ws.root), *args]

    def _direct_command(self, spec_file: Path, env: dict[str, str]) -> tuple[list[str], Path]:
        from acceptrun.spec.model import load_spec
        from acceptrun.supervisor.process import python_output

        spec = load_spec(spec_file)
        env.update(spec.env)
        # Live output in its log, as under a supervisor: PYTHONUNBUFFERED unless the
        # spec decides (python_unbuffered, or the variable in its [env]).
        python_output(env, spec.env, spec.python_unbuffered)
        return list(spec.command), spec.workdir_path

    def _wait_child(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self._wake.set()

    # ---- ending ---------------------------------------------------------------------------

    def _reap(self) -> None:
        for job_id, child in list(self.children.items()):
            if child.proc is not None:
                rc = child.proc.poll()
                if rc is None:
                    continue
            else:
                job = self.db.job(job_id)
                if job is not None and job_process_alive(job):
                    continue
                rc = None
            del self.children[job_id]
            if child.log is not None:
                child.log.close()
            job = self.db.job(job_id)
            if job is None or job.state not in ACTIVE or job.worker_id != self.id:
                continue
            state, note = self._outcome(job, rc)
            self.db.settle(job, state, note=note, now=time.time(), exit_code=rc)
            _log.info(f"job {job.id} ({job.name}) {state}: {note}")

    def _outcome(self, job: Job, rc: int | None) -> tuple[str, str]:
        """The job's next state after its process ended (``rc`` None: not our child)."""
        if self.config.direct:
            if job.stop_request == "cancel":
                return "cancelled", "cancelled"
            if job.stop_request == "preempt" and rc != 0:
                return "queued", "preempted; starts again when devices free up"
            return ("done", "exited 0") if rc == 0 else ("failed", f"exited {rc}")
        run = job.run_id or "?"
        state = _run_state(self.ws, job.run_id)
        status = None if state is None else state.get("status")
        verdict = None if state is None else state.get("verdict")
        if job.stop_request == "cancel":
            return "cancelled", f"cancelled; run {run} {status or 'never started'}"
        if status == "finished" and verdict == "accepted":
            return "done", f"run {run} ACCEPTED"
        if job.stop_request == "preempt":
            return "queued", f"preempted; resumes run {run} when devices free up"
        if state is None:
            if rc is None:
                return "queued", "its process died before creating the run; requeued"
            log = self.dir / "logs" / f"job-{job.id}.log"
            return "failed", f"acceptrun exited {rc} before creating run {run}; see {log}"
        if status in RUN_STATUSES_ACTIVE:
            if job.attempts - job.preemptions > LOST_SUPERVISOR_RETRIES:
                return "failed", f"the supervisor of run {run} died {job.attempts} times; given up"
            seen = last_sign_of_life(self.ws.runs_dir / run)  # record/liveness.py
            when = "" if seen is None else f" (interrupted, last sign of life {now_iso(seen)})"
            return "queued", f"the supervisor of run {run} died{when}; requeued to resume it"
        shown = f", exit {rc}" if rc is not None else ""
        return "failed", f"run {run} {status}, {str(verdict or 'no verdict').upper()}{shown}"

    # ---- stops ----------------------------------------------------------------------------

    def _send_stop(self, job: Job) -> None:
        child = self.children.get(job.id)
        if child is None:
            return
        if self.config.direct:
            if self.db.claim_stop(job.id, time.time()):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
            return
        send_stop(self.ws, self.db, job, child.pid)

    # ---- orphans --------------------------------------------------------------------------

    def _recover_orphans(self) -> None:
        workers = {w.id: w for w in self.db.workers()}
        now = time.time()
        for job in self.db.jobs(*ACTIVE):
            if job.worker_id == self.id or job.id in self.children:
                continue
            owner = workers.get(job.worker_id or "")
            if owner is not None and worker_alive(owner, now, self.config.stale_after_s):
                continue
            if job_process_alive(job):
                self._adopt(job)
                continue
            state, note = self._outcome(job, None)
            if self.db.settle(job, state, note=f"{note} (its worker is gone)", now=now):
                _log.info(f"job {job.id} ({job.name}): its worker is gone; {state}: {note}")

    def _adopt(self, job: Job) -> None:
        used = {d for c in self.children for d in (self._devices_of(c))}
        if (
            job.kind != self.config.kind
            or not set(job.devices) <= set(self.config.devices)
            or used & set(job.devices)
            or job.pid is None
        ):
            return  # another worker owns these devices: it adopts the job
        if self.db.adopt(job, self.id, f"adopted by {self.id}; run {job.run_id}"):
            self.children[job.id] = _Child(job.id, job.pid, None)
            _log.info(f"job {job.id} ({job.name}) adopted: its run {job.run_id} is still going")

    def _devices_of(self, job_id: int) -> tuple[int, ...]:
        job = self.db.job(job_id)
        return () if job is None else job.devices


def send_stop(ws: Workspace, db: QueueDB, job: Job, pid: int | None) -> bool:
    """Deliver a pending preemption or cancel to the job's run (``acceptrun stop``).

    False when it cannot be delivered yet: process ``pid`` has not created (or, for a
    resume, claimed) the record; the worker tries again next round. True once sent, or
    when the run is already closing: nothing is left to stop.
    """
    state = _run_state(ws, job.run_id)
    if pid is None or state is None or state.get("supervisor_pid") != pid:
        return False
    assert job.run_id is not None
    if not db.claim_stop(job.id, time.time()):
        return True  # another process delivered it
    if state.get("status") in RUN_SUPERVISED:
        from acceptrun.run.lifecycle import request_stop

        why = "cancelled" if job.stop_request == "cancel" else "preempted"
        try:
            request_stop(
                RunRecord(ws.runs_dir / job.run_id), "stop", reason=f"queue job {job.id} {why}"
            )
        except UserError:
            db.release_stop(job.id)
            return False  # it is ending by itself just now: the next round settles it
    return True


def _run_state(ws: Workspace, run_id: str | None) -> dict[str, Any] | None:
    if not run_id:
        return None
    path = ws.runs_dir / run_id / "run.json"
    try:
        data = read_json(path)
    except (OSError, RecordError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def job_process_alive(job: Job) -> bool:
    """The job's acceptrun process still runs (not a pid reused since)."""
    if job.pid is None or job.started_at is None:
        return False
    try:
        proc = psutil.Process(job.pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return job.started_at - 2.0 <= created <= job.started_at + PID_START_SLACK_S


def worker_alive(worker: WorkerRow, now: float, stale_after_s: float) -> bool:
    """A worker on this host: its pid runs (and is not a newer process); elsewhere: its
    heartbeat is fresh."""
    if worker.host != socket.gethostname():
        return now - worker.heartbeat < stale_after_s
    try:
        proc = psutil.Process(worker.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return bool(proc.create_time() <= worker.started_at + 2.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
