"""What supervision costs a training loop: bare `python loop.py` against `acceptrun run`.

The same small CPU training loop (torch, one thread, a few ms per step) runs bare and
under ``acceptrun run`` with the client API (a step event per step) and 1 Hz host
sampling, interleaved (bare, supervised, bare, supervised, ...) so that a machine that
gets slower or faster over time weighs on both sides alike. The loop times its own
iterations (perf_counter, iteration to iteration, so the client's work per step counts).

Prints one JSON line and one readable line:

- ratio: median step time supervised / bare (target <= 1.01);
- supervisor_cpu_pct: the supervisor process's own CPU (user + system, psutil, children
  excluded) over the time its workload ran, in % of one core (target: well under 1%);
  supervisor_cpu_pct_total is the same over its whole life (imports, preflight, close).

    python bench/overhead.py [--pairs 8] [--steps 1500] [--interval 1]   (about 2.5 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

LOOP = """
import json, os, sys, time
import torch

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(128, 256)
steps = int(os.environ["BENCH_STEPS"])
supervised = bool(os.environ.get("ACCEPTRUN_RUN_DIR"))
if supervised:
    import acceptrun
    run = acceptrun.init()
    loop = run.steps(steps)
else:
    loop = range(steps)
times = []
last = time.perf_counter()
for step in loop:
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if supervised:
        run.log(step, loss=loss.item(), samples=128)
    else:
        loss.item()
    now = time.perf_counter()
    times.append(now - last)
    last = now
with open(os.environ["BENCH_OUT"], "w") as f:
    json.dump(times[20:], f)  # the first steps warm up allocators and caches
"""


def run_bare(work: Path, steps: int, out: Path) -> list[float]:
    env = {**os.environ, "BENCH_STEPS": str(steps), "BENCH_OUT": str(out)}
    env = {k: v for k, v in env.items() if not k.startswith("ACCEPTRUN_")}
    subprocess.run([sys.executable, "loop.py"], cwd=work, env=env, check=True)
    return list(json.loads(out.read_text()))


def run_supervised(work: Path, steps: int, out: Path) -> tuple[list[float], float, float]:
    """Step times, and the supervisor's CPU % of one core: while the workload ran, and total."""
    env = {**os.environ, "BENCH_STEPS": str(steps), "BENCH_OUT": str(out)}
    env = {k: v for k, v in env.items() if not k.startswith("ACCEPTRUN_")}
    cmd = [sys.executable, "-m", "acceptrun", "--workspace", str(work / "ws"), "run", "-q"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "spec.toml"], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    sup = psutil.Process(proc.pid)
    # (monotonic s, supervisor CPU s, workload running) every 0.2 s; the last sample
    # before the exit is the closest psutil can see (it cannot read a reaped process).
    samples: list[tuple[float, float, bool]] = []
    while proc.poll() is None:
        try:
            with sup.oneshot():
                t = sup.cpu_times()
                kids = sup.children()
        except psutil.Error:
            break
        samples.append((time.monotonic(), t.user + t.system, bool(kids)))
        time.sleep(0.2)
    _, err = proc.communicate()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"acceptrun run failed ({proc.returncode}): {err.decode()[-2000:]}")
    busy = [s for s in samples if s[2]]
    steady = float("nan")
    if len(busy) >= 2:
        steady = 100 * (busy[-1][1] - busy[0][1]) / (busy[-1][0] - busy[0][0])
    total = 100 * samples[-1][1] / (samples[-1][0] - t0) if samples else float("nan")
    if not out.exists():  # the workload never wrote its timings: say why, no traceback
        raise SystemExit(
            f"the supervised run (exit {proc.returncode}) wrote no step times to {out}: "
            f"{err.decode()[-2000:]}"
        )
    return list(json.loads(out.read_text())), steady, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8, help="bare/supervised pairs (at least 3)")
    p.add_argument("--steps", type=int, default=1500, help="steps per run")
    p.add_argument("--interval", type=float, default=1.0, help="telemetry.interval, seconds")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="acceptrun-overhead-") as tmp:
        work = Path(tmp)
        (work / "loop.py").write_text(textwrap.dedent(LOOP))
        (work / "spec.toml").write_text(
            f'name = "overhead"\ncommand = ["{sys.executable}", "loop.py"]\n'
            f'[telemetry]\ninterval = "{args.interval}s"\n'
        )
        bare: list[list[float]] = []
        sup: list[list[float]] = []
        cpu_steady: list[float] = []
        cpu_total: list[float] = []
        for i in range(max(args.pairs, 1)):
            bare.append(run_bare(work, args.steps, work / f"bare-{i}.json"))
            times, steady, total = run_supervised(work, args.steps, work / f"sup-{i}.json")
            sup.append(times)
            cpu_steady.append(steady)
            cpu_total.append(total)
    pair_ratios = [
        statistics.median(s) / statistics.median(b) for b, s in zip(bare, sup, strict=True)
    ]
    bare_ms = 1000 * statistics.median([t for run in bare for t in run])
    sup_ms = 1000 * statistics.median([t for run in sup for t in run])
    result = {
        "bench": "overhead",
        "pairs": len(bare),
        "steps": args.steps,
        "interval_s": args.interval,
        "bare_median_ms": round(bare_ms, 4),
        "supervised_median_ms": round(sup_ms, 4),
        "ratio": round(sup_ms / bare_ms, 4),
        "pair_ratios": [round(r, 4) for r in pair_ratios],
        "supervisor_cpu_pct": round(statistics.median(cpu_steady), 3),
        "supervisor_cpu_pct_runs": [round(c, 3) for c in cpu_steady],
        "supervisor_cpu_pct_total": round(statistics.median(cpu_total), 3),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    print(
        f"step time: bare {bare_ms:.3f} ms, supervised {sup_ms:.3f} ms, ratio "
        f"{result['ratio']:.4f} (target <= 1.01; per pair {result['pair_ratios']}); "
        f"supervisor CPU {result['supervisor_cpu_pct']:.2f}% of one core while the workload "
        f"ran ({result['supervisor_cpu_pct_total']:.1f}% over its whole life, start-up included)"
    )


if __name__ == "__main__":
    main()
