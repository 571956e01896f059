"""The supervisor's side of "the supervisor can die": a lease, a death signal, a watchdog.

``kill -9`` of ``acceptrun run`` (the OOM killer, a node reboot) must neither leave the
workload training unsupervised nor leave the record saying "running" for ever:

- :class:`~acceptrun.record.lease.SupervisorLease` (in the record layer, since a standalone
  run's training process holds one too) writes ``supervisor.json`` in the run directory
  (pid, process start time, host) and renews it every ``RENEW_S`` seconds from a thread
  of its own; readers (:mod:`acceptrun.record.liveness`) show a run whose supervisor is
  gone as ``interrupted``, with its last sign of life.
- :func:`die_with_supervisor` runs in the forked child before exec: the kernel sends it
  SIGTERM when the supervisor dies (Linux ``PR_SET_PDEATHSIG``). A script using the
  client checkpoints at its next step boundary and exits; so does a script that handles
  SIGTERM itself; any other dies of it. The signal follows the death of the *thread*
  that forked: the supervisor forks from the thread that runs its attempts loop, which
  lives as long as supervision does.
- :class:`Watchdog`, a small process beside each attempt, enforces the grace period
  once the supervisor is gone: SIGTERM (again; for a string command the whole group),
  then after ``limits.grace_period`` SIGKILL to the group, to the attempt's cgroup, to
  every process listed in ``attempts/<n>/processes.json`` and to every process that
  carries the attempt's ``ACCEPTRUN_RUN_ID``/``ACCEPTRUN_ATTEMPT`` (torchrun's ranks,
  which live in sessions of their own; supervisor/containment.py). No process of the
  attempt outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from acceptrun._util.durable import REPAIRED_KIND
from acceptrun.errors import RecordError
from acceptrun.record.steplog import StepChunk, StepLog
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord
from acceptrun.supervisor.classify import AttemptFacts, Classification, classify, stderr_tail

__all__ = ["Watchdog", "die_with_supervisor", "take_over"]

_PR_SET_PDEATHSIG = 1  # prctl(2) option, linux/prctl.h
_WATCHDOG = Path(__file__).with_name("_watchdog.py")


def die_with_supervisor(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for Popen that asks the kernel for ``sig`` when the parent dies.

    Everything it needs is looked up here, before the fork: between fork and exec only
    the prctl call runs. None where the kernel has no such signal (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    getppid, getpid, kill = os.getppid, os.getpid, os.kill

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if getppid() != parent:  # the supervisor died before prctl took effect
            kill(getpid(), sig)

    return preexec


class Watchdog:
    """The process that stops an attempt's tree if the supervisor dies (``_watchdog.py``).

    It is the supervisor's child in a session of its own (a Ctrl-C to the terminal does
    not reach it), imports nothing but the standard library and psutil (~30 ms, ~10 MB),
    and polls its parent pid every 0.2 s (a death signal could arrive before it can
    handle one; a poll cannot be missed). :meth:`stop` ends it when the attempt ends.
    """

    def __init__(
        self,
        *,
        leader: int,
        env: Mapping[str, str],
        grace_s: float,
        group_term: bool,
        events_path: Path,
        attempt: int,
        cgroup: Path | None = None,
        processes: Path | None = None,
    ) -> None:
        self.argv = [
            sys.executable, "-I", str(_WATCHDOG), str(os.getpid()), str(leader),
            f"{grace_s:g}", "1" if group_term else "0", str(events_path),
            str(env.get("ACCEPTRUN_RUN_ID", "")), str(attempt),
            "" if cgroup is None else str(cgroup), "" if processes is None else str(processes),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it; an OSError is reported on stderr and supervision goes on without it."""
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            print(f"acceptrun: the attempt's watchdog did not start: {exc}", file=sys.stderr)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def take_over(
    record: RunRecord, *, grace_s: float = 0.0, devices: int = 1, nodes: int = 1
) -> dict[str, Any] | None:
    """Before ``acceptrun resume`` continues a run whose supervisor died: clean up after it.

    Waits up to ``grace_s`` seconds (the spec's grace period) for what is left of its last
    attempt to checkpoint and exit (the watchdog's stop may still be under way), kills
    the rest (a node that rebooted has nothing left), writes that attempt's ``exit.json`` (outcome
    ``interrupted``; class ``disk_full`` when the record shows a full disk stopped the
    supervisor) when the dead supervisor could not, and returns what the resume event
    records: ``{"attempt", "last_sign_of_life", "dead_s", "killed"}`` (and ``class``,
    ``evidence`` for a full disk). None when
    the supervisor was not gone (a stopped or finished run resumed as before).
    """
    from acceptrun.record.liveness import supervisor_state

    liveness = supervisor_state(record)
    if not liveness.gone:
        return None
    now = time.time()
    last = liveness.last_sign_of_life
    attempts = [int(p.name) for p in (record.path / "attempts").glob("*") if p.name.isdigit()]
    attempt = max(attempts, default=None)
    killed: list[int] = []
    cause: dict[str, Any] = {}
    if attempt is not None:
        deadline = time.monotonic() + grace_s
        while _attempt_pids(record, attempt) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = _kill_attempt(record, attempt)
        if not record.exists(f"attempts/{attempt}/exit.json"):
            # The events but steps (record format 2); the steps are read from the step
            # log in chunks, never as a dict each.
            events = RecordView(record).log_events
            log = StepLog(record.path, events=events)
            work = unrecorded_work(
                events, attempt, last, devices=devices, nodes=nodes, step_log=log
            )
            ended = {
                "attempt": attempt, "outcome": "interrupted", "returncode": None,
                "signal": None, "started_at": None, "ended_at": None, "duration_s": None,
                "reason": f"interrupted: {liveness.detail}; "
                f"last sign of life {liveness.last_seen_iso}",
                "work": work,
                "decision": "resume: acceptrun resume",
            }  # fmt: skip
            # A full disk is the usual reason a supervisor could not write exit.json: say
            # so (the verdict's failures check shows the class), not just "interrupted".
            if (full := _disk_full_cause(record, attempt, events, log)) is not None:
                shown = [line for line in full.evidence if not line.startswith("exit status")]
                cause = {"class": full.name, "evidence": [*shown, f"supervisor: {liveness.detail}"]}
                ended |= cause | {
                    "class_reason": f"disk full: {full.evidence[0]}; the supervisor could not "
                    "record the attempt's end"
                }
            record.write_json(f"attempts/{attempt}/exit.json", ended)
    return {
        "attempt": attempt,
        "last_sign_of_life": last,
        "dead_s": None if last is None else round(max(0.0, now - last), 3),
        "killed": killed,
        "detail": liveness.detail,
        **cause,
    }


def unrecorded_work(
    events: list[dict[str, Any]],
    attempt: int,
    ended_at: float | None,
    *,
    devices: int = 1,
    nodes: int = 1,
    step_log: StepLog | None = None,
) -> dict[str, Any]:
    """The work an attempt whose end went unrecorded lost, read from its events.

    As supervisor/outcome.py counts it for an attempt it saw end: the steps after the
    newest committed checkpoint (all the attempt's steps when none was committed during
    or before it) and the time from that checkpoint's step (or the attempt's start) to
    its last sign of life; ``devices`` are the run's devices in all (its GPUs, or one CPU
    device, per node, times its nodes). A lower bound (``lost_at_least``): the workload
    may have run steps its supervisor could not record. The steps are those of
    ``step_log`` (read in chunks) when given, else the step events among ``events``.
    """
    mine = [e for e in events if e.get("attempt") == attempt]
    started = next((e.get("t") for e in mine if e.get("kind") == "attempt_start"), None)
    # The newest checkpoint committed before this attempt ended: what a resume restores.
    commits = [
        int(e["step"]) for e in events
        if e.get("kind") == "checkpoint_commit" and isinstance(e.get("step"), int)
        and (ended_at is None or not isinstance(e.get("t"), int | float) or e["t"] <= ended_at)
    ]  # fmt: skip
    kept = max(commits, default=None)
    if step_log is not None:
        first, last, done, t_kept = _step_summary(step_log.chunks(1 << 16, attempt), kept)
    else:
        steps = {
            int(e["step"]): float(e["t"])
            for e in mine
            if e.get("kind") == "step" and isinstance(e.get("step"), int)
            and isinstance(e.get("t"), int | float)
        }  # fmt: skip
        first, last, done = min(steps, default=None), max(steps, default=None), len(steps)
        t_kept = None if kept is None else steps.get(kept)
    work: dict[str, Any] = {
        "first_step": first,
        "last_step": last,
        "steps_done": done,
        "checkpoint_after": kept,
        "lost_at_least": True,
    }
    if last is None or first is None:
        lost_steps, since = 0, started
    elif kept is None or kept < first:
        lost_steps, since = done, started
    else:
        lost_steps, since = max(0, last - kept), started if t_kept is None else t_kept
    lost_s = 0.0
    if isinstance(since, int | float) and isinstance(ended_at, int | float):
        lost_s = max(0.0, ended_at - float(since))
    work.update(
        steps_lost=lost_steps,
        seconds_lost=round(lost_s, 3),
        device_seconds_lost=round(lost_s * max(devices, 1), 3),
        node_seconds_lost=round(lost_s * max(nodes, 1), 3),
    )
    return work


def _step_summary(
    chunks: Iterable[StepChunk], kept: int | None
) -> tuple[int | None, int | None, int, float | None]:
    """(first, last, distinct steps, unix s of the last step ``kept``) of chunks of steps.

    Vectorized; holds the step column alone (8 bytes a step) for the distinct count of
    steps out of order (steps that only rise, a loop's, are counted as they come).
    """
    import numpy as np

    first: int | None = None
    last: int | None = None
    rising = True
    prev: int | None = None
    count = 0
    columns: list[Any] = []
    t_kept: float | None = None
    for c in chunks:
        if not len(c):
            continue
        lo, hi = int(c.step.min()), int(c.step.max())
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
        if rising and (
            (prev is not None and int(c.step[0]) <= prev) or bool((np.diff(c.step) <= 0).any())
        ):
            rising = False
        prev = int(c.step[-1])
        count += len(c)
        columns.append(c.step)  # one int64 column: the distinct count of steps out of order
        if kept is not None:
            hit = np.flatnonzero(c.step == kept)
            if hit.size:
                t_kept = float(c.t[hit[-1]])
    if not rising:
        count = int(np.unique(np.concatenate(columns)).size) if columns else 0
    return first, last, count, t_kept


_FRAGMENT_BYTES = 64 << 10  # of a torn line, searched for a storage error


def _disk_full_cause(
    record: RunRecord,
    attempt: int,
    events: list[dict[str, Any]] | None = None,
    step_log: StepLog | None = None,
) -> Classification | None:
    """The ``disk_full`` classification of an attempt whose end went unrecorded, or None.

    The classifier (supervisor/classify.py) reads what the full disk let through: the
    attempt's stderr tail first; else its own events (the workload's end status, a
    checkpoint that failed for space) and the torn fragments of events.jsonl (the line
    cut short by the full disk, and those terminated since the attempt started).
    """
    # The take-over reads the events once for this and the lost work: pass them in.
    events = RecordView(record).log_events if events is None else events
    step_log = StepLog(record.path, events=events) if step_log is None else step_log
    # The classifier reads whether the attempt stepped, and its last step: the tail only.
    mine = [e for e in events if e.get("attempt") == attempt and e.get("kind") != "step"]
    mine += step_log.tail(1, attempt=attempt)
    tail = stderr_tail(record.path / "attempts" / str(attempt) / "stderr.log")
    found = classify(AttemptFacts(None, None, None, tail, mine))
    if found.name == "disk_full":
        return found
    lines = [f"workload ended: {e.get('status')}" for e in mine if e.get("kind") == "workload_end"]
    for e in mine:
        if e.get("kind") == "checkpoint_failed" and e.get("fault") == "disk full":
            lines.append(
                f"CheckpointDiskFullError: the checkpoint of step {e.get('step')} was not "
                f"saved: {e.get('directory')} is full"
            )
        elif e.get("kind") == "checkpoint_failed" and e.get("error"):
            lines.append(str(e["error"]))
    started = min((e["t"] for e in mine if isinstance(e.get("t"), int | float)), default=0.0)
    lines += _torn_fragments(record.events_path, events, since=started)
    found = classify(AttemptFacts(None, None, None, "\n".join(lines), mine))
    return found if found.name == "disk_full" else None


def _torn_fragments(path: Path, events: list[dict[str, Any]], *, since: float) -> list[str]:
    """The unterminated last line of ``path`` and the torn lines repaired after ``since``."""
    spans = [
        (e["offset"], e["torn_bytes"])
        for e in events
        if e.get("kind") == REPAIRED_KIND
        and isinstance(e.get("offset"), int)
        and isinstance(e.get("torn_bytes"), int)
        and isinstance(e.get("t"), int | float)
        and e["t"] >= since
    ]
    found: list[str] = []
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _FRAGMENT_BYTES))
            tail = f.read()
            if tail and not tail.endswith(b"\n"):
                torn = tail.rpartition(b"\n")[2]
                spans.append((size - len(torn), len(torn)))
            for offset, length in spans:
                f.seek(offset)
                found.append(f.read(min(length, _FRAGMENT_BYTES)).decode(errors="replace"))
    except OSError:
        return []
    return [line.strip() for line in found if line.strip()]


def _attempt_pids(record: RunRecord, attempt: int) -> list[int]:
    """The attempt's live processes: the environment marker, its cgroup, its listed pids."""
    import psutil

    found: set[int] = set()
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("ACCEPTRUN_RUN_ID") == record.run_id and env.get("ACCEPTRUN_ATTEMPT") == str(
            attempt
        ):
            found.add(proc.pid)
    from acceptrun.supervisor.containment import PROCESSES_FILE, listed_pids

    with contextlib.suppress(RecordError, OSError, ValueError):
        held = record.read_json(f"attempts/{attempt}/{PROCESSES_FILE}")
        found.update(listed_pids(held))
    return sorted(found)


def _kill_attempt(record: RunRecord, attempt: int) -> list[int]:
    """SIGKILL what is left of the attempt; the pids killed."""
    killed: list[int] = []
    for pid in _attempt_pids(record, attempt):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed
