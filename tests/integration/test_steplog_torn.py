"""A SIGKILL mid-run loses no written step; a torn record is cut at resume and nothing else.

1. A child process writes steps through ``RunRecord.event("step", ...)`` (held and written
   in batches, as the client does) and says which steps it has flushed; it is SIGKILLed
   while it writes. The step log holds every step up to the last flushed one, in order,
   with at most a partial last record, which readers leave out.
2. Under ``acceptrun run``, the workload (the client API, a checkpoint at step 100) is
   SIGKILLed by this test mid-loop; its last step record is then torn by hand, half of it
   cut, as a power cut leaves it. Readers leave the partial record out; ``acceptrun show``
   shows the run; ``acceptrun resume`` cuts the partial record (a ``log_repaired`` event
   names the segment and the bytes) and continues from the checkpoint: every step the
   first attempt wrote is still there but the torn one, and the second attempt's steps
   follow in segments of their own.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from acceptrun._util.durable import read_jsonl
from acceptrun.record.steplog import StepLog
from conftest import wait_for

PYTHON = sys.executable

WRITER = """
import os, sys
from acceptrun.record.workspace import RunRecord

record = RunRecord(sys.argv[1])
flushed = sys.argv[2]
step = 0
while True:
    record.event("step", defer=True, attempt=1, step=step, loss=1.0 / (step + 1), samples=8,
                 step_time=0.001)
    if step % 500 == 499:
        record.flush_events()  # steps 0..step are on disk now: say so
        with open(flushed + ".tmp", "w") as f:
            f.write(str(step))
        os.replace(flushed + ".tmp", flushed)
    step += 1
"""


def _ints(values: np.ndarray[Any, Any]) -> list[int]:
    return [int(v) for v in values]


def _steps(log: StepLog, attempt: int) -> list[int]:
    return [s for c in log.chunks(attempt=attempt) for s in _ints(c.step)]


def test_a_killed_writer_loses_no_step_it_wrote(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    flushed = tmp_path / "flushed"
    (tmp_path / "writer.py").write_text(textwrap.dedent(WRITER))
    proc = subprocess.Popen([PYTHON, str(tmp_path / "writer.py"), str(run_dir), str(flushed)])
    try:
        # Killed while it writes: after at least four flushes, with batches still going out.
        wait_for(
            lambda: flushed.exists() and int(flushed.read_text() or -1) >= 1999,
            timeout=300, what="the writer's fourth flush",
        )  # fmt: skip
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last_flushed = int(flushed.read_text())
    log = StepLog(run_dir)
    assert log.problems == []
    assert len(log.torn) <= 1 and all(s.torn < s.width for s in log.torn)
    steps = _steps(log, 1)
    assert steps == list(range(len(steps))), "steps out of order or missing"
    assert last_flushed >= 1999 and len(steps) >= last_flushed + 1  # every flushed step
    assert log.count() == len(steps)
    losses = np.concatenate([c.values["loss"] for c in log.chunks()])
    assert np.array_equal(losses, 1.0 / (np.arange(len(steps)) + 1.0))  # float64, exact


WORKLOAD = """
import os, signal
import numpy as np
import acceptrun

weights = np.zeros(4)
run = acceptrun.init()
start = run.restore(weights=weights)
first = run.attempt == 1
total = 10**9 if first else start + 40  # the first attempt runs until it is killed
for step in run.steps(start, total):
    weights += 1.0
    run.log(step, loss=float(np.float32(1.0 / (step + 1))), samples=8)
    if step == 100:
        run.checkpoint(step, block=True)
"""

SPEC = """
name = "torn-steps"
command = [{python}, "work.py"]
[limits]
max_restarts = 0
"""


def _cli(ws: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("kind") == kind]


def _tail_events(run_dir: Path) -> str:
    path = run_dir / "events.jsonl"
    return "\n".join(path.read_text().splitlines()[-15:]) if path.exists() else "no events.jsonl"


def test_a_step_torn_by_a_kill_is_cut_at_resume_and_nothing_else_is_lost(tmp_path: Path) -> None:
    ws = tmp_path / ".acceptrun"
    (tmp_path / "work.py").write_text(textwrap.dedent(WORKLOAD))
    (tmp_path / "spec.toml").write_text(SPEC.format(python=json.dumps(PYTHON)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    # The run's output goes to files, never to pipes nobody reads while it runs (a full
    # pipe would block it), and a failed wait shows them with the record's last events.
    out_path, err_path = tmp_path / "run.out", tmp_path / "run.err"
    with out_path.open("w") as out, err_path.open("w") as errf:
        run = subprocess.Popen(
            [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
            cwd=tmp_path, env=env, stdout=out, stderr=errf, text=True,
        )  # fmt: skip
    rd: Path | None = None

    def explain() -> str:
        events = _tail_events(rd) if rd is not None else "no record yet"
        return (
            f"acceptrun run's stderr:\n{err_path.read_text()[-4000:]}\n"
            f"stdout:\n{out_path.read_text()[-2000:]}\nlast events:\n{events}"
        )

    try:

        def run_dir() -> Path | None:
            # not ``.creating-<id>/``: a record being made, renamed into place a moment later
            found = list((ws / "runs").glob("[!.]*/run.json")) if (ws / "runs").is_dir() else []
            return found[0].parent if found else None

        rd = wait_for(run_dir, what="the run's record", alive=run, explain=explain)
        assert rd is not None

        def workload() -> int | None:
            assert rd is not None
            if not (rd / "events.jsonl").exists():
                return None
            starts = _events(rd, "workload_start")
            return int(starts[0]["pid"]) if starts else None

        pid = wait_for(workload, what="the workload_start event", alive=run, explain=explain)
        # Killed mid-loop, past its checkpoint (step 100) and with steps still being written.
        wait_for(
            lambda: StepLog(rd).count() >= 300 and _events(rd, "checkpoint_commit"),
            what="300 steps and the checkpoint of step 100", alive=run, explain=explain,
        )  # fmt: skip
        os.kill(pid, signal.SIGKILL)
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    err = err_path.read_text()
    assert run.returncode != 0 and "Traceback" not in err, err  # no restart: the run failed
    killed = StepLog(rd)
    assert killed.problems == [] and len(killed.torn) <= 1
    written = _steps(killed, 1)
    assert written == list(range(len(written))) and len(written) >= 300

    # Tear the last record by hand, as a power cut mid-write leaves it: half of it stays.
    seg = killed.segments[-1]
    keep = seg.offset + (seg.count - 1) * seg.width + seg.width // 2
    os.truncate(seg.path, keep)
    torn = StepLog(rd)
    (torn_seg,) = torn.torn
    assert torn_seg.path == seg.path and torn_seg.torn == seg.width // 2
    assert _steps(torn, 1) == written[:-1]  # the partial record is left out, nothing else
    assert torn.tail(1)[0]["step"] == written[-2]
    shown = _cli(ws, "show", rd.name, cwd=tmp_path)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stdout + shown.stderr

    resumed = _cli(ws, "resume", rd.name, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((rd / "verdict.json").read_text())["accepted"] is True
    (repaired,) = _events(rd, "log_repaired")
    assert repaired["path"] == str(seg.path) and repaired["torn_bytes"] == seg.width // 2
    assert seg.path.stat().st_size == seg.offset + (seg.count - 1) * seg.width

    after = StepLog(rd)
    assert after.torn == [] and after.problems == []
    assert _steps(after, 1) == written[:-1]  # every step of attempt 1 but the torn one
    (commit,) = _events(rd, "checkpoint_commit")
    assert commit["step"] == 100
    assert _steps(after, 2) == list(range(101, 141))  # from the checkpoint of step 100
    assert {s.attempt for s in after.segments} == {1, 2}
    assert all(s.path.parent.parent.name == str(s.attempt) for s in after.segments)
    for chunk in after.chunks():  # the values too, not only the steps
        want = (1.0 / (chunk.step + 1.0)).astype(np.float32).astype(np.float64)
        assert np.array_equal(chunk.values["loss"], want)
        assert np.all(chunk.values["samples"] == 8.0)
    shown = _cli(ws, "show", rd.name, cwd=tmp_path)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stdout + shown.stderr


FSIZE = """
import resource, signal, sys
import numpy  # imported before the limit: nothing but the step log writes under it
from acceptrun.record.workspace import RunRecord
from acceptrun.record.steplog import StepLog
import acceptrun.record.steplog, acceptrun._util.redact

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write(2) fails with EFBIG
record = RunRecord(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))  # shorter than a segment's header
try:
    record.event("step", attempt=1, step=0, loss=0.5)
    print("step 0 written")
except OSError as exc:
    print("step 0 refused", exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
for step in range(1, 4):
    record.event("step", attempt=1, step=step, loss=0.5)
"""


def test_a_segment_whose_header_a_write_limit_cut_is_removed(tmp_path: Path) -> None:
    """A write that fails inside a new segment's header (EFBIG, as ENOSPC) leaves no file
    that no reader can use: the next steps open another segment and read back."""
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (tmp_path / "fsize.py").write_text(textwrap.dedent(FSIZE))
    proc = subprocess.run(
        [PYTHON, str(tmp_path / "fsize.py"), str(run_dir)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"step 0 refused {errno.EFBIG}" in proc.stdout, proc.stdout + proc.stderr
    log = StepLog(run_dir)
    assert log.problems == [], log.problems
    assert _steps(log, 1) == [1, 2, 3]
    assert all(s.path.stat().st_size == s.offset + s.count * s.width for s in log.segments)
