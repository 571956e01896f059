"""Record files carry a format: absent reads as 1, 1 reads, a newer one fails clearly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acceptrun.errors import RecordError
from acceptrun.record.models import (
    FORMAT,
    LedgerFile,
    RunState,
    VerdictFile,
    record_format,
)
from acceptrun.record.status import RunStatus
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.supervisor.core import AttemptResult

MODELS = [RunState, VerdictFile, LedgerFile]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize(("data", "expected"), [({}, 1), ({"format": 1}, 1)], ids=["absent", "1"])
def test_an_old_or_current_file_reads(model: Any, data: dict[str, Any], expected: int) -> None:
    assert model.from_json(data, "f.json").format == expected


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_newer_format_names_the_file_the_format_and_the_fix(model: Any) -> None:
    with pytest.raises(RecordError) as err:
        model.from_json({"format": 99}, "runs/r/x.json")
    message = str(err.value)
    assert "runs/r/x.json has format 99" in message
    assert f"up to {FORMAT}" in message and "upgrade acceptrun" in message


@pytest.mark.parametrize("bad", ["1", 0, -1, 1.5, None, True])
def test_a_format_that_is_not_a_number_is_a_damaged_record(bad: Any) -> None:
    with pytest.raises(RecordError, match="not a format number"):
        record_format({"format": bad}, "run.json")


def test_a_file_that_is_not_an_object_is_a_damaged_record() -> None:
    with pytest.raises(RecordError, match=r"run.json holds a JSON list, not an object"):
        RunState.from_json([], "run.json")


def test_run_state_fields_and_a_status_this_code_does_not_know() -> None:
    state = RunState.from_json(
        {"run_id": "r", "status": "stopped", "attempts": 2, "steps": 7, "duration_s": 3}, "x"
    )
    assert (state.run_id, state.status, state.attempts, state.steps, state.duration_s) == (
        "r",
        "stopped",
        2,
        7,
        3,
    )
    assert state.run_status is RunStatus.STOPPED
    assert RunState.from_json({"status": "from_the_future"}, "x").run_status is None


def test_new_records_are_written_with_the_format(tmp_path: Path) -> None:
    record = Workspace(tmp_path / ".acceptrun").create_run(
        "t", spec_text='name = "t"\n', state={"mode": "standalone"}
    )
    assert record.state["format"] == FORMAT
    assert record.state["status"] == "created"
    exit_json = AttemptResult(
        attempt=1, outcome="success", returncode=0, signal=None, started_at="s",
        ended_at="e", duration_s=1.0, reason="exited 0",
    ).to_dict()  # fmt: skip
    assert exit_json["format"] == FORMAT


def test_run_state_of_a_newer_record_raises_when_read(tmp_path: Path) -> None:
    record = RunRecord(tmp_path / "runs" / "r")
    record.path.mkdir(parents=True)
    (record.path / "run.json").write_text(json.dumps({"format": FORMAT + 1, "status": "finished"}))
    with pytest.raises(RecordError, match=r"run.json has format \d+, newer than this acceptrun"):
        _ = record.state
