"""Failure classification's rules without a child process: stop causes, retry limits of the
OOM classes, the cgroup's OOM-kill count, the stderr tail's whole lines, a resumed script
failing before its first step (real exits: tests/integration/test_classify.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun.supervisor.classify import (
    CLASSES,
    RETRY_LIMITS,
    AttemptFacts,
    FailedAttempt,
    classify,
    oom_kill_count,
    repeated_failure,
    retry_allowed,
    stderr_tail,
)

# ---- the supervisor ended the attempt -----------------------------------------------------


def test_an_unknown_stop_cause_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown stop cause 'stopped'"):
        classify(AttemptFacts(None, "SIGTERM", "stopped", "", []))


# ---- helpers ------------------------------------------------------------------------------


def test_retry_limits_cap_oom_classes_only() -> None:
    assert {k: v for k, v in RETRY_LIMITS.items() if v is not None} == {
        "cuda_oom": 1,
        "host_oom": 1,
    }
    assert set(RETRY_LIMITS) == set(CLASSES)
    assert retry_allowed("host_oom", 0) and not retry_allowed("host_oom", 1)
    assert retry_allowed("failed", 50) and retry_allowed("preempted", 3)
    assert not retry_allowed("user_error", 0) and not retry_allowed("success", 0)
    with pytest.raises(ValueError, match="unknown failure class 'oom'"):
        retry_allowed("oom", 0)


def test_oom_kill_count_reads_the_cgroup_or_says_unknown() -> None:
    count = oom_kill_count()
    assert count is None or (isinstance(count, int) and count >= 0)


def test_stderr_tail_keeps_whole_lines_of_the_end(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    log.write_bytes(b"x" * 70_000 + b"\n" + "é".encode() * 100 + b"\nValueError: last\n")
    tail = stderr_tail(log, limit=1000)
    assert tail.endswith("ValueError: last\n") and "x" not in tail
    assert len(tail.encode()) <= 1000
    assert stderr_tail(tmp_path / "missing.log") == ""
    log.write_bytes(b"bad \xff byte\n")
    assert stderr_tail(log) == "bad \ufffd byte\n"


def test_a_resumed_script_failing_before_its_first_step_names_no_step() -> None:
    """Two attempts resumed from step 46 that both failed before logging a step: the
    reason says "before the first step", never "in step 47" (their resume point + 1)."""
    tail = (
        "Traceback (most recent call last):\n"
        '  File "/w/train.py", line 3, in <module>\n'
        "    raise RuntimeError('bad config')\n"
        "RuntimeError: bad config\n"
    )
    first, second = (FailedAttempt(a, tail, step=47, stepped=False) for a in (2, 3))
    found = repeated_failure(first, second)
    assert found is not None and found.name == "user_error"
    assert "before the first step" in found.reason and "step 47" not in found.reason
    stepped = repeated_failure(first, FailedAttempt(3, tail, step=47, stepped=True))
    assert stepped is not None and "in step 47" in stepped.reason
