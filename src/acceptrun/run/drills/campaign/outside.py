"""Faults from outside the workload: the supervisor itself killed, or stopped a while.

The campaign starts ``acceptrun run SPEC`` as a process of its own (its own session), waits
in the record for the first checkpoint commit at or after the planned step, then:

- ``supervisor_killed``: SIGKILL to that process (the ``acceptrun run`` supervisor), then
  ``acceptrun resume RUN``, as an operator would. acceptrun must say the attempt was
  ``interrupted`` (its supervisor gone: attempts/1/exit.json and the resume's audit event)
  and resume it from the newest checkpoint, ending where the reference did.
- ``supervisor_stopped``: SIGSTOP to the supervisor for longer than the hang window (5 s
  without one), then SIGCONT. The workload ran on meanwhile: acceptrun must name no
  failure (no false hang once the supervisor wakes) and the run ends as the reference.

The ground truth (the signal's time, the step committed before it) is kept by the
campaign, not written into the record the supervisor owns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import loads_json
from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord

__all__ = ["OUTSIDE", "Outside", "run_outside"]

OUTSIDE = ("supervisor_killed", "supervisor_stopped")
GUARD_S = 600.0  # a hang guard only: the demo's run takes seconds
POLL_S = 0.01  # seconds between two reads of the new run's events


@dataclass(slots=True)
class Outside:
    """The run an outside fault hit, and the ground truth the campaign kept."""

    record: RunRecord
    fired_t: float
    step: int
    paused_s: float | None = None
    resume_rc: int | None = None


def _cli(workspace: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "acceptrun", "--workspace", str(workspace), *args]


def run_outside(
    name: str,
    spec_path: str | Path,
    workspace: Path,
    step: int,
    hang_window: float | None,
    existing: str | None = None,
) -> Outside:
    """Start the spec as ``acceptrun run``, fault its supervisor past ``step``; the record.

    ``existing``: ``--existing`` for the run (a black box's own checkpoint left behind).
    """
    runs = workspace / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    spec = Path(spec_path).resolve()
    extra = ["--existing", existing] if existing else []
    proc = subprocess.Popen(
        _cli(workspace, "run", *extra, str(spec)), cwd=spec.parent, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        rec, committed = _wait_for_commit(proc, runs, before, step)
        fired = time.time()
        if name == "supervisor_killed":
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=GUARD_S)
            resume = subprocess.run(
                _cli(workspace, "resume", rec.run_id), cwd=spec.parent, timeout=GUARD_S,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                check=False,
            )  # fmt: skip
            return Outside(rec, fired, committed, resume_rc=resume.returncode)
        pause = (hang_window or 4.0) + 1.0  # longer than the hang window: no false hang
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(pause)  # the fault itself: the supervisor frozen this long
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=GUARD_S)
        return Outside(rec, fired, committed, paused_s=pause)
    finally:
        if proc.poll() is None:  # only after a failure above: never leave it stopped
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def _wait_for_commit(
    proc: subprocess.Popen[bytes], runs: Path, before: set[Path], step: int
) -> tuple[RunRecord, int]:
    """The new run's record and its first committed checkpoint step at or after ``step``."""
    deadline = time.monotonic() + GUARD_S
    path: Path | None = None
    offset = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if path is None:
            path = _new_run(runs, before)
        if path is not None and (path / "events.jsonl").exists():
            with open(path / "events.jsonl", "rb") as f:
                f.seek(offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.splitlines():
                if b"checkpoint_commit" in line:
                    event: Any = loads_json(line)
                    if isinstance(event.get("step"), int) and event["step"] >= step:
                        return RunRecord(path), int(event["step"])
        time.sleep(POLL_S)
    raise UserError(
        f"the campaign's run of the spec ended (or ran {GUARD_S:g}s) before a checkpoint at "
        f"or after step {step} was committed: the supervisor could not be faulted mid-run"
    )


def _new_run(runs: Path, before: set[Path]) -> Path | None:
    """The run directory that appeared since ``before`` (whole: not a ``.creating-*`` one)."""
    if not runs.is_dir():
        return None
    new = [p for p in runs.iterdir() if p not in before and not p.name.startswith(".")]
    return next((p for p in new if (p / "run.json").exists()), None)
