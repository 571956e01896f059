"""Work lost to a failure is exact, bounded or unknown, and every view says the same.

Real runs of scripts that never import acceptrun, killed by a real SIGKILL: the truth is
what the script itself wrote down (the iteration it had finished), never a guess.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from acceptrun.cost.ledger import build_ledger
from acceptrun.record.lost import LostWork
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.report.data import report_data
from acceptrun.report.html import render_html
from acceptrun.report.terminal import format_show
from acceptrun.ui import Board
from acceptrun.ui.pages import run_page
from acceptrun.verdict.diff import diff_runs, format_run_diff
from conftest import Project

EVERY = 50  # the script prints a progress line every EVERY iterations


def _sparse_run(project: Project) -> tuple[RunRecord, int]:
    """A script that prints ``iter N`` every 50 iterations, killed (a real SIGKILL from
    ``--inject kill@step=100``) somewhere between two lines; returns the record and the
    iteration attempt 1 had finished when it died, as the script wrote it."""
    truth = project.root / "reached.txt"
    spec = project.spec(
        f"""
        import os, time
        first = os.environ["ACCEPTRUN_ATTEMPT"] == "1"
        for i in range(1, (10_000 if first else 60) + 1):
            time.sleep(0.004)
            if first:
                with open({str(truth)!r} + ".new", "w") as f:
                    f.write(str(i))
                os.replace({str(truth)!r} + ".new", {str(truth)!r})  # whole, even when killed
            if i % {EVERY} == 0:
                print(f"iter {{i}}: loss {{1.0 / i:.5f}}", flush=True)
        """,
        extra="""
        [progress]
        pattern = 'iter (?P<step>\\d+): loss (?P<loss>\\S+)'
        [limits]
        restart_backoff = "0s"
        """,
    )
    proc = project.cli("run", "-q", "--inject", f"kill@step={2 * EVERY}", str(spec), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project.only_record(), int(truth.read_text())


def test_a_kill_between_two_progress_lines_is_a_range_never_an_exact_figure(
    project: Project,
) -> None:
    """Killed after printing ``iter 100`` and before ``iter 150``: the steps it ran after
    its last line are lost too and nobody saw them. Before, exit.json and the verdict said
    exactly the steps it had printed (a false exact figure); now a range holds the truth."""
    record, reached = _sparse_run(project)
    exit1 = json.loads((record.path / "attempts" / "1" / "exit.json").read_text())
    assert exit1["class"] == "killed", exit1
    lost = LostWork.of_work(exit1["work"])
    # No checkpoint: every iteration attempt 1 finished is redone.
    assert lost.high is not None and lost.low <= reached <= lost.high, (exit1["work"], reached)
    assert lost.high - lost.low == EVERY - 1, exit1["work"]
    assert not lost.exact and "between" in lost.steps_text(), lost


def test_every_view_gives_the_same_lost_work(project: Project) -> None:
    """One record, every view, one figure: the verdict, run.json, the ledger, ``show``, the
    HTML report, the board's run page and ``diff`` all print record/lost.py's text."""
    record, _ = _sparse_run(project)
    state = json.loads((record.path / "run.json").read_text())
    text = state["work"]["lost"]
    assert text.startswith("between "), text
    verdict = json.loads((record.path / "verdict.json").read_text())
    (failures,) = [c for c in verdict["checks"] if c["name"] == "failures"]
    assert f"lost {text}" in failures["evidence"], failures
    ledger = build_ledger(record)
    assert ledger["lost"]["lost"] == text, ledger["lost"]
    assert f"lost     {text}" in format_show(record)
    steps = text.split(",")[0]  # the report's attempt row: "lost <steps> (<time>)"
    report = html.unescape(render_html(report_data(record)))
    assert f"lost {steps}" in report and f"lost {text}" in report
    page = html.unescape(run_page(Board.for_workspaces([Workspace(project.workspace)]), 0,
                                  record, None))  # fmt: skip
    assert f"lost {text}" in page
    diff = format_run_diff(diff_runs(record, record))
    assert f"lost     run {record.run_id}: {text}" in diff, diff


def test_a_black_box_without_progress_loses_an_unknown_number_of_steps(
    project: Project, tmp_path: Path
) -> None:
    """No progress read from the script: its steps lost are unknown, never "0 steps"."""
    spec = project.spec(
        """
        import os, signal
        if os.environ["ACCEPTRUN_ATTEMPT"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        """,
        extra='[limits]\nrestart_backoff = "0s"\n',
    )
    proc = project.cli("run", "-q", str(spec), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = project.only_record()
    state = json.loads((record.path / "run.json").read_text())
    assert state["work"]["lost"].startswith("an unknown number of steps"), state["work"]
    verdict = json.loads((record.path / "verdict.json").read_text())
    (failures,) = [c for c in verdict["checks"] if c["name"] == "failures"]
    assert "lost an unknown number of steps" in failures["evidence"], failures
    assert "lost 0 steps" not in format_show(record)
