"""A plain `python train.py` (a standalone run) killed with SIGKILL: its record says so.

No supervisor keeps a standalone run: the training process holds the run's lease itself
(record/lease.py). Killed before it could close the record (the OOM killer, a node reboot),
the run must read "interrupted" in `ls` and `show` (naming the process, not a supervisor)
instead of "running" for ever, and `acceptrun resume` must continue it from its newest
checkpoint to the same final state as a run that was never killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import only_record_in

pytestmark = pytest.mark.slow

# Deterministic, torch-free: the state is plain values. Attempt 1 with HOLD set checkpoints
# step 5 (blocking: committed), then says READY at step 7 and waits to be killed.
SCRIPT = """
import json, os, sys, threading
import acceptrun

run = acceptrun.init("standalone")
start = run.restore(w=[1.0, 2.0, 3.0])
hold = os.environ.get("HOLD") and run.attempt == 1
for step in run.steps(start, 12):
    w = [x * 1.0001 + 0.001 * step for x in run.state("w")]
    run.update_state(w=w)
    run.log(step, loss=sum(w))
    if step == 5:
        run.checkpoint(step, block=True)
    if hold and step == 7:
        print("READY", flush=True)
        threading.Event().wait()
os.makedirs("out", exist_ok=True)
with open("out/final.json", "w") as f:
    json.dump(run.state("w"), f)
run.output("final", "out/final.json")
run.finish()
"""


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "acceptrun", *args], cwd=cwd, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


def _start(cwd: Path, **env: str) -> subprocess.Popen[str]:
    (cwd / "train.py").write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, "train.py"], cwd=cwd, env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_killed_standalone_run_reads_interrupted_and_resumes_to_the_same_state(
    tmp_path: Path,
) -> None:
    ref_dir, dir_ = tmp_path / "reference", tmp_path / "killed"
    ref_dir.mkdir()
    dir_.mkdir()
    ref = _start(ref_dir)
    out, _ = ref.communicate(timeout=600)
    assert ref.returncode == 0, out

    proc = _start(dir_, HOLD="1")
    assert proc.stdout is not None
    for line in proc.stdout:  # ends when the script says it holds at step 7
        if line.strip() == "READY":
            break
    else:
        pytest.fail(f"the script ended before step 7 (exit {proc.wait()})")
    record = only_record_in(dir_ / ".acceptrun")
    lease = json.loads(record.file("supervisor.json").read_text())
    assert lease["role"] == "standalone" and lease["pid"] == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()

    listed = _cli(dir_, "ls")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if record.run_id in line)
    assert row.split()[1] == "interrupted", listed.stdout
    assert f"its process (pid {proc.pid}) is gone" in listed.stdout + listed.stderr
    shown = _cli(dir_, "show", record.run_id)
    assert "status   interrupted" in shown.stdout, shown.stdout

    resumed = _cli(dir_, "resume", record.run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    resumes = [e for e in record.events("audit") if e.get("action") == "resume"]
    assert len(resumes) == 1 and resumes[0]["from_step"] == 5, resumes
    assert resumes[0]["interrupted"] is not None
    assert json.loads(record.file("run.json").read_text())["verdict"] == "accepted"
    final = json.loads((dir_ / "out" / "final.json").read_text())
    assert final == json.loads((ref_dir / "out" / "final.json").read_text())


def test_a_standalone_run_that_closes_leaves_an_ended_lease(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    record = only_record_in(tmp_path / ".acceptrun")
    lease = json.loads(record.file("supervisor.json").read_text())
    assert lease["role"] == "standalone" and lease["ended_at"] is not None
    listed = _cli(tmp_path, "ls")
    row = next(line for line in listed.stdout.splitlines() if record.run_id in line)
    assert row.split()[1] == "finished", listed.stdout


FORKING = """
import os, sys
import acceptrun

run = acceptrun.init("forking")
start = run.restore(n=0)
pid = os.fork()
if pid == 0:  # a child that exits normally: atexit handlers run in it
    sys.exit(0)
os.waitpid(pid, 0)
for step in run.steps(start, 3):
    run.log(step, loss=1.0)
run.finish()
"""


def test_a_forked_child_neither_closes_the_record_nor_takes_the_lease(tmp_path: Path) -> None:
    """A child forked from a standalone script (os.fork, a fork-started worker) that exits
    through sys.exit runs the parent's atexit handlers: they must not end the workload,
    close the run or write its lease in the child's name."""
    (tmp_path / "train.py").write_text(FORKING)
    proc = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(tmp_path / ".acceptrun")
    ends = list(record.events("workload_end"))
    assert len(ends) == 1 and ends[0]["status"] == "ok", ends
    assert [e["step"] for e in record.events("step")] == [0, 1, 2]
    lease = json.loads(record.file("supervisor.json").read_text())
    (start,) = list(record.events("workload_start"))
    assert lease["pid"] == start["pid"] and lease["ended_at"] is not None
    assert json.loads(record.file("run.json").read_text())["verdict"] == "accepted"
