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
from acceptrun.supervisor.lease import _disk_full_cause

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
