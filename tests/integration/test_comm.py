"""acceptrun bench comm: all-reduce bandwidth with real gloo processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_comm_bench_with_two_gloo_processes(tmp_path: Path) -> None:
    out = tmp_path / "comm.json"
    cmd = [sys.executable, "-m", "acceptrun", "bench", "comm", "--backend", "gloo", "--procs", "2",
           "--sizes", "4KiB,1MiB", "--buckets", "1,25", "--iters", "3", "--warmup", "1",
           "--ddp-steps", "2", "--timeout", "300", "--out", str(out)]  # fmt: skip
    scratch = tmp_path / "tmp"  # its workers' folder goes here, and away once it succeeded
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert not list(scratch.glob("acceptrun-comm-*"))
    assert "busbw GB/s" in proc.stdout and "scaling" in proc.stdout
    result = json.loads(out.read_text())
    assert (result["backend"], result["procs"], result["device"]) == ("gloo", 2, "cpu")
    assert [r["bytes"] for r in result["allreduce"]] == [4096, 1 << 20]
    for row in result["allreduce"]:
        assert row["time_s"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert [r["bucket_cap_mb"] for r in result["buckets"]] == [1.0, 25.0]
    assert all(r["step_s"] > 0 and r["samples_per_s"] > 0 for r in result["buckets"])
    assert [r["procs"] for r in result["scaling"]] == [1, 2]
    assert result["scaling"][0]["efficiency"] == 1.0
    one, two = result["scaling"]
    assert two["efficiency"] == pytest.approx(two["samples_per_s"] / (2 * one["samples_per_s"]))


def test_nccl_without_gpus_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "bench", "comm", "--backend", "nccl", "--procs", "64"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "nccl needs one per process" in proc.stderr
