"""acceptrun gc skips a running run whose supervisor is alive (a real process; the rules:
tests/unit/test_gc.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from acceptrun.cli.main import main
from acceptrun.record.workspace import Workspace
from builders import run_with_checkpoints, steps_on_disk


@pytest.fixture
def live_pid() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_running_run_with_a_live_supervisor_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], live_pid: int
) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    record = run_with_checkpoints(
        ws, tmp_path, "live", [10, 20, 30], status="running", supervisor_pid=live_pid
    )
    args = ["gc", "--apply", "--older-than", "0s", "--include-quarantine"]
    assert main(["--workspace", str(ws.root), *args]) == 0
    out = capsys.readouterr().out
    assert f"skipped {record.run_id}: running (supervisor pid {live_pid} is alive)" in out
    assert steps_on_disk(record) == [10, 20, 30]
    assert not list(record.events("checkpoint_delete"))
