"""Processes that leave the attempt's process group (setsid, torchrun's ranks) die with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from conftest import Project

# A black-box workload (no client API) that starts a process in a session of its own,
# as torchrun does with each rank, then exits without waiting for it.
ESCAPE = """
import os, subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
)
open("stray.pid", "w").write(str(child.pid))
time.sleep(0.2)
"""


def _alive(pid: int) -> bool:
    """The stray itself still runs (not another process given its pid since)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "time.sleep(300)" in proc.cmdline()
    except psutil.Error:
        return False


def test_a_process_in_its_own_session_does_not_outlive_the_attempt(project: Project) -> None:
    spec = project.spec(ESCAPE)
    project.cli("run", "-q", str(spec), check_rc=0)
    pid = int((project.root / "stray.pid").read_text())
    try:
        assert not _alive(pid), f"pid {pid} outlived its attempt"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_kill_strays_spares_other_runs(tmp_path: Path) -> None:
    """Only the attempt's own processes are killed: another run's are left alone."""
    from acceptrun.supervisor.process import ChildProcess

    env = {**os.environ, "ACCEPTRUN_RUN_ID": "other-run", "ACCEPTRUN_ATTEMPT": "1"}
    other = psutil.Popen(["sleep", "30"], env=env, start_new_session=True)
    try:
        mine = ChildProcess(
            ["true"],
            cwd=tmp_path,
            env={**os.environ, "ACCEPTRUN_RUN_ID": "this-run", "ACCEPTRUN_ATTEMPT": "1"},
            stdout_path=tmp_path / "out.log",
            stderr_path=tmp_path / "err.log",
            echo=False,
        )
        assert other.pid not in mine.kill_strays()
        assert other.is_running() and other.status() != psutil.STATUS_ZOMBIE
    finally:
        other.kill()
        other.wait()
