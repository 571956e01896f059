"""acceptrun bench comm's figures: bus bandwidth by nccl-tests' definition, the note over
100 percent (real gloo processes: tests/integration/test_comm.py)."""

from __future__ import annotations

import pytest

from acceptrun.tune.comm import busbw


def test_busbw_is_nccl_tests_definition() -> None:
    # busbw = algbw * 2(n-1)/n: equal to algbw on 2 ranks, 1.5x on 4, 0 on 1
    assert busbw(10.0, 2) == 10.0
    assert busbw(10.0, 4) == 15.0
    assert busbw(10.0, 1) == 0.0
    assert busbw(8.0, 8) == pytest.approx(14.0)


def test_the_over_100_percent_note_follows_the_scaling_table() -> None:
    from acceptrun.tune.comm import format_comm

    result = {
        "procs": 2, "backend": "gloo", "device": "cpu", "definition": "nccl-tests",
        "allreduce": [{"bytes": 1024, "time_s": 1e-4, "algbw_gbps": 0.01, "busbw_gbps": 0.01}],
        "model": "mlp", "buckets": [{"bucket_cap_mb": 25, "step_s": 0.01, "samples_per_s": 100.0}],
        "scaling": [
            {"procs": 1, "step_s": 0.01, "samples_per_s": 100.0, "efficiency": 1.0},
            {"procs": 2, "step_s": 0.01, "samples_per_s": 230.0, "efficiency": 1.15},
        ],
    }  # fmt: skip
    lines = format_comm(result).splitlines()
    row = next(i for i, line in enumerate(lines) if "115.0%" in line)
    note = next(i for i, line in enumerate(lines) if "above 100% is no real speed-up" in line)
    assert note == row + 1 == len(lines) - 1
    result["scaling"][1]["efficiency"] = 0.9
    assert "above 100%" not in format_comm(result)
