"""The views of a closed run read what close wrote, and decide nothing again.

A real run closes in a git checkout (close calls git once, for portability.json). Then
``show``, ``report`` and the board's run page run with ``git`` made to fail (a ``git``
first on PATH that exits 1 and notes each call) and with the verdict, summary, ledger
and portability builders made to raise in this process: each still answers, from the
facts close wrote, and the report equals the one written at close.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path

import pytest
from tests.conftest import Project, run_main

from acceptrun.record.workspace import Workspace
from acceptrun.ui import Board
from acceptrun.ui.pages import run_page

SCRIPT = """
import acceptrun

run = acceptrun.init()
for step in range(1, 6):
    run.log(step=step, loss=1.0 / step)
run.finish()
"""

# What a view of a closed run must never call: each raises if it is called.
BUILDERS = (
    ("acceptrun.verdict.decide", "compute_verdict"),
    ("acceptrun.telemetry.summary", "summarize"),
    ("acceptrun.telemetry.summary", "pending_summary"),
    ("acceptrun.telemetry.summary", "_summarize"),  # what load_summary computes with
    ("acceptrun.cost.ledger", "build_ledger"),
    ("acceptrun.cost.report", "build_ledger"),
    ("acceptrun.verdict.portability", "check_run"),
    ("acceptrun.verdict.portability_git", "git_state"),
)


def _git_checkout(root: Path) -> None:
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(root), *env, "commit", "-q", "-m", "first"], check=True)


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("a view of a closed run called a builder")


def test_show_report_and_the_run_page_read_what_close_wrote(
    project: Project,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no user git config
    project.spec(SCRIPT, extra="[cost]\nprice_per_hour = 3.6\n")
    _git_checkout(project.root)
    project.cli("run", "spec.toml", timeout=300)
    record = project.only_record()
    assert record.state["status"] == "finished"
    for name in ("verdict.json", "summary.json", "ledger.json", "portability.json"):
        assert record.exists(name), f"close did not write {name}"
    assert record.state["liveness"]["state"] == "ended"
    assert record.read_json("provenance.json")["git"]["root"]  # close had a checkout to check
    at_close = record.file("report.html").read_text()

    calls = tmp_path / "git-calls"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    for module, name in BUILDERS:
        monkeypatch.setattr(importlib.import_module(module), name, _refuse)

    ws = str(project.workspace)
    code, out, err = run_main(capsys, "--workspace", ws, "show", record.run_id)
    assert code in (0, 1), err
    assert record.run_id in out and "Traceback" not in err
    code, out, err = run_main(capsys, "--workspace", ws, "show", "--json", record.run_id)
    assert '"state": "ended"' in out and "Traceback" not in err

    code, out, err = run_main(capsys, "--workspace", ws, "report", record.run_id)
    assert code == 0, err
    assert record.file("report.html").read_text() == at_close  # the report written at close
    code, out, err = run_main(capsys, "--workspace", ws, "report", "--format", "md", record.run_id)
    assert code == 0 and "## Portability" in out, err

    board = Board.for_workspaces([Workspace(project.workspace)])
    page = run_page(board, 0, record, None)
    verdict = "ACCEPTED" if record.state["verdict"] == "accepted" else "REJECTED"
    assert verdict in page and 'id="portability"' in page
    assert "write report.html" in page  # not live: the lease ended at close

    assert not calls.exists(), f"git was called: {calls.read_text()}"
