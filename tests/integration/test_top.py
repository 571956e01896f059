"""``acceptrun top`` on a live run started in the background, then after it ended."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project

WORKLOAD = """
import os, time, acceptrun
run = acceptrun.init()
for step in run.steps(100000):
    time.sleep(0.02)
    run.log(step, loss=1.0, samples=8)  # steps(100000) puts the total in each step event
    if os.path.exists("stop-now"):
        break
"""


@pytest.mark.slow
def test_top_once_shows_a_live_run_with_its_step(
    project: Project, poll: Callable[..., Any]
) -> None:
    spec = project.spec(WORKLOAD, name="toptest")
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "run", "-q", str(spec)],
        cwd=project.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_id = poll(lambda: project.run_ids(), timeout=60, what="the run record")[0]
        record = RunRecord(project.runs_dir / run_id)
        poll(lambda: len(list(record.events("step"))) >= 5, timeout=60, what="5 steps")

        out = project.cli("top", "--once", check_rc=0).stdout
        assert run_id in out and "toptest" in out
        assert "/100000" in out and "samples/s" in out

        rows = json.loads(project.cli("top", "--json", check_rc=0).stdout)
        (row,) = rows
        assert row["run_id"] == run_id and row["attempt"] == 1 and row["restarts"] == 0
        assert isinstance(row["step"], int) and row["step"] >= 4
        assert row["total_steps"] == 100000 and row["eta_s"] > 0
        # 8 samples a step of at least 20 ms: at most 400 samples/s, however slow the machine.
        assert row["throughput_unit"] == "samples/s" and 0 < row["throughput"] <= 400
        assert row["cost_usd"] is None  # the spec names no price
    finally:
        (project.root / "stop-now").write_text("")
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    rows = json.loads(project.cli("top", "--json", check_rc=0).stdout)
    assert rows == []  # finished: no longer running
    out = project.cli("top", "--once", check_rc=0).stdout
    assert "no running runs" in out


def test_top_refuses_a_bad_interval(project: Project) -> None:
    project.workspace.mkdir(parents=True)
    proc = project.cli("top", "--once", "--interval", "0", check_rc=2)
    assert "argument -n/--interval: '0' is out of range" in proc.stderr


def test_help_does_not_import_rich_or_torch() -> None:
    code = (
        "import sys\nfrom acceptrun.cli.main import build_parser\nbuild_parser()\n"
        "print(sorted(m for m in ('torch', 'rich.live', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
