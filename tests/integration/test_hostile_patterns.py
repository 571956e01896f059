"""Nothing a workload prints can stop the supervisor; a pattern RE2 cannot run is refused.

A real ``acceptrun run`` of a script that prints 64 KiB lines of x's as fast as it can,
with a ``progress.pattern`` that backtracks exponentially on Python's ``re`` (``(x+x+)+y``:
one 40-character line took it hours, holding the GIL) and one that is slow on RE2 too
(``(.*x){181}``, near the largest program RE2 is allowed here: about a second a line,
linear but long). Each run ends at
``limits.wall_time``, its stop recorded as ``wall_time``; its lease (supervisor.json) is
renewed while the script prints; and its stop comes within the wall time plus the
poll, measured from the ``run_start`` event (written before the supervisor starts its
clock). A pattern RE2 refuses fails ``spec check`` with status 2, naming the field and
the construct, and ``run`` refuses it before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.campaign import tally

from acceptrun._util.userregex import UNSUPPORTED
from acceptrun.record.workspace import RunRecord
from conftest import Project, toml_str, wait_for

pytestmark = pytest.mark.slow

PYTHON = sys.executable
WALL_S = 4.0  # limits.wall_time: two lease renewals (every 2 s) while the script prints
# The stop is due at the wall time plus one poll of the supervisor (0.25 s), and the end
# of the attempt after at most a poll's matching budget, a final read's and a line each
# (progress.py; a few seconds for the slow pattern). These are hang guards, not speed
# targets: with the pattern on Python's re the run never ended, and on a loaded 2-CPU
# machine the launch alone (before the attempt starts) has taken 5.5 s.
LATE_GUARD_S = 10.0  # stop_sent after attempt_start + wall time
END_GUARD_S = 60.0  # attempt_exit after run_start + wall time
HOSTILE = """\
import sys
line = "x" * 65535 + "\\n"  # 64 KiB: the longest line the reader keeps
write = sys.stdout.write
while True:
    write(line)
"""
PATTERNS = [
    pytest.param(r"(?P<step>\d*)(x+x+)+y", id="exponential-on-re"),
    pytest.param(r"(?P<step>\d*)(.*x){181}", id="a-second-a-line-on-re2"),
]


def _lease(record_dir: Path) -> dict[str, Any] | None:
    try:
        body = json.loads((record_dir / "supervisor.json").read_text())
    except (OSError, ValueError):  # not written yet, or caught between its write and rename
        return None
    return body if isinstance(body, dict) else None


def _runs(workspace: Path) -> list[Path]:
    runs = workspace / "runs"
    return [p for p in runs.iterdir() if not p.name.startswith(".")] if runs.is_dir() else []


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_hostile_pattern_and_output_leave_wall_time_and_lease_on_time(
    project: Project, pattern: str
) -> None:
    spec = project.spec(
        HOSTILE,
        extra=f'[progress]\npattern = {toml_str(pattern)}\n[limits]\nwall_time = "{WALL_S:g}s"\n',
    )
    env = {k: v for k, v in os.environ.items() if k != "ACCEPTRUN_WORKSPACE"}
    err_path = project.root / "err.txt"
    with open(project.root / "out.txt", "w") as out_file, open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", "--quiet",
             str(spec)],
            cwd=project.root, stdout=out_file, stderr=err_file, env=env,
        )  # fmt: skip
    try:
        run_dir = wait_for(lambda: next(iter(_runs(project.workspace)), None), 120, alive=proc)
        first = wait_for(lambda: _lease(run_dir), 120, alive=proc)["renewed_at"]
        # Renewed while the script prints and the pattern is matched: the lease's thread
        # and the poll loop never wait on the reader.
        renewed = wait_for(
            lambda: (b := _lease(run_dir)) and b["ended_at"] is None and b["renewed_at"] > first,
            120, alive=proc, what="a lease renewal while the script prints",
        )  # fmt: skip
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=120)  # a hang guard: it ends by its wall time
    finally:
        hung = proc.poll() is None
        if hung:
            proc.kill()
            proc.wait()
        err = err_path.read_text()
        tally("user patterns", tried=1, hangs=int(hung), tracebacks=int("Traceback" in err))
    assert not hung, "the run outlived its wall time by 120 s"
    assert renewed and "Traceback" not in err, err
    record = RunRecord(run_dir)
    exit_json = json.loads((run_dir / "attempts" / "1" / "exit.json").read_text())
    assert exit_json["outcome"] == "wall_time", exit_json
    assert "wall-time limit" in exit_json["reason"]
    (run_start,) = [e["t"] for e in record.events("run_start")]
    (attempt_start,) = [e["t"] for e in record.events("attempt_start")]
    (stop,) = [e for e in record.events("stop_sent")]
    (exit_event,) = [e for e in record.events("attempt_exit")]
    assert "wall time" in stop["reason"], stop
    # The attempt starts after the supervisor's wall-time clock: a lower bound of how late
    # the stop came. run_start is written before that clock starts: an upper bound.
    assert stop["t"] - attempt_start - WALL_S < LATE_GUARD_S, (stop, attempt_start, err)
    assert exit_event["t"] - run_start - WALL_S < END_GUARD_S, (exit_event, run_start, err)
    (run_dir / "attempts" / "1" / "stdout.log").unlink()  # hundreds of MB of x's


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [(example, name) for _text, name, _fix, example in UNSUPPORTED[::5]],
    ids=[name for _text, name, _fix, _example in UNSUPPORTED[::5]],
)
def test_a_pattern_re2_refuses_fails_spec_check_and_run_before_anything_starts(
    project: Project, pattern: str, construct: str
) -> None:
    spec = project.spec(
        'open("started", "w").close()\n',
        extra=f"[progress]\npattern = {toml_str(pattern)}\n",
    )
    tried = tracebacks = 0
    for command in ("spec", "check"), ("run",):
        proc = project.cli(*command, str(spec), timeout=120)
        tried += 1
        tracebacks += "Traceback" in proc.stderr
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "progress.pattern" in proc.stderr and construct in proc.stderr, proc.stderr
        assert "RE2" in proc.stderr, proc.stderr
    tally("user patterns", tried=tried, tracebacks=tracebacks)
    assert tracebacks == 0
    assert not (project.root / "started").exists()  # the script never ran
    assert _runs(project.workspace) == []  # nor was a run recorded
