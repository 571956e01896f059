"""Run an unmodified script under ``acceptrun run`` and kill it at a point the record shows.

Shared by the tests of black-box habits (test_watched_habits.py, test_figures_habits.py)
and of watched checkpoints (test_watched_checkpoints.py):
the script blocks at a known point (``signal.pause()``), the test waits for the event
that says acceptrun saw what the kill is about, then SIGKILLs the workload. Nothing here
depends on the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import PYTHON, Project, wait_for

__all__ = ["events", "kill_when", "start", "workload_pid"]


def events(project: Project) -> list[dict[str, Any]]:
    """The only run's events so far (a line still being written is left out)."""
    ids = project.run_ids()
    if not ids:
        return []
    path = project.runs_dir / ids[0] / "events.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line still being written
    return out


def start(project: Project, spec: Path) -> subprocess.Popen[str]:
    """``acceptrun run -q SPEC`` as a real process, its output in one pipe."""
    return subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", "-q", str(spec)],
        cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def workload_pid(project: Project, attempt: int = 1) -> int:
    """The pid of the attempt's workload, once the attempt has started."""
    began = wait_for(
        lambda: next(
            (e for e in events(project) if e["kind"] == "attempt_start" and e["attempt"] == attempt),
            None,
        ),
        timeout=120, what=f"attempt {attempt} to start",
    )  # fmt: skip
    return int(began["pid"])


def kill_when(
    project: Project, spec: Path, seen: Callable[[dict[str, Any]], bool], what: str
) -> tuple[int, str]:
    """Run ``spec``, SIGKILL attempt 1's workload once an event matches ``seen``, and wait
    for the run to end: (its exit status, its output)."""
    proc = start(project, spec)
    pid = workload_pid(project)
    wait_for(lambda: any(seen(e) for e in events(project)), timeout=180, what=what)
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out
