"""run.should_stop(step) on one process, and the messages of a broken multi-rank contract."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.workload import signals
from acceptrun.workload.run import Run


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    """A supervised-looking Run of one process over a bare record (no init(): no handlers)."""
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))
    (tmp_path / "events.jsonl").write_text("")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        os.environ.pop(name, None)
    r = Run(RunRecord(tmp_path), attempt=1, supervised=True)
    yield r
    r.finished = True


def test_one_process_reads_the_flag_the_signal_set(run: Run) -> None:
    assert run.should_stop(0) is False and run.stop_requested is False
    run._on_stop_signal(signal.SIGTERM, None)  # the handler init() installs, called directly
    assert run.stop_requested is True  # one process: no agreement to wait for
    assert run.should_stop(1) is True
    (event,) = run.record.events("stop_requested")
    assert event["signal"] == "SIGTERM"


def test_should_stop_takes_sigterm_as_a_stop_from_then_on(run: Run) -> None:
    assert run._loop_stops is False
    run.should_stop(-1)  # before the first step
    assert run._loop_stops is True  # the handler now sets the flag instead of dying


@pytest.mark.parametrize(
    "step", [pytest.param(-2, id="negative"), pytest.param(1.0, id="float"),
             pytest.param(True, id="bool"), pytest.param("3", id="str")],
)  # fmt: skip
def test_a_step_that_is_not_a_step_number_is_refused(run: Run, step: object) -> None:
    with pytest.raises(UserError, match=r"run.should_stop\(step=.*an int >= 0"):
        run.should_stop(step)  # type: ignore[arg-type]


def test_ranks_at_different_steps_are_told_where_each_was() -> None:
    text = signals._mismatch(7, 7, 8, rank=1)
    assert "steps from 7 to 8" in text and "rank 1 was in run.should_stop(7)" in text
    assert "once per step, at the same point" in text


def test_a_rank_in_steps_and_one_in_should_stop_are_named() -> None:
    text = signals._mismatch(signals._STEPS_LOOP, signals._STEPS_LOOP, 4, rank=0)
    assert "one rank was in run.steps() and another called run.should_stop(4)" in text
    assert "rank 0 was in run.steps()" in text


def test_a_long_wait_names_the_rank_the_step_and_the_contract() -> None:
    line = signals._waiting(1, 7, 125.4)
    assert line.startswith("acceptrun: rank 1 has waited 125 s in run.should_stop(7)")
    assert "once per step, every rank" in line
    assert "at a step boundary of run.steps()" in signals._waiting(0, None, 130.0)


def test_a_script_that_ends_its_own_stop_ends_the_workload_as_stopped(run: Run) -> None:
    # A script with its own SIGTERM handler calls exit_stopped() without should_stop():
    # the workload's end must still read "stopped", not "ok".
    with pytest.raises(SystemExit) as exited:
        run.exit_stopped(4, checkpoint=4)
    assert exited.value.code == 143 and not run.stop_requested
    run._at_exit()
    (end,) = run.record.events("workload_end")
    assert end["status"] == "stopped"
