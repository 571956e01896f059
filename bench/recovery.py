"""How fast the supervisor recovers, how little it costs while waiting, what a preemption loses.

    python bench/recovery.py

prints one JSON line, for example
``{"recovery_s": 0.21, "recovery_target_s": 1.0, "idle_cpu_pct": 0.12, ...,
"preempt_lost_steps": 0}``:

- ``recovery_s``: median over 4 injected SIGKILLs (``kill@step=N``; ``--kills N``: 1 to
  4) of the time from the child's death (its ``fault_injected`` event, synced just
  before the signal) to the resumed child's first step, minus the workload's own
  start-up time (attempt start to first step of an uninterrupted run of the same
  workload). What is left is the supervisor's part (noticing the exit, verifying the
  checkpoint, starting the next attempt) plus the restore. Target: 1 s or less.
  ``recovery_from_exit_s`` starts the clock at the ``attempt_exit`` event instead, as
  ``acceptrun drill`` does. Both are the measured gap to the next attempt's start plus
  its start-up beyond the reference's (none when it started faster: start-up varies by
  about 0.1 s, and a faster start is noise, not negative time); ``supervisor_s`` (death
  to the next attempt's start) and ``restore_s`` are the same part measured directly.
- ``idle_cpu_pct``: CPU time of the supervisor process (its own threads, not the
  child's) while the workload sleeps for 10 s, as a percentage of one core. Target < 1%.
- ``preempt_lost_steps``: steps done again after a graceful preemption
  (``term@step=N``): the last step logged before it minus the step resumed from.
  Target 0.

The workload is a small torch model with checkpoints every 2 steps and no restart
backoff.

Then the three recovery modes, each under the same seeded Poisson kills (``--kills``
SIGKILLs, a mean of ``--mtbi`` seconds of training apart, drawn with ``--seed`` and
turned into the steps they land on), with the demo-sized model and a ``--state-mb`` state
(500 MiB by default) saved every ``--durable-every`` steps:

- ``cold``: today's restart: a new interpreter, the imports, the set-up, the restore from
  the disk store;
- ``memory``: the memory tier too (``[checkpoint] memory_every = --memory-every``): the
  restore reads the newest copy from host shared memory;
- ``warm``: the memory tier and ``limits.warm_restart``: the next attempt already waits in
  ``run.restore()`` (supervisor/standby.py).

Per mode: ``restart_p50_s`` and ``restart_p90_s`` (a kill to the next first step, from
the record, record/recovery.py), ``steps_lost_per_interruption`` (the last step logged
before the kill minus the step restored), ``overhead`` (a failure-free run's time per
step against the cold mode's; ``noise_floor``: the cold mode's two failure-free runs
against each other) and ``ettr`` (the steps times the cold mode's failure-free time per
step, over the wall time from the first step to the last: a mode's saving overhead
counts against it). A line per mode, then the JSON line;
``--state-mb 8 --mtbi 3`` is a quick look. Exit status 0 when every target is met (the
three above; warm: median restart at most 0.5 s and a fifth of cold's, ettr at least
0.95), 1 otherwise.
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
from typing import Any

import psutil

from acceptrun._util.durable import read_jsonl
from acceptrun.run.drills.operations import measure_restarts, startup_seconds
from acceptrun.run.launch import launch

WORKLOAD = textwrap.dedent(
    """
    import torch
    from torch import nn
    import acceptrun

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt)
    for step in run.steps(start, 24):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(step, loss=loss.item())
        run.maybe_checkpoint(step)
    """
)
# Kills land between checkpoints (every 2 steps: 1, 3, 5...), one per attempt; the last
# attempt is preempted gracefully.
KILLS = ["kill@step=4", "kill@step=8:attempt=2", "kill@step=12:attempt=3", "kill@step=16:attempt=4"]
PREEMPT_STEP = 20  # in the attempt after the last kill
IDLE_S = 10.0  # seconds the idle workload sleeps
RECOVERY_TARGET_S = 1.0
IDLE_CPU_TARGET_PCT = 1.0
WARM_TARGET_S = 0.5  # the warm mode's median restart-to-first-step (and <= cold / 5)
ETTR_TARGET = 0.95  # the warm mode's measured ratio at --mtbi 20


def write_spec(root: Path, name: str, command: list[str], extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "spec.toml"
    spec.write_text(
        f"name = {json.dumps(name)}\ncommand = {json.dumps(command)}\n"
        f'[limits]\nmax_restarts = 6\nrestart_backoff = 0\ngrace_period = "20s"\n{extra}'
    )
    return spec


def measure_recovery(root: Path, ws: Path, n_kills: int = len(KILLS)) -> dict[str, Any]:
    job = root / "train"
    job.mkdir(parents=True, exist_ok=True)
    (job / "train.py").write_text(WORKLOAD)
    spec = write_spec(
        job, "recovery", [sys.executable, "train.py"], "[checkpoint]\nevery_steps = 2\n"
    )
    # The first run also warms the page cache (torch's files), as a restart would find it.
    # Start-up varies by ~0.1 s from one start to the next: take the median of 3 fresh
    # starts (2 reference runs and the drill run's first attempt).
    references = [launch(spec, workspace=ws, echo=False).record for _ in range(2)]
    kill_at = KILLS[:n_kills]
    preempt = f"term@step={PREEMPT_STEP}:attempt={n_kills + 1}"
    drilled = launch(spec, workspace=ws, echo=False, inject=[*kill_at, preempt])
    samples = [startup_seconds(r) for r in [*references, drilled.record]]
    if any(s is None for s in samples):
        raise SystemExit(f"a fresh start logged no step: {samples}")
    startup = statistics.median(s or 0.0 for s in samples)
    restarts = measure_restarts(drilled.record, startup)
    kills = [r for r in restarts if r.fault == "kill"]
    term = next(r for r in restarts if r.fault == "term")
    if len(kills) != n_kills or any(r.death_to_step_s is None for r in kills):
        raise SystemExit(f"expected {n_kills} measured kills, got {restarts}")
    deaths = [r.death_to_step_s or 0.0 for r in kills]
    exits = [r.recovery_s or 0.0 for r in kills]
    return {
        "recovery_s": round(statistics.median(deaths), 3),
        "recovery_target_s": RECOVERY_TARGET_S,
        "recovery_spread_s": {
            "min": round(min(deaths), 3),
            "median": round(statistics.median(deaths), 3),
            "max": round(max(deaths), 3),
            "n": len(deaths),
        },
        "recoveries_s": deaths,
        "recovery_from_exit_s": round(statistics.median(exits), 3),
        "startup_s": round(startup, 3),
        "startup_samples_s": [round(s or 0.0, 3) for s in samples],
        # The supervisor's own part, measured without subtracting anything: noticing the
        # death, verifying the checkpoint, starting the next attempt.
        "supervisor_s": round(
            statistics.median((r.detect_s or 0) + (r.gap_s or 0) for r in kills), 3
        ),
        "restore_s": round(statistics.median(r.restore_s or 0.0 for r in kills), 4),
        "preempt_lost_steps": term.lost_steps,
        "preempt_recovery_s": term.recovery_s,
        "drill_run": drilled.record.run_id,
    }


def measure_idle_cpu(root: Path, ws: Path, idle_s: float = IDLE_S) -> float:
    """Percent of one core used by a real `acceptrun run` process while its child sleeps."""
    job = root / "idle"
    spec = write_spec(job, "idle", [sys.executable, "-c", f"import time; time.sleep({idle_s})"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", str(spec)],
        cwd=job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        events = _wait_for_attempt(ws / "runs", "idle", timeout=60)
        # Skip the first half second (the child's start-up), stop before it wakes up.
        t_start = next(e["t"] for e in read_jsonl(events) if e["kind"] == "attempt_start")
        time.sleep(max(0.0, t_start + 0.5 - time.time()))
        sup = psutil.Process(proc.pid)
        c0, w0 = sup.cpu_times(), time.monotonic()
        time.sleep(max(0.5, idle_s - 2.0))
        c1, w1 = sup.cpu_times(), time.monotonic()
    finally:
        proc.wait(timeout=idle_s + 60)
    used = (c1.user - c0.user) + (c1.system - c0.system)
    return round(100.0 * used / (w1 - w0), 3)


def _wait_for_attempt(runs: Path, name: str, timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for events in runs.glob(f"*-{name}-*/events.jsonl"):
            if any(e["kind"] == "attempt_start" for e in read_jsonl(events)):
                return events
        time.sleep(0.05)
    raise SystemExit(f"no attempt of {name!r} started within {timeout:.0f} s")


# ---- three recovery modes under Poisson kills ------------------------------------------------

# The demo-sized model (about 190k parameters, as examples/) beside a large plain tensor:
# the state a restart restores (--state-mb). Each step trains the model on a fresh batch
# and touches the tensor, so every checkpoint holds both.
MODES_WORKLOAD = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn
    import acceptrun

    state_mb, total = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU(),
                          nn.Linear(384, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    big = torch.zeros(max(1, state_mb * 2**20 // 4))  # fp32: state_mb MiB of state
    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt, big=big)
    for step in run.steps(start, total):
        x = torch.randn(512, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        big[step % big.numel()] += 1.0
        run.log(step, loss=loss.item())
        run.maybe_checkpoint(step)
    """
)
MODES = ("cold", "memory", "warm")


def poisson_draws(seed: int, kills: int, mtbi_s: float) -> list[float]:
    """Seconds of training between two kills: exponential, mean ``mtbi_s``, seeded."""
    import random

    rng = random.Random(seed)
    return [round(rng.expovariate(1.0 / mtbi_s), 3) for _ in range(kills)]


def kill_steps(draws: list[float], step_s: float) -> list[int]:
    """The step each kill lands on: the draws' running sum of training time, in steps of
    ``step_s`` (a failure-free run's). The same steps for every mode: each kill comes after
    the same training progress, and each attempt is killed once (the next one resumes
    before the next kill's step, at least one step later)."""
    out: list[int] = []
    elapsed = 0.0
    for d in draws:
        elapsed += d
        out.append(max(int(elapsed / step_s), out[-1] + 1 if out else 1))
    return out


def mode_spec(root: Path, mode: str, args: argparse.Namespace, total: int) -> Path:
    """The spec of ``mode``: cold is today's restart; memory adds the memory tier; warm adds
    the standby to it (or to the disk store where the tier is not available)."""
    job = root / f"modes-{mode}"
    job.mkdir(parents=True, exist_ok=True)
    (job / "train.py").write_text(MODES_WORKLOAD)
    ck = f"[checkpoint]\nevery_steps = {args.durable_every}\n"
    if mode in ("memory", "warm") and memory_tier_available():
        ck += f"memory_every = {args.memory_every}\n"
    warm = "warm_restart = true\n" if mode == "warm" else ""
    command = [sys.executable, "train.py", str(args.state_mb), str(total)]
    return write_spec(job, f"modes-{mode}", command, warm + ck)


def memory_tier_available() -> bool:
    from acceptrun.spec.model import CheckpointSpec

    return "memory_every" in CheckpointSpec.__dataclass_fields__


def step_period(record: Any) -> float:
    """Seconds per step of an uninterrupted run: its first step to its last, per step."""
    ts = sorted(float(e["t"]) for e in record.events("step"))
    return (ts[-1] - ts[0]) / max(1, len(ts) - 1)


def steps_lost(record: Any) -> list[int]:
    """Per restart: the steps done again (the last step logged before it, minus the step
    resumed after)."""
    last: dict[int, int] = {}
    for e in record.events("step"):
        last[e["attempt"]] = max(last.get(e["attempt"], -1), int(e["step"]))
    lost = []
    for e in record.events("attempt_start"):
        n = e["attempt"]
        if n - 1 in last:
            resumed = e.get("resume_step")
            restored = next((r for r in record.events("restored") if r["attempt"] == n), None)
            if restored is not None:
                resumed = restored["step"]  # the memory tier may give a newer one
            lost.append(last[n - 1] - (-1 if resumed is None else int(resumed)))
    return lost


def measure_mode(
    root: Path,
    ws: Path,
    mode: str,
    args: argparse.Namespace,
    at: list[int],
    total: int,
    period: float,
) -> dict[str, Any]:
    """One run of ``mode`` killed (SIGKILL) at the steps ``at``: its restarts, losses, ETTR.

    ``period`` is the cold mode's failure-free time per step (today's loop): the ETTR counts
    a mode's own saving overhead as lost time too, as the interval model does.
    """
    from acceptrun.record.recovery import restarts

    spec = mode_spec(root, mode, args, total)
    kills = [f"kill@step={s}:attempt={k}" for k, s in enumerate(at, start=1)]
    record = launch(spec, workspace=ws, echo=False, inject=kills).record
    done = [r for r in restarts(record) if r.total is not None]
    totals = sorted(float(r.total or 0.0) for r in done)
    lost = steps_lost(record)
    ts = sorted(float(e["t"]) for e in record.events("step"))
    wall = ts[-1] - ts[0] + period  # the first step's start to the last one's end
    out = {
        "restart_p50_s": round(statistics.median(totals), 3) if totals else None,
        "restart_p90_s": round(_quantile(totals, 0.9), 3) if totals else None,
        "restarts": len(done),
        "restart_modes": sorted({r.mode or "?" for r in done}),
        "steps_lost_per_interruption": round(statistics.mean(lost), 2) if lost else None,
        "ettr": round(total * period / wall, 4) if wall > 0 else None,
        "restore_sources": sorted(
            {str(e.get("source", "disk")) for e in record.events("restored")}
        ),
        "run": record.run_id,
    }
    if done:
        slow = max(done, key=lambda r: r.total or 0.0)
        out["slowest_parts_s"] = slow.parts()
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_modes(root: Path, ws: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The three modes under the same seeded Poisson kills, and each one's failure-free
    overhead against the cold mode (run twice: the bench's noise floor)."""
    periods: dict[str, float] = {}
    reference = None
    for mode in ("cold", "cold", "memory", "warm"):  # failure-free: the loop's own cost
        spec = mode_spec(root, mode, args, args.steps)
        record = launch(spec, workspace=ws, echo=False).record
        if mode == "cold" and reference is None:
            reference = step_period(record)
            continue
        periods[mode] = step_period(record)
    assert reference is not None
    noise = abs(periods["cold"] / reference - 1.0)
    base = statistics.mean([reference, periods["cold"]])
    draws = poisson_draws(args.seed, args.kills, args.mtbi)
    at = kill_steps(draws, base)
    total = at[-1] + max(1, int(args.mtbi / base))  # and a mean interval after the last kill
    figures: dict[str, Any] = {
        "draws_s": draws, "kill_steps": at, "steps": total, "step_s": round(base, 4),
    }  # fmt: skip
    for mode in MODES:
        fig = measure_mode(root, ws, mode, args, at, total, base)
        fig["overhead"] = round(periods[mode] / base - 1.0, 4) if mode != "cold" else 0.0
        figures[mode] = fig
    if not memory_tier_available() or "memory" not in figures["memory"]["restore_sources"]:
        figures["memory"]["not_available"] = (
            "no restore came from the memory tier: [checkpoint] memory_every is not in this "
            "acceptrun, or its client side does not save yet; the memory mode ran as cold"
        )
    figures["noise_floor"] = round(noise, 4)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="where the jobs and workspace go (a temp dir)")
    parser.add_argument(
        "--idle-seconds", type=float, default=IDLE_S, help="length of the idle measurement (10)"
    )
    parser.add_argument(
        "--kills", type=int, default=len(KILLS), metavar="N",
        help=f"Poisson kills per mode, 1 or more ({len(KILLS)}); the step-kill median takes "
        f"at most {len(KILLS)}",
    )  # fmt: skip
    parser.add_argument("--state-mb", type=int, default=500, help="the state's size, MiB (500)")
    parser.add_argument(
        "--mtbi", type=float, default=20.0, help="mean seconds between interruptions (20)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the kills' draws (0)")
    parser.add_argument(
        "--steps", type=int, default=300, help="steps of each failure-free run (300)"
    )
    parser.add_argument(
        "--durable-every", type=int, default=100, help="steps between durable saves (100)"
    )
    parser.add_argument(
        "--memory-every", type=int, default=10, help="steps between memory-tier saves (10)"
    )
    args = parser.parse_args()
    for name in ("kills", "state_mb", "steps", "durable_every", "memory_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give 1 or more")
    if args.mtbi <= 0:
        parser.error(f"--mtbi {args.mtbi}: give a number of seconds above 0, e.g. 20")
    root = args.root or Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    root.mkdir(parents=True, exist_ok=True)
    ws = root / "ws"
    os.environ.pop("ACCEPTRUN_INJECT", None)
    t0 = time.monotonic()
    load_before = round(os.getloadavg()[0], 2)
    figures = measure_recovery(root, ws, min(args.kills, len(KILLS)))
    figures["idle_cpu_pct"] = measure_idle_cpu(root, ws, args.idle_seconds)
    modes = measure_modes(root, ws, args)
    print_modes(modes, args)
    figures.update(modes)
    figures["conditions"] = {
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "state_mb": args.state_mb,
        "mtbi_s": args.mtbi,
    }
    figures["idle_cpu_target_pct"] = IDLE_CPU_TARGET_PCT
    figures["seconds"] = round(time.monotonic() - t0, 1)
    figures["root"] = str(root)
    print(json.dumps(figures), flush=True)
    warm, cold = modes["warm"], modes["cold"]
    met = (
        figures["recovery_s"] <= RECOVERY_TARGET_S
        and figures["idle_cpu_pct"] < IDLE_CPU_TARGET_PCT
        and figures["preempt_lost_steps"] == 0
        and warm["restart_p50_s"] is not None
        and cold["restart_p50_s"] is not None
        and warm["restart_p50_s"] <= WARM_TARGET_S
        and warm["restart_p50_s"] <= cold["restart_p50_s"] / 5
        and (warm["ettr"] or 0.0) >= ETTR_TARGET
    )
    return 0 if met else 1


def print_modes(modes: dict[str, Any], args: argparse.Namespace) -> None:
    """A line per mode, before the JSON line."""
    print(
        f"{args.kills} Poisson kill(s) per mode (mean {args.mtbi:g} s of training, seed "
        f"{args.seed}: at steps {modes['kill_steps']}), {modes['steps']} steps of "
        f"{modes['step_s'] * 1000:.1f} ms, a {args.state_mb} MiB state",
        flush=True,
    )
    for mode in MODES:
        m = modes[mode]
        note = f"  ({m['not_available']})" if m.get("not_available") else ""
        print(
            f"{mode:>6}: restart p50 {m['restart_p50_s']} s, p90 {m['restart_p90_s']} s "
            f"({', '.join(m['restart_modes'])}; restored from {', '.join(m['restore_sources'])}), "
            f"{m['steps_lost_per_interruption']} steps lost per interruption, overhead "
            f"{m['overhead']:+.1%}, ettr {m['ettr']}{note}",
            flush=True,
        )
    print(f"noise floor of the overhead (cold run twice): {modes['noise_floor']:.1%}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
