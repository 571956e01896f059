"""The restore drill's recovery time is never shorter than the gap it contains (the drill
of real watched runs: tests/integration/test_watched_drill.py)."""

from __future__ import annotations

import json
from pathlib import Path

from acceptrun.record.workspace import RunRecord


def test_recovery_is_never_shorter_than_the_gap_it_contains(tmp_path: Path) -> None:
    """A resumed attempt that starts faster than the reference did is noise, not negative time.

    Before: exit at 10.0, next start 10.1, its first step 10.3 (0.2 s start-up) against a
    0.5 s reference start-up gave 10.3 - 10.0 - 0.5 = -0.2 s.
    """
    from acceptrun.run.drills.operations import measure_restarts

    record = RunRecord(tmp_path / "run")
    record.path.mkdir()
    events = [
        {"t": 9.0, "kind": "attempt_start", "attempt": 1, "resume_step": None},
        {"t": 9.5, "kind": "step", "attempt": 1, "step": 0},
        {"t": 9.8, "kind": "step", "attempt": 1, "step": 1},
        {"t": 9.9, "kind": "fault_injected", "attempt": 1, "action": "kill", "step": 1},
        {"t": 10.0, "kind": "attempt_exit", "attempt": 1, "reason": "killed by SIGKILL"},
        {"t": 10.1, "kind": "attempt_start", "attempt": 2, "resume_step": 0},
        {"t": 10.3, "kind": "step", "attempt": 2, "step": 1},
        {"t": 10.4, "kind": "attempt_exit", "attempt": 2, "reason": "exited 0"},
    ]
    record.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    (slow,) = measure_restarts(record, startup_s=0.5)
    assert slow.gap_s == 0.1 and slow.next_startup_s == 0.2
    assert slow.recovery_s == 0.1  # the gap, no start-up beyond the reference's
    assert slow.death_to_step_s == 0.2  # fault to the next start
    (fast,) = measure_restarts(record, startup_s=0.05)
    assert fast.recovery_s == 0.25  # 0.1 s gap + 0.15 s start-up beyond the reference's
