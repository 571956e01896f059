"""A value from a user or a workload in a Rich table is shown as typed, never read as markup.

``acceptrun queue``, ``top`` and ``tune``'s table draw with Rich, whose markup would make
``[link=...]`` a hyperlink, ``[bold]`` a style and a stray ``[/]`` a MarkupError traceback.
Every hostile string below goes in a job's name and note, a run's name and throughput
unit, a trial's label and error; each must come out as it went in.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from acceptrun._util.console import rich_cell
from acceptrun.cli.main import main
from acceptrun.queue.submit import queue_db
from acceptrun.record.workspace import find_workspace
from acceptrun.report.top import format_rows
from acceptrun.tune.report import TuneReport, format_table
from campaign import tally

MARKUP = [
    "[bold]loud[/bold]",
    "[link=https://evil.example/x]click[/link]",
    "closing [/] alone",
    "[/bold] no opening",
    "[red on white]x",
    ":warning: emoji",
    "[[escaped]]",
]


def _drawn(renderable: Any) -> str:
    out = io.StringIO()
    # As on a terminal: colours and links on, wide enough never to wrap.
    Console(file=out, width=400, force_terminal=True, color_system="truecolor").print(renderable)
    return out.getvalue()


def test_a_cell_is_text_as_typed_with_its_controls_escaped() -> None:
    for value in MARKUP:
        assert rich_cell(value).plain == value
    assert rich_cell("a\x1b]8;;https://x\x07b").plain == "a\\x1b]8;;https://x\\x07b"


def test_a_job_s_name_and_note_in_the_queue_table_are_shown_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = find_workspace(tmp_path / "ws", create=True)
    db = queue_db(ws)
    try:
        for name in MARKUP:
            job = db.submit(name=name, spec_path="/p/spec.toml", spec_text="", spec_hash="h",
                            priority=0, kind="cpu", slots=1, expected_s=None)  # fmt: skip
            db.conn.execute("UPDATE jobs SET note=? WHERE id=?", (f"note {name}", job))
    finally:
        db.close()
    rc = main(["--workspace", str(tmp_path / "ws"), "queue"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, err
    missing = [n for n in MARKUP if n not in out or f"note {n}" not in out]
    tally("rich tables", tried=2 * len(MARKUP), tracebacks=int("Traceback" in err))
    assert not missing, out


def _top_row(name: str) -> dict[str, Any]:
    return {
        "run_id": f"20261207-000000-{len(name)}", "name": name, "step": 5, "total_steps": 10,
        "throughput": 1.5, "throughput_unit": name, "attempt": 1, "restarts": 0,
        "cost_usd": None, "eta_s": 5.0, "status": "running", "elapsed_s": 5.0, "gpus": [],
        "proc_cpu_pct": None, "proc_rss": None,
    }  # fmt: skip


def test_a_run_s_name_and_unit_in_top_are_shown_as_typed() -> None:
    drawn = _drawn(format_rows([_top_row(name) for name in MARKUP]))
    missing = [n for n in MARKUP if n not in drawn]
    assert "\x1b]8;" not in drawn  # no hyperlink was made
    tally("rich tables", tried=len(MARKUP))
    assert not missing, drawn


def test_a_trial_s_label_and_error_in_tune_s_table_are_shown_as_typed() -> None:
    trials = [
        {"id": i, "ok": False, "axis": "batch", "label": name, "error": f"failed {name}"}
        for i, name in enumerate(MARKUP)
    ]
    report = TuneReport(target="t:target", name="t", device={"device": "cpu"}, options={},
                        trials=trials, baseline=0, best=None)  # fmt: skip
    text = format_table(report, width=400)
    missing = [n for n in MARKUP if n not in text or f"failed {n}"[:90] not in text]
    tally("rich tables", tried=2 * len(MARKUP))
    assert not missing, text
