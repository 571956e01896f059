"""GPU telemetry check: NVML samples of a real CUDA workload under `acceptrun run`.

    PYTHONPATH=src python bench/gpu_check_telemetry.py OUTDIR

On a machine with an NVIDIA GPU (and torch with CUDA, nvidia-ml-py), runs a short
workload under ``acceptrun run`` with 1 s sampling and the Prometheus endpoint on a free
port: about 10 s of matmuls, then a wait with the GPU idle and a CPU thread busy
(limits.idle_window = 15s). It checks that

- the ``gpu`` lines are plausible: utilization > 0 during the matmuls, 0 < memory used
  <= total, 0 < power <= 1.2 x limit, temperature 10..110 C, SM and memory clocks > 0;
- the endpoint served ``acceptrun_gpu_utilization_percent{gpu="0"}`` during the run;
- the GPU's idleness (not the busy CPU) stopped the run: an ``idle`` event with
  source "gpu" and the attempt's class ``idle``.

It writes ``telemetry_check.json`` (figures and every check) into OUTDIR and exits 1 with
the failed checks named; prints "no NVIDIA GPU" and exits 0 where there is none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = """
import time, torch, acceptrun
run = acceptrun.init()
x = torch.randn(4096, 4096, device="cuda")
model = torch.nn.Linear(4096, 4096).cuda()
start = run.restore(model=model)
t_busy = time.monotonic() + 10.0
for step in run.steps(start, 100000):
    if time.monotonic() < t_busy:
        for _ in range(20):
            y = x @ x
        torch.cuda.synchronize()  # a CPU-GPU sync point: the step time is real
        run.log(step, loss=float(y[0, 0].item() * 0))
    else:
        # Idle GPU, but a busy CPU thread: the GPU must decide, not the process's CPU.
        end = time.monotonic() + 0.2
        while time.monotonic() < end and not run.stop_requested:
            pass
        if run.stop_requested:
            run.log(step)
"""


def gpu_count() -> tuple[int, str]:
    """(number of NVIDIA GPUs NVML sees, why none)."""
    try:
        import pynvml
    except ImportError as exc:
        return 0, f"nvidia-ml-py is not installed ({exc})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"NVML: {exc}"
    try:
        return int(pynvml.nvmlDeviceGetCount()), "NVML reports 0 GPUs"
    finally:
        pynvml.nvmlShutdown()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def analyze(run_dir: Path, scraped: str | None, elapsed: float) -> dict[str, Any]:
    """The figures of a finished check run and every check (in ``"checks"``)."""
    lines = read_jsonl(run_dir / "telemetry.jsonl")
    events = read_jsonl(run_dir / "events.jsonl")
    exit_path = run_dir / "attempts" / "1" / "exit.json"
    exit_json = json.loads(exit_path.read_text()) if exit_path.exists() else {}
    gpus = [x for x in lines if x.get("kind") == "gpu" and x.get("index") == 0]
    steps = [e for e in events if e.get("kind") == "step"]
    first_t = steps[0]["t"] if steps else float("inf")
    busy_end = first_t + 8.0  # inside the 10 s of matmuls
    busy = [g for g in gpus if first_t <= g["t"] <= busy_end]
    idle = [e for e in events if e.get("kind") == "idle"]

    def num(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool)

    checks: dict[str, bool] = {
        "gpu samples written (>= 5)": len(gpus) >= 5,
        "no gpu_absent line": not [x for x in lines if x.get("kind") == "gpu_absent"],
        "utilization > 0 during the matmuls": any(
            num(g["util_pct"]) and g["util_pct"] > 0 for g in busy
        ),
        "0 < memory used <= total": bool(gpus)
        and all(num(g["mem_used"]) and 0 < g["mem_used"] <= g["mem_total"] for g in gpus),
        "0 < power <= 1.2 x limit": bool(gpus)
        and all(
            num(g["power_w"]) and 0 < g["power_w"] <= 1.2 * (g["power_limit_w"] or 1e9)
            for g in gpus
        ),
        "temperature 10..110 C": bool(gpus)
        and all(num(g["temp_c"]) and 10 <= g["temp_c"] <= 110 for g in gpus),
        "SM and memory clocks > 0": bool(gpus)
        and all(
            num(g["sm_clock_mhz"])
            and g["sm_clock_mhz"] > 0
            and num(g["mem_clock_mhz"])
            and g["mem_clock_mhz"] > 0
            for g in gpus
        ),
        "clock_events is a list of names": bool(gpus)
        and all(isinstance(g["clock_events"], list) for g in gpus),
        'prometheus served gpu="0" metrics': scraped is not None
        and 'acceptrun_gpu_utilization_percent{gpu="0"}' in scraped,
        "idle event from the GPU": bool(idle) and idle[0].get("source") == "gpu",
        "attempt stopped for idleness": exit_json.get("class") == "idle",
    }
    errors = [x for x in lines if x.get("kind") == "sampler_error"]
    summary = {
        "gpu": gpus[0]["name"] if gpus else None,
        "seconds": round(elapsed, 1),
        "gpu_samples": len(gpus),
        "busy_samples": len(busy),
        "util_max": max((g["util_pct"] or 0 for g in gpus), default=None),
        "sm_active_max": max((g.get("sm_active_pct") or 0 for g in gpus), default=None),
        "sm_active_reported": any(num(g.get("sm_active_pct")) for g in gpus),
        "mem_used_max": max((g["mem_used"] or 0 for g in gpus), default=None),
        "power_max_w": max((g["power_w"] or 0 for g in gpus), default=None),
        "power_limit_w": gpus[-1]["power_limit_w"] if gpus else None,
        "temp_max_c": max((g["temp_c"] or 0 for g in gpus), default=None),
        "clock_events_seen": sorted({n for g in gpus for n in (g["clock_events"] or [])}),
        "ecc_uncorrected": gpus[-1]["ecc_uncorrected"] if gpus else None,
        "workload_pid_in_procs": any(
            str(e.get("pid")) in (g.get("procs") or {})
            for e in events
            if e.get("kind") == "attempt_start"
            for g in gpus
        ),
        "idle_event": idle[0] if idle else None,
        "exit": {k: exit_json.get(k) for k in ("outcome", "class", "reason", "returncode")},
        "sampler_errors": [e["error"] for e in errors],
        "checks": checks,
        "sample": gpus[len(busy) // 2] if gpus else None,
    }
    return summary


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: bench/gpu_check_telemetry.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    count, why = gpu_count()
    if count == 0:
        try:
            import torch

            if torch.cuda.is_available():
                print(f"CUDA is available but NVML is not: {why}", file=sys.stderr)
                return 1
        except ImportError:
            pass
        print(f"no NVIDIA GPU ({why}); nothing to check")
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="acceptrun-gpu-telemetry-"))
    (tmp / "train.py").write_text(textwrap.dedent(WORKLOAD))
    (tmp / "spec.toml").write_text(
        f'name = "gpu-telemetry"\ncommand = ["{sys.executable}", "train.py"]\n'
        '[resources]\ngpus = 1\n[limits]\nidle_window = "15s"\ngrace_period = "20s"\n'
        '[telemetry]\ninterval = "1s"\nidle_threshold = 5\n'
    )
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0")
    ws = tmp / "ws"
    cmd = [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "--prometheus-port", "0", "spec.toml"], cwd=tmp, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    scraped: str | None = None
    deadline = t0 + 240
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if scraped is not None:
            continue
        runs = sorted((ws / "runs").glob("2*")) if (ws / "runs").is_dir() else []
        events = read_jsonl(runs[-1] / "events.jsonl") if runs else []
        urls = [e["url"] for e in events if e.get("kind") == "prometheus"]
        steps = sum(1 for e in events if e.get("kind") == "step")
        if urls and steps >= 5:
            try:
                with urllib.request.urlopen(urls[0], timeout=5) as resp:
                    text = resp.read().decode()
                if "acceptrun_gpu_utilization_percent" in text:
                    scraped = text
            except OSError:
                pass
    if proc.poll() is None:
        proc.kill()
    log, _ = proc.communicate()
    (out / "telemetry_run.txt").write_text(log)
    runs = sorted((ws / "runs").glob("2*"))
    if not runs:
        print(f"FAILED: acceptrun run made no record; its output:\n{log[-3000:]}")
        return 1
    run_dir = runs[-1]
    summary = analyze(run_dir, scraped, time.monotonic() - t0)
    checks = summary["checks"]
    (out / "telemetry_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        print(f"FAILED: {'; '.join(failed)} (record: {run_dir})")
        return 1
    print(f"gpu telemetry check passed on {summary['gpu']} in {summary['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
