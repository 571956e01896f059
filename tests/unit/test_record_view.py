"""RecordView over records written file by file (tests/builders.py): what each reader derives."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.builders import T0, RecordBuilder

from acceptrun.errors import RecordError
from acceptrun.record.models import record_format
from acceptrun.record.view import RecordView, read_attempts, run_timeline, work_lost


def _restarted(tmp_path: Path) -> RecordBuilder:
    """Attempt 1 runs steps 1-5, checkpoints at 3, dies; attempt 2 resumes at 3, runs 4-8."""
    rb = RecordBuilder(tmp_path).run(status="finished")
    rb.attempt(
        outcome="signaled",
        steps=range(1, 4),
        loss=1.0,
        failure_class="killed",
        work={"steps_lost": 2, "seconds_lost": 2.5, "device_seconds_lost": 5.0},
    )
    rb.checkpoint(3)
    rb.event("step", dt=1.0, attempt=1, step=4, loss=0.5)
    rb.event("step", dt=1.0, attempt=1, step=5, loss=0.4)
    rb.attempt(outcome="success", steps=range(4, 9), loss=2.0, resume_step=3)
    rb.metric("eval/accuracy", 0.75).metric("eval/accuracy", 0.8)
    return rb


def test_attempts_are_the_exit_files_in_attempt_order(tmp_path: Path) -> None:
    record = _restarted(tmp_path).build()
    view = RecordView(record)
    attempts = view.attempts()
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert [a.get("class") or a["outcome"] for a in attempts] == ["killed", "success"]
    assert read_attempts(record) == attempts


def test_timeline_counts_steps_and_takes_launch_and_end_from_the_attempts(
    tmp_path: Path,
) -> None:
    record = _restarted(tmp_path).build()
    tl = RecordView(record).timeline()
    starts = [e["t"] for e in record.events("attempt_start")]
    exits = [e["t"] for e in record.events("attempt_exit")]
    steps = [e["t"] for e in record.events("step")]
    assert tl == {
        "launch": starts[0],
        "first_step": steps[0],
        "last_step": steps[-1],
        "end": exits[-1],
        "steps": 3 + 2 + 5,
    }
    assert run_timeline(record) == tl


def test_spans_group_steps_by_attempt_with_start_end_and_outcome(tmp_path: Path) -> None:
    view = RecordView(_restarted(tmp_path).build())
    one, two = view.spans()
    assert (one.number, one.outcome, two.number, two.outcome) == (1, "signaled", 2, "success")
    assert [s["step"] for s in one.steps] == [1, 2, 3, 4, 5]  # steps after its exit still count
    assert [s["step"] for s in two.steps] == [4, 5, 6, 7, 8]
    assert one.start == T0 + 1.0 and one.end is not None and one.end < two.start


def test_trajectory_keeps_each_step_from_the_last_attempt_that_logged_it(tmp_path: Path) -> None:
    traj = RecordView(_restarted(tmp_path).build()).trajectory()
    assert traj[2] == (0.5, 1)  # only attempt 1 logged step 2: 1.0 / 2
    assert traj[4] == (0.5, 2)  # attempt 2 redid step 4: 2.0 / 4
    assert sorted(traj) == list(range(1, 9))


def test_work_lost_sums_the_exit_files(tmp_path: Path) -> None:
    view = RecordView(_restarted(tmp_path).build())
    lost = view.work_lost()
    assert (lost["steps_lost"], lost["seconds_lost"], lost["device_seconds_lost"]) == (2, 2.5, 5.0)
    assert lost["steps_lost_range"] == [2, 2] and lost["lost"] == "2 steps, 2.5s (5.0 device-s)"
    # An exit record without a figure lost nothing it can count: exactly 0 (older records).
    summed = work_lost([{"work": {"steps_lost": 1.0}}, {"work": None}, {}])
    assert (summed["steps_lost"], summed["seconds_lost"], summed["device_seconds_lost"]) == (
        1,
        0.0,
        0.0,
    )


def test_checkpoints_metrics_and_last_outcome_come_from_the_events(tmp_path: Path) -> None:
    view = RecordView(_restarted(tmp_path).build())
    history = view.checkpoints()
    assert history.committed == [3] and history.last_committed == 3
    assert (history.deleted, history.quarantined, history.failed) == ([], [], 0)
    assert view.metrics() == {"eval/accuracy": 0.8}
    assert view.last_outcome() == "success"
    assert view.event_problems() == []


def test_last_sign_of_life_is_the_newest_event(tmp_path: Path) -> None:
    record = _restarted(tmp_path).build()
    newest = max(e["t"] for e in record.events())
    assert RecordView(record).last_sign_of_life() == pytest.approx(newest, abs=1e-3)


def test_an_empty_record_has_no_attempts_steps_or_times(tmp_path: Path) -> None:
    view = RecordView(RecordBuilder(tmp_path).run(status="running").build())
    assert view.attempts() == [] and view.spans() == [] and view.steps() == []
    assert view.timeline()["steps"] == 0 and view.timeline()["launch"] is None
    assert view.last_outcome() is None and view.verdict() is None and view.ledger() is None


def test_an_old_record_without_formats_still_reads(tmp_path: Path) -> None:
    rb = RecordBuilder(tmp_path).run(status="finished", format=None)
    rb.attempt(steps=range(1, 3)).verdict(accepted=True, format=None)
    exit_json = rb.build().read_json("attempts/1/exit.json")
    exit_json.pop("format")
    rb.write_json("attempts/1/exit.json", exit_json)
    view = RecordView(rb.build())
    assert view.state.format == 1 and view.state.status == "finished"
    (first,) = view.attempts()
    assert record_format(first, "exit.json") == 1 and first["outcome"] == "success"
    verdict = view.verdict()
    assert verdict is not None and verdict.accepted and verdict.format == 1


def test_an_exit_file_of_a_newer_format_raises_naming_it_and_the_fix(tmp_path: Path) -> None:
    rb = RecordBuilder(tmp_path).run().attempt(steps=range(1, 3), format=99)
    with pytest.raises(RecordError, match=r"attempts/1/exit.json has format 99.*upgrade acceptrun"):
        RecordView(rb.build()).attempts()


def test_a_known_event_missing_a_required_field_is_reported_not_raised(tmp_path: Path) -> None:
    rb = RecordBuilder(tmp_path).run().attempt(steps=range(1, 3))
    rb.event("step", dt=1.0, attempt=1)  # no step number
    rb.event("from_a_newer_acceptrun", dt=1.0, anything=1)
    view = RecordView(rb.build())
    (problem,) = view.event_problems()
    assert "step event" in problem and "lacks required field step" in problem
    assert view.timeline()["steps"] == 2  # a step without a number is reported, not counted


def test_show_names_events_that_lack_a_required_field(tmp_path: Path) -> None:
    from acceptrun.report.terminal import format_show

    rb = RecordBuilder(tmp_path).run().attempt(steps=range(1, 3))
    clean = format_show(rb.build())
    assert "events   " not in clean
    rb.event("attempt_exit", dt=1.0, attempt=2)  # no outcome
    assert "events   attempt_exit event at t=" in format_show(rb.build())
    assert "lacks required field outcome" in format_show(rb.build())
