"""The client's module example: a standalone run recorded in a workspace of its own.

It runs in this process like a script's ``python train.py`` would (init, steps, log,
metric, finish); finishing closes the run, which captures provenance (git) and writes
the verdict and the report.
"""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

import pytest

import acceptrun.run.standalone
from acceptrun.record.workspace import RunRecord
from acceptrun.workload.run import Run


@pytest.mark.slow
def test_client_module_example_records_a_standalone_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(acceptrun.run.standalone, "_active", None)  # a run of its own
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # init() installs the run's
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(acceptrun.run.standalone)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, clear_globs=False)
    assert (runner.failures, runner.tries) == (0, 7)
    run = test.globs["run"]
    assert isinstance(run, Run) and run.finished and not run.supervised
    record = RunRecord(run.run_dir)
    assert record.state["status"] != "running"  # closed by finish(): verdict written
    assert [e["name"] for e in record.events("metric")] == ["eval/accuracy"]
