"""summarize() and timelines() over records written as real files, and over a real restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import append_jsonl
from acceptrun.record.workspace import Workspace
from acceptrun.telemetry.peaks import match_gpu, peak_tflops
from acceptrun.telemetry.summary import BREAKDOWN_PARTS, summarize
from acceptrun.telemetry.timelines import timelines

GIB = 1 << 30


def make_record(
    root: Path,
    events: list[dict[str, Any]],
    samples: list[dict[str, Any]] = (),  # type: ignore[assignment]
    spec: str = 'name = "synth"\ncommand = ["true"]\n',
    provenance: dict[str, Any] | None = None,
) -> Path:
    """A run record on disk, written the way the writers write it (append per line)."""
    record = Workspace.create(root / ".acceptrun").create_run(
        "synth", spec_text=spec, state={"mode": "supervised", "status": "finished"}
    )
    for ev in events:
        append_jsonl(record.events_path, ev)
    for s in samples:
        append_jsonl(record.telemetry_path, s)
    if provenance is not None:
        record.write_json("provenance.json", provenance)
    return record.path


def steps(attempt: int, numbers: range, t0: float, **extra: float) -> list[dict[str, Any]]:
    """Step events one second apart (each step 1 s long) from t0 + 1."""
    return [
        {"t": t0 + 1 + i, "kind": "step", "attempt": attempt, "step": n, "step_time": 1.0, **extra}
        for i, n in enumerate(numbers)
    ]


def test_breakdown_parts_sum_to_the_wall_time_with_exact_figures(tmp_path: Path) -> None:
    events = [
        {"t": 1000.0, "kind": "run_start"},
        {"t": 1001.0, "kind": "attempt_start", "attempt": 1},
        *steps(1, range(10), 1003.0, data_wait=0.25, samples=32, loss=2.0),
        {"t": 1008.5, "kind": "checkpoint_stage", "attempt": 1, "step": 4, "stall_s": 0.5},
        {"t": 1009.0, "kind": "checkpoint_commit", "attempt": 1, "step": 4},
        {"t": 1014.0, "kind": "attempt_exit", "attempt": 1, "outcome": "success"},
        {"t": 1015.0, "kind": "verdict", "verdict": "accepted"},
    ]
    s = summarize(make_record(tmp_path, events))
    assert s.steps == 10
    assert s.wall_s == pytest.approx(15.0)
    assert s.first_step_s == pytest.approx(4.0)  # run_start -> the first step event
    assert s.breakdown == pytest.approx(
        {
            "compute": 7.0,  # 10 x (1.0 - 0.25) - 0.5 stall
            "data_wait": 2.5,
            "checkpoint_stall": 0.5,
            "before_first_step": 3.0,  # run_start -> the first step's start (t - step_time)
            "restarts": 0.0,
            "other": 2.0,
        }
    )
    assert sum(s.breakdown.values()) == pytest.approx(s.wall_s)
    assert s.data_wait_share == pytest.approx(0.25)
    assert s.step_time is not None and s.step_time["n"] == 7  # 3 warm-up steps left out
    assert s.step_time["p50"] == s.step_time["p99"] == 1.0
    assert s.throughput == pytest.approx({"samples/s": 32.0, "steps/s": 1.0})
    assert s.mfu is None and s.idle_share is None and s.gpus == [] and s.host is None
    assert any("data wait is 25% of step time" in h for h in s.hints)
    json.dumps(s.to_dict())  # JSON-able as it is


def test_restarts_count_backoff_redone_steps_and_the_lost_tail(tmp_path: Path) -> None:
    events = [
        {"t": 1000.0, "kind": "run_start"},
        {"t": 1001.0, "kind": "attempt_start", "attempt": 1},
        *steps(1, range(5), 1002.0),  # steps 0..4 end at 1003..1007
        {"t": 1009.0, "kind": "attempt_exit", "attempt": 1, "outcome": "signaled"},
        {"t": 1009.0, "kind": "restart", "attempt": 2, "after": "signaled", "backoff_s": 2},
        {"t": 1011.0, "kind": "attempt_start", "attempt": 2, "resume_step": 2},
        *steps(2, range(3, 10), 1012.0),  # steps 3 and 4 run again
        {"t": 1020.0, "kind": "attempt_exit", "attempt": 2, "outcome": "success"},
    ]
    s = summarize(make_record(tmp_path, events))
    # backoff 2 s + steps 3 and 4 of attempt 1 (2 s) + attempt 1 after its last step (2 s)
    assert s.breakdown["restarts"] == pytest.approx(6.0)
    assert s.breakdown["before_first_step"] == pytest.approx(2.0 + 1.0)
    assert s.breakdown["compute"] == pytest.approx(3.0 + 7.0)
    assert sum(s.breakdown.values()) == pytest.approx(s.wall_s)
    assert any(h.startswith("restarts cost 6.0s (1 restart, 2 steps redone)") for h in s.hints)
    marks = timelines(make_record(tmp_path / "again", events))["marks"]
    assert [m["kind"] for m in marks] == [
        "attempt_start",
        "attempt_exit",
        "restart",
        "attempt_start",
        "attempt_exit",
    ]


def test_gpu_and_host_samples_give_figures_mfu_and_hints(tmp_path: Path) -> None:
    events = [
        {"t": 1000.0, "kind": "run_start"},
        {"t": 1000.0, "kind": "attempt_start", "attempt": 1},
        *steps(1, range(20), 1000.0, tokens=1000.0),
        {"t": 1021.0, "kind": "attempt_exit", "attempt": 1, "outcome": "success"},
    ]
    samples: list[dict[str, Any]] = []
    for i in range(10):
        samples.append(
            {
                "t": 1001.0 + 2 * i, "kind": "gpu", "attempt": 1, "index": 0,
                "name": "NVIDIA A100-SXM4-80GB", "util_pct": 2.0 if i < 3 else 90.0,
                "mem_used": 30 * GIB if i else 10 * GIB, "mem_total": 80 * GIB,
                "temp_c": 60 + i, "clock_events": ["sw_power_cap"] if i < 4 else [],
                "ecc_uncorrected": 0, "power_w": 300.0, "sm_active_pct": None,
            }
        )  # fmt: skip
        samples.append(
            {
                "t": 1001.0 + 2 * i, "kind": "host", "attempt": 1, "cpu_pct": 50.0,
                "proc_cpu_pct": 100.0, "proc_rss": (1 + i) * GIB, "mem_used": 8 * GIB,
                "mem_total": 64 * GIB, "free_run_dir": 100 * GIB - i, "free_ckpt_dir": 50 * GIB,
            }
        )  # fmt: skip
    spec = (
        'name = "synth"\ncommand = ["true"]\n[resources]\ngpus = 1\n'
        "[telemetry]\nflops_per_token = 1.56e10\n"
    )
    s = summarize(make_record(tmp_path, events, samples, spec=spec))
    (gpu,) = s.gpus
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB" and gpu["samples"] == 10
    assert gpu["util_mean"] == pytest.approx((3 * 2 + 7 * 90) / 10)
    assert gpu["mem_peak"] == 30 * GIB and gpu["mem_total"] == 80 * GIB
    assert gpu["power_capped_share"] == pytest.approx(0.4)
    assert gpu["throttled_share"] == 0 and gpu["temp_max"] == 69 and gpu["ecc_uncorrected"] == 0
    assert s.idle_share == pytest.approx(0.3)
    assert s.host is not None and s.host["proc_rss_peak"] == 10 * GIB
    assert s.host["free_min"] == 50 * GIB and s.host["cpu_mean"] == 50.0
    # 1000 tokens/s x 1.56e10 FLOPs per token on one A100 (312 TFLOP/s dense BF16)
    assert s.mfu == pytest.approx(1000 * 1.56e10 / 312e12)
    text = "\n".join(s.hints)
    assert "GPU 0 power-capped 40% of the time: check the power limit" in text
    assert "GPU 0 memory peak 38% of 80 GiB: a larger batch may raise throughput" in text
    assert "device idle 30% of the sampled time (GPU utilization below 5%)" in text
    assert "MFU is 5.0% of the peak" in text
    series = timelines(make_record(tmp_path / "t", events, samples, spec=spec))
    assert len(series["gpu"]) == 10 and len(series["host"]) == 10
    assert series["steps"][0]["throughput"] == pytest.approx(1.0)  # steps/s: no samples logged


def test_an_empty_record_gives_nones_not_exceptions(tmp_path: Path) -> None:
    s = summarize(make_record(tmp_path, []))
    assert s.steps == 0 and s.wall_s is None and s.first_step_s is None
    assert s.step_time is None and s.drift is None and s.throughput == {}
    assert s.mfu is None and s.data_wait_share is None and s.idle_share is None
    assert s.gpus == [] and s.host is None and s.hints == []
    assert set(s.breakdown) == set(BREAKDOWN_PARTS)
    assert timelines(tmp_path / "no-such-run") == {"steps": [], "host": [], "gpu": [], "marks": []}
    assert summarize(tmp_path / "no-such-run").steps == 0


def test_a_torn_telemetry_line_and_damaged_files_are_skipped(tmp_path: Path) -> None:
    events = [{"t": 1000.0, "kind": "run_start"}, *steps(1, range(3), 1000.0)]
    samples = [{"t": 1001.0, "kind": "host", "attempt": 1, "cpu_pct": 10.0, "proc_cpu_pct": 1.0}]
    run_dir = make_record(tmp_path, events, samples)
    with open(run_dir / "telemetry.jsonl", "ab") as f:
        f.write(b'{"t": 1002.0, "kind": "host", "cpu_p')  # a writer killed mid-line
    with open(run_dir / "events.jsonl", "ab") as f:
        f.write(b'{"t": 1003.0, "kind": "st')
    (run_dir / "spec.toml").write_text("name = [broken")
    (run_dir / "provenance.json").write_text("{not json")
    s = summarize(run_dir)
    assert s.steps == 3 and s.wall_s == pytest.approx(3.0)
    assert s.host is not None and s.host["samples"] == 1
    assert s.idle_share == 1.0  # workload CPU 1% of a core, below the default 5%


def test_peak_table_matches_nvml_names() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert peak_tflops("NVIDIA A100-PCIE-40GB") == 312.0
    assert match_gpu("NVIDIA A10") is not None and match_gpu("NVIDIA A10").model == "A10"  # type: ignore[union-attr]
    assert peak_tflops("NVIDIA L40S") == 362.05 and peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA RTX 6000 Ada Generation") == 364.2
    assert peak_tflops("Quadro RTX 6000") is None and peak_tflops(None) is None
