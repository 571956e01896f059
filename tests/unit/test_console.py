"""The acceptrun logger prints what the CLI always printed, and failures at close are kept."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from acceptrun._util.console import (
    LOGGER_NAME,
    ConsoleHandler,
    collect_messages,
    configure_console,
    format_table,
    get_logger,
)
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.run.close import close_run
from acceptrun.spec.model import RunSpec, load_spec


@pytest.fixture
def acceptrun_logger() -> Iterator[logging.Logger]:
    """The package logger, put back as it was after the test."""
    logger = logging.getLogger(LOGGER_NAME)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def test_console_prints_the_line_say_printed(
    acceptrun_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_console()
    get_logger("acceptrun.run.close").info("cleanup: rm -rf tmp failed: exit 1")
    get_logger("acceptrun.queue.worker").warning("job 3 (a) could not start: %s", "no GPU")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "acceptrun: cleanup: rm -rf tmp failed: exit 1\n"
        "acceptrun: job 3 (a) could not start: no GPU\n"
    )


def test_configuring_twice_never_prints_a_line_twice(
    acceptrun_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_console()
    configure_console()
    assert sum(isinstance(h, ConsoleHandler) for h in acceptrun_logger.handlers) == 1
    get_logger("acceptrun.x").info("once")
    assert capsys.readouterr().err == "acceptrun: once\n"


def test_the_level_hides_progress_but_keeps_warnings(
    acceptrun_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_console(logging.WARNING)
    log = get_logger("acceptrun.x")
    log.info("progress")
    log.warning("trouble")
    assert capsys.readouterr().err == "acceptrun: trouble\n"


def test_collect_messages_gets_them_without_the_prefix(acceptrun_logger: logging.Logger) -> None:
    log = get_logger("acceptrun.tune.sweep")
    with collect_messages() as said:
        log.info("trial %d of %d", 1, 4)
        log.debug("not asked for")
    log.info("after: not collected")
    assert said == ["trial 1 of 4"]


# ---- closing a run: an optional part that fails is an event and a warning ------------------


@pytest.fixture
def record_and_spec(tmp_path: Path) -> tuple[Workspace, RunRecord, RunSpec]:
    ws = Workspace.create(tmp_path / ".acceptrun")
    spec_text = f'name = "close"\ncommand = ["python", "train.py"]\nworkdir = "{tmp_path}"\n'
    record = ws.create_run(
        "close", spec_text=spec_text, state={"mode": "run", "status": "running", "attempts": 0}
    )
    return ws, record, load_spec(record.spec_path)


def test_a_report_that_cannot_be_written_is_an_event_and_a_warning(
    record_and_spec: tuple[Workspace, RunRecord, RunSpec], acceptrun_logger: logging.Logger
) -> None:
    ws, record, spec = record_and_spec
    (
        record.path / "report.html"
    ).mkdir()  # write_atomic cannot replace a directory  # write_atomic cannot replace a directory
    with collect_messages() as said:
        verdict = close_run(record, ws, spec)
    assert verdict is not None
    events = [json.loads(line) for line in (record.path / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["kind"] == "best_effort_failed"]
    assert [e["component"] for e in failed] == ["report"]
    assert failed[0]["error"].startswith("IsADirectoryError")
    assert "Traceback (most recent call last)" in failed[0]["traceback"]
    assert "write_report" in failed[0]["traceback"]
    warnings = [m for m in said if "failed at close" in m]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"run {record.run_id}: report failed at close: IsADirectoryError")
    # The close still ended: the verdict and the final state are written.
    assert json.loads((record.path / "verdict.json").read_text())["accepted"] is False


# ---- tables ------------------------------------------------------------------------------


def test_a_table_is_as_wide_as_its_cells_and_aligns_numbers() -> None:
    run_id = "20261201-140604-a-run-name-longer-than-forty-characters-3ccb"
    text = format_table(
        ["RUN", "STATUS", "BYTES FREED"],
        [[run_id, "finished/accepted", "1.5 KiB"], ["TOTAL", "", "12.0 MiB"]],
        right={"BYTES FREED"},
    )
    header, row, total = text.splitlines()
    assert header.split() == ["RUN", "STATUS", "BYTES", "FREED"]
    assert row.split() == [run_id, "finished/accepted", "1.5", "KiB"]  # nothing cut
    assert total.split() == ["TOTAL", "12.0", "MiB"]
    assert len({len(header), len(row), len(total)}) == 1  # right-aligned: all end together
    assert row.index("finished") == header.index("STATUS") == len(run_id) + 2
    assert not any(line.endswith(" ") for line in text.splitlines())


def test_a_table_measures_wide_characters_as_a_terminal_shows_them() -> None:
    text = format_table(["NAME", "N"], [["日本語", 1], ["x", 22]], right={"N"})
    lines = text.splitlines()
    # Three wide characters take six cells: the N column lines up under its header.
    assert lines[1] == "日本語   1"
    assert lines[2] == "x       22"


def test_the_docstring_examples_of_the_console_module_run() -> None:
    import doctest

    from acceptrun._util import console

    result = doctest.testmod(console)
    assert result.attempted >= 2 and result.failed == 0


def test_the_cli_leaves_logging_as_it_found_it(
    acceptrun_logger: logging.Logger, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from acceptrun.cli.main import main

    assert main(["--workspace", str(tmp_path / "ws"), "submit", str(tmp_path / "none.toml")]) == 2
    capsys.readouterr()
    assert not any(isinstance(h, ConsoleHandler) for h in acceptrun_logger.handlers)
    get_logger("acceptrun.run.launch").info("a later library call prints nothing")
    assert capsys.readouterr().err == ""
