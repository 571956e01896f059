"""Close computes the telemetry summary once: the verdict judges it, summary.json keeps it.

A recorded run (tests/builders.py) is closed in this process with the summary's real
compute function counted (a module attribute swapped for a wrapper that calls it): once
per close; then ``show`` and ``report`` of the closed run read summary.json and compute
it zero times.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.builders import RecordBuilder
from tests.conftest import run_main

import acceptrun.telemetry.summary as summary_module
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.run.close import close_run
from acceptrun.telemetry.summary import SUMMARY_FILE, load_summary, pending_summary


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The run directories the summary was computed for, one entry per computation."""
    seen: list[Path] = []
    real: Callable[..., Any] = summary_module._summarize

    def counted(rec: Any, **kwargs: Any) -> Any:
        seen.append(rec.log.path)
        return real(rec, **kwargs)

    monkeypatch.setattr(summary_module, "_summarize", counted)
    return seen


def _recorded_run(root: Path) -> RunRecord:
    """A supervised run that ran 40 steps and has not closed yet."""
    return (
        RecordBuilder(root)
        .run(status="running", mode="run")
        .attempt(steps=range(1, 41), step_time=0.5, loss=2.0)
        .build()
    )


def test_close_computes_the_summary_once_and_show_and_report_read_it(
    tmp_path: Path, computed: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / ".acceptrun"
    record = _recorded_run(root)
    verdict = close_run(record, Workspace.create(root))
    assert computed == [record.path]

    stored = load_summary(record.path)
    assert stored.stored and stored.summary.steps == 40
    assert stored.summary.throughput["steps/s"] == pytest.approx(2.0)
    first_step = next(c for c in verdict.checks if c.name == "first step")
    assert f"{stored.summary.first_step_s:.1f}" in first_step.evidence  # the one it judged
    kinds = [json.loads(line)["kind"] for line in record.events_path.read_text().splitlines()]
    assert kinds[-1] == "verdict"  # written after summary.json was computed, still current

    computed.clear()
    ws = str(root)
    code, out, err = run_main(capsys, "--workspace", ws, "show", record.run_id)
    assert record.run_id in out and "Traceback" not in err, err
    code, out, err = run_main(capsys, "--workspace", ws, "show", "--json", record.run_id)
    assert '"steps": 40' in out, err
    code, out, err = run_main(capsys, "--workspace", ws, "report", record.run_id)
    assert code == 0, err
    code, out, err = run_main(capsys, "--workspace", ws, "report", "--format", "md", record.run_id)
    assert code == 0, err
    assert computed == []


def test_a_step_written_after_the_summary_was_computed_leaves_it_stale(
    tmp_path: Path, computed: list[Path]
) -> None:
    record = _recorded_run(tmp_path / ".acceptrun")
    record.update_state(status="finished")
    pending = pending_summary(record.path)
    record.event("step", attempt=1, step=41, step_time=0.5)
    record.flush_events()
    pending.write()
    assert (record.path / SUMMARY_FILE).exists()
    fresh = load_summary(record.path)  # the stored one counts 40 steps: computed again
    assert not fresh.stored and fresh.summary.steps == 41
    assert len(computed) == 2


def test_events_after_the_summary_was_computed_keep_it_current(
    tmp_path: Path, computed: list[Path]
) -> None:
    record = _recorded_run(tmp_path / ".acceptrun")
    record.update_state(status="finished")
    pending = pending_summary(record.path)
    record.event("verdict", sync=True, verdict="accepted")  # close's own, after the verdict
    pending.write()
    stored = load_summary(record.path)
    assert stored.stored and stored.summary == pending.summary
    assert len(computed) == 1
