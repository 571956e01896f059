"""acceptrun gc skips a running run whose supervisor is alive (a real process; the rules:
tests/unit/test_gc.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.cli.main import main
from acceptrun.record.workspace import RunRecord, Workspace


def make_run(
    ws: Workspace,
    tmp_path: Path,
    name: str,
    steps: list[int],
    *,
    extra: str = "",
    metrics: dict[int, float] | None = None,
    **state: Any,
) -> RunRecord:
    """A real record with committed checkpoints of 1 KiB * step index, then ``state``."""
    spec = f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "-c", "pass"]\n'
    spec += f"workdir = {json.dumps(str(tmp_path))}\n{extra}"
    record = ws.create_run(name, spec_text=spec, state={"mode": "supervised"})
    store = CheckpointStore(record.checkpoints_dir, keep_last=100)
    for n, step in enumerate(steps, 1):
        writer = store.begin(step)
        writer.write_bytes("weights.bin", bytes(1024 * n))
        loss = (metrics or {}).get(step)
        store.commit(writer, metrics={"loss": loss} if loss is not None else None)
    record.update_state(**state)
    return record


def steps_on_disk(record: RunRecord) -> list[int]:
    return [i.step for i in CheckpointStore(record.checkpoints_dir).list()]


def gc(capsys: pytest.CaptureFixture[str], ws: Workspace, *args: str) -> tuple[int, str]:
    code = main(["--workspace", str(ws.root), "gc", *args])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.create(tmp_path / ".acceptrun")


@pytest.fixture
def live_pid() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_running_run_with_a_live_supervisor_is_skipped(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], live_pid: int
) -> None:
    record = make_run(ws, tmp_path, "live", [10, 20, 30], status="running", supervisor_pid=live_pid)
    code, out = gc(capsys, ws, "--apply", "--older-than", "0s", "--include-quarantine")
    assert code == 0
    assert f"skipped {record.run_id}: running (supervisor pid {live_pid} is alive)" in out
    assert steps_on_disk(record) == [10, 20, 30]
    assert not list(record.events("checkpoint_delete"))
