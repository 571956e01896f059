"""What ``acceptrun resume`` finds about an attempt whose supervisor died of a full disk.

When the run directory's disk fills, the supervisor cannot write the attempt's exit.json
and dies; the resume's take-over (supervisor/lease.py) writes it. It must name the full
disk from what the disk let through: the stderr tail, the workload's end event, a failed
checkpoint, or the torn fragment at the end of events.jsonl (tests/integration/test_torn_log.py
makes the real one on a full tmpfs). Records built by hand here; no process is started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acceptrun._util.durable import append_jsonl
from acceptrun.record.workspace import RunRecord
from acceptrun.supervisor.lease import _disk_full_cause, unrecorded_work

START = {"t": 100.0, "kind": "attempt_start", "attempt": 1, "pid": 1}
STEP = {"t": 101.0, "kind": "step", "attempt": 1, "step": 3}


def _record(tmp_path: Path, events: list[dict[str, object]], tail: bytes = b"") -> RunRecord:
    record = RunRecord(tmp_path / "runs" / "r")
    (record.path / "attempts" / "1").mkdir(parents=True)
    with open(record.events_path, "wb") as f:
        f.write(b"".join(json.dumps(e).encode() + b"\n" for e in events) + tail)
    return record


@pytest.mark.parametrize(
    ("events", "tail", "stderr"),
    [
        pytest.param([START, STEP], b"", "Traceback (most recent call last):\n"
                     "OSError: [Errno 28] No space left on device\n", id="stderr-tail"),
        pytest.param([START, STEP, {"t": 102.0, "kind": "workload_end", "attempt": 1,
                      "status": "error: OSError: [Errno 28] No space left on device"}],
                     b"", "", id="workload-end-status"),
        pytest.param([START, {"t": 102.0, "kind": "checkpoint_failed", "attempt": 1,
                      "step": 4, "fault": "disk full", "directory": "/ckpt"}],
                     b"", "", id="checkpoint-failed"),
        pytest.param([START, STEP], b'{"t":103.0,"kind":"workload_end","attempt":1,"status":'
                     b'"error: OSError: [Errno 28] No space le', "", id="torn-last-line"),
    ],
)  # fmt: skip
def test_the_full_disk_is_found_where_it_left_a_trace(
    tmp_path: Path, events: list[dict[str, object]], tail: bytes, stderr: str
) -> None:
    record = _record(tmp_path, events, tail)
    (record.path / "attempts" / "1" / "stderr.log").write_text(stderr)
    found = _disk_full_cause(record, 1)
    assert found is not None and found.name == "disk_full", found
    assert any(s in e for e in found.evidence for s in ("Errno 28", "No space", "is full")), found


def test_a_torn_line_repaired_since_the_attempt_started_is_read(tmp_path: Path) -> None:
    torn = b'{"t":102.0,"kind":"attempt_exit","attempt":1,"evidence":["[Errno 28] No space le'
    record = _record(tmp_path, [START, STEP], torn)
    append_jsonl(record.events_path, {"t": 104.0, "kind": "audit", "action": "resume"})
    found = _disk_full_cause(record, 1)
    assert found is not None and found.name == "disk_full", found


def test_no_trace_of_a_full_disk_names_none(tmp_path: Path) -> None:
    # A supervisor killed with SIGKILL: the attempt stays "interrupted", no class guessed.
    record = _record(tmp_path, [START, STEP], b'{"t":102.0,"kind":"step","attempt":1,"st')
    (record.path / "attempts" / "1" / "stderr.log").write_text("epoch 1\nloss 0.3\n")
    assert _disk_full_cause(record, 1) is None


def test_an_earlier_attempts_full_disk_is_not_blamed(tmp_path: Path) -> None:
    earlier = {"t": 50.0, "kind": "workload_end", "attempt": 0,
               "status": "error: OSError: [Errno 28] No space left on device"}  # fmt: skip
    record = _record(tmp_path, [earlier, START, STEP])
    assert _disk_full_cause(record, 1) is None


def _steps(attempt: int, steps: range, t0: float) -> list[dict[str, object]]:
    return [
        {"t": t0 + i, "kind": "step", "attempt": attempt, "step": s} for i, s in enumerate(steps)
    ]


@pytest.mark.parametrize(
    ("commits", "lost", "since"),
    [
        pytest.param([(9, 110.0)], 4, 106.0, id="after-a-checkpoint-of-this-attempt"),
        pytest.param([(3, 50.0)], 10, 100.0, id="resumed-from-3: from the attempts start"),
        pytest.param([], 10, 100.0, id="no-checkpoint: every step of the attempt"),
        pytest.param([(9, 110.0), (12, 200.0)], 4, 106.0, id="a-commit-after-its-end-does-not-count"),
    ],
)  # fmt: skip
def test_the_work_of_an_unrecorded_attempt_is_counted_as_a_lower_bound(
    commits: list[tuple[int, float]], lost: int, since: float
) -> None:
    # Attempt 1 ran steps 4..13 at t=101..110 (step 9 at 106); its supervisor was last seen
    # at t=120. Lost time runs from the kept step's own step event (as for a seen end).
    events = [START, *_steps(1, range(4, 14), 101.0)]
    events += [{"t": t, "kind": "checkpoint_commit", "step": s} for s, t in commits]
    work = unrecorded_work(events, 1, 120.0, devices=4, nodes=2)
    assert work["lost_at_least"] is True
    assert (work["first_step"], work["last_step"], work["steps_done"]) == (4, 13, 10)
    assert work["steps_lost"] == lost, work
    assert work["seconds_lost"] == 120.0 - since
    assert work["device_seconds_lost"] == 4 * (120.0 - since)
    assert work["node_seconds_lost"] == 2 * (120.0 - since)


def test_an_attempt_with_no_step_loses_its_time_and_no_step() -> None:
    work = unrecorded_work([START], 1, 130.0)
    assert (work["steps_lost"], work["seconds_lost"], work["last_step"]) == (0, 30.0, None)
