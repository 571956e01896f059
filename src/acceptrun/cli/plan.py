"""``acceptrun ckpt plan``: how often to checkpoint, before spending money.

The interval model of :mod:`acceptrun.cost.interval` for figures given on the command
line, or taken from a spec and its recorded runs (:mod:`acceptrun.verdict.interval`
measures them): the optimum interval, the ETTR there, the interruptions, wall time and
cost to expect, and the same for the interval the spec sets. ``--simulate N`` checks it
event by event and adds what the closed form does not model (an asynchronous persist
window, Weibull interruptions). ``--memory-save`` adds the forecast with a memory tier
beside the durable saves, and where the wall time goes in each.

>>> acceptrun ckpt plan --gpus 512 --save 40s --restart 10m --work 14d --usd-per-hour 1100
>>> acceptrun ckpt plan --gpus 16384 --save 4s --restart 30s --work 54d --memory-save 0.1s
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import duration, file_arg, finite_float, positive_int, seed, usd
from acceptrun._util.units import format_duration
from acceptrun.errors import UserError

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "cmd_plan", "interval_warnings"]


# --simulate N: each round of the simulation (one per interruption) touches a few numpy
# arrays of N floats: 10^5 runs of a 300-interruption job took 9 to 11 s on 2 loaded
# cores, 10^6 took 37 s. The mean ETTR's standard error falls as 1/sqrt(N): at 10^5 it is
# 1/316 of the runs' spread (a spread of 0.1: +-0.0003), below the 3 decimals printed, so
# more runs change no figure.
MAX_SIMULATED_RUNS = 100_000
# The simulation's wall-clock bound (seconds): past it, plan says so instead of running on
# (a run whose ETTR is near 0 needs millions of rounds).
SIMULATE_DEADLINE_S = 60.0
# Interruptions expected per run past which the simulation is refused outright: each is a
# round over every run still active, so this many rounds would outlast the deadline.
MAX_SIMULATED_INTERRUPTIONS = 100_000
MAX_GPUS = 1_000_000  # far past any one job's (the largest reported are ~10^5)


def _recorded(args: argparse.Namespace, spec: Any) -> Any:
    """The measured inputs of the newest finished run of ``spec``'s name, or None."""
    from acceptrun.record.lookup import workspace_of
    from acceptrun.record.workspace import RunRecord
    from acceptrun.telemetry.summary import load_summary
    from acceptrun.verdict.core import CheckInput
    from acceptrun.verdict.interval import measure

    try:
        ws = workspace_of(args)
    except Exception:  # no workspace here: nothing recorded
        return None
    rows = [r for r in ws.list_runs() if r.name == spec.name]
    for row in reversed(rows):
        record = RunRecord(Path(row.path))
        if not (record.path / "verdict.json").exists():
            continue
        try:
            # A closed run's stored summary: the step log is not read again.
            stored = load_summary(record.path, with_timelines=False).summary
            return record.run_id, measure(CheckInput.of(record), stored)
        except Exception:  # a damaged record: try an older one
            continue
    return None


def cmd_plan(args: argparse.Namespace) -> int:
    """`acceptrun ckpt plan`: the checkpoint interval and its cost, from flags, spec or run."""
    inputs, price, price_from = _plan_inputs(args)
    missing = [k for k in ("save", "restart", "mtbf", "work") if inputs[k][0] is None]
    if missing:
        how = {
            "save": '--save "30s" (what one checkpoint blocks the loop for)',
            "restart": '--restart "5m" (interruption to the restarted first step)',
            "mtbf": '--mtbf "6h", or --gpus N (with --mtbf-gpu, else a published rate)',
            "work": '--work "14d" (the failure-free compute the run needs)',
        }
        raise UserError(
            "acceptrun ckpt plan needs " + "; ".join(how[k] for k in missing)
            + (f" ({args.spec} has no finished run to measure them from)" if args.spec else "")
        )  # fmt: skip
    save, restart, M, work = (float(inputs[k][0]) for k in ("save", "restart", "mtbf", "work"))  # type: ignore[arg-type]
    try:
        out = _figures(args, save=save, restart=restart, M=M, work=work, price=price,
                       current=inputs["interval"][0], memory_save=inputs["memory_save"][0])  # fmt: skip
    except OverflowError:
        raise UserError(
            f"with M = {format_duration(M)} between interruptions, a save of "
            f"{format_duration(save)} and a restart of {format_duration(restart)}, a run "
            "never finishes (its expected wall time overflows): give a longer --mtbf (or "
            "fewer --gpus), or a shorter --save or --restart"
        ) from None
    except ValueError as exc:  # a figure the model refuses, from a spec or a recorded run
        raise UserError(
            f"acceptrun ckpt plan: {exc}; check the spec's and its runs' figures"
        ) from None
    out["inputs"] = {
        k: {"seconds": v, "from": src} for k, (v, src) in inputs.items() if v is not None
    }
    out["usd_per_hour_from"] = price_from or None
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(_text(out))
    return 0


_Inputs = dict[str, tuple[float | None, str]]  # figure -> (seconds, where it came from)


def _plan_inputs(args: argparse.Namespace) -> tuple[_Inputs, float | None, str]:
    """Each figure the model needs and its source: a flag first, then the spec, then its
    newest finished run; then the price per hour and its source.
    """
    inputs: _Inputs = {}
    spec = None
    measured = None
    if args.spec:
        from acceptrun.spec.model import load_spec

        spec = load_spec(Path(args.spec))
        found = _recorded(args, spec)
        if found is not None:
            run_id, measured = found
    rec = f"run {run_id}" if measured is not None else ""

    def pick(flag: str, given: float | None, *others: tuple[float | None, str]) -> None:
        if given is not None:
            inputs[flag] = (given, f"--{flag}")
            return
        for value, source in others:
            if value is not None:
                inputs[flag] = (float(value), source)
                return
        inputs[flag] = (None, "")

    m = measured
    pick("save", args.save,
         (m.save_s or None if m else None, f"{rec}: {m.save_from}" if m else ""))  # fmt: skip
    pick("memory_save", args.memory_save,
         (m.memory_save_s if m else None, f"{rec}: {m.memory_save_from}" if m else ""))  # fmt: skip
    pick("restart", args.restart,
         (m.restart_s if m else None, f"{rec}: {m.restart_from}" if m else ""))  # fmt: skip
    inputs["mtbf"] = _mtbf_input(args, spec, m, rec)
    pick("work", args.work,
         (m.productive_s if m else None, f"{rec}: its step time" if m else ""))  # fmt: skip
    spec_every = (
        None if spec is None or spec.checkpoint.every is None else float(spec.checkpoint.every)
    )
    pick("interval", args.interval,
         (spec_every, f"{args.spec}: checkpoint.every"),
         (m.interval_s if m else None, f"{rec}: {m.interval_from}" if m else ""))  # fmt: skip
    price = args.usd_per_hour
    price_from = "--usd-per-hour" if price is not None else ""
    if price is None and m is not None and m.usd_per_hour is not None:
        price, price_from = m.usd_per_hour, f"{rec}: its [cost]"
    return inputs, price, price_from


def _mtbf_input(args: argparse.Namespace, spec: Any, m: Any, rec: str) -> tuple[float | None, str]:
    """M, the job's mean time between interruptions, and its source: --mtbf, --gpus N (each
    GPU's --mtbf-gpu or a published rate), the spec's checkpoint.mtbf, or the recorded run.
    """
    from acceptrun.cost.interval import FLEET

    mtbf, gpu_mtbf = args.mtbf, args.mtbf_gpu  # seconds, checked by argparse
    if mtbf is not None:
        return (mtbf, "--mtbf")
    if args.gpus is not None:
        per_gpu, source = (gpu_mtbf, "--mtbf-gpu") if gpu_mtbf is not None else (
            FLEET.gpu_mtbf_s, f"published: {FLEET.source}"
        )  # fmt: skip
        return (per_gpu / args.gpus, f"{source}, per GPU / {args.gpus} GPUs")
    if gpu_mtbf is not None:
        raise UserError("--mtbf-gpu needs --gpus N: the job's M is one GPU's divided by N")
    if spec is not None and spec.checkpoint.mtbf is not None:
        return (float(spec.checkpoint.mtbf), f"{args.spec}: checkpoint.mtbf")
    if m is not None and m.mtbf_s is not None:
        return (m.mtbf_s, f"{rec}: {m.mtbf_from}")
    return (None, "")


def _figures(
    args: argparse.Namespace,
    *,
    save: float,
    restart: float,
    M: float,
    work: float,
    price: float | None,
    current: float | None,
    memory_save: float | None = None,
) -> dict[str, Any]:
    """The optimum's and ``current``'s forecasts, and ``--simulate``'s runs of each; with
    ``memory_save`` (given or measured), the forecast with a memory tier too."""
    from acceptrun.cost.interval import daly_interval, forecast, young_interval

    best = daly_interval(save, M)
    opt = forecast(best, save=save, mtbf=M, restart=restart, work=work, usd_per_hour=price)
    out: dict[str, Any] = {
        **opt.to_dict(),
        "young_interval_s": round(young_interval(save, M), 3),
        "usd_per_hour": price,
        "current": None,
    }
    if current is not None:
        now = forecast(current, save=save, mtbf=M, restart=restart, work=work, usd_per_hour=price)
        out["current"] = now.to_dict()
    out["memory_tier"] = None
    if memory_save is not None:
        out["memory_tier"] = _memory_tier(args, current or best, memory_save, save=save,
                                          restart=restart, M=M, work=work, price=price)  # fmt: skip
    if args.simulate:
        out["simulated"] = _simulated(args, best, current, save=save, restart=restart, M=M,
                                      work=work)  # fmt: skip
    return out


def _memory_tier(
    args: argparse.Namespace,
    interval: float,
    memory_save: float,
    *,
    save: float,
    restart: float,
    M: float,
    work: float,
    price: float | None,
) -> dict[str, Any]:
    """The forecast with a memory tier beside durable saves every ``interval``."""
    from acceptrun.cost.interval import Tiers, forecast, simulate_tiers, tiered_forecast

    survives = 1.0 if args.memory_survives is None else args.memory_survives
    tiers = Tiers(
        save=save, memory_save=memory_save, survives=survives, mtbf=M, restart=restart, work=work
    )
    tiered = tiered_forecast(
        interval, tiers, memory_interval=args.memory_interval, usd_per_hour=price
    )
    out = tiered.to_dict()
    out["memory_save_s"] = memory_save
    out["survives"] = survives
    out["survives_from"] = (
        "--memory-survives" if args.memory_survives is not None else
        "assumed: every interruption leaves the memory copy reachable (the host stays up, "
        "or a peer holds a replica); give --memory-survives for less"
    )  # fmt: skip
    # The same durable interval without the tier, in the same first-order terms, so the
    # two breakdowns side by side differ only by the tier.
    without = dataclasses.replace(tiers, memory_save=0.0, survives=0.0)
    out["without"] = tiered_forecast(interval, without, memory_interval=interval).to_dict()
    if args.simulate:
        hits = forecast(interval, save=save, mtbf=M, restart=restart, work=work)
        if hits.expected_interruptions * args.simulate <= 2e7:  # a pure-Python round each
            out["simulated"] = simulate_tiers(
                tiered.memory_interval_s, interval, tiers, runs=args.simulate, seed=args.seed
            )
    return out


def _simulated(
    args: argparse.Namespace,
    best: float,
    current: float | None,
    *,
    save: float,
    restart: float,
    M: float,
    work: float,
) -> dict[str, Any]:
    """``--simulate N`` runs at the optimum and at ``current``, within the deadline."""
    import time

    from acceptrun.cost.interval import forecast, simulate

    persist = args.persist or 0.0
    sims: dict[str, Any] = {
        "runs": args.simulate, "persist_s": persist, "weibull_shape": args.weibull,
    }  # fmt: skip
    deadline = time.monotonic() + SIMULATE_DEADLINE_S
    for name, tau in (("optimum", best), ("current", current)):
        if tau is None:
            continue
        hits = forecast(tau, save=save, mtbf=M, restart=restart, work=work).expected_interruptions
        if hits > MAX_SIMULATED_INTERRUPTIONS:
            raise UserError(
                f"--simulate: at the {name} interval ({format_duration(tau)}) a run expects "
                f"{hits:,.0f} interruptions, each a round of the simulation (at most "
                f"{MAX_SIMULATED_INTERRUPTIONS:,}); leave out --simulate, or give a longer "
                "--mtbf or a shorter --work"
            )
        try:
            sims[name] = simulate(
                tau, save=save, mtbf=M, restart=restart, work=work, runs=args.simulate,
                persist=persist, weibull_shape=args.weibull, seed=args.seed, deadline=deadline,
            )  # fmt: skip
        except TimeoutError:
            raise UserError(
                f"--simulate {args.simulate}: not done within {SIMULATE_DEADLINE_S:.0f} s; "
                "simulate fewer runs (the closed form above needs none)"
            ) from None
    return sims


def _text(out: dict[str, Any]) -> str:
    def money(value: float | None) -> str:
        return "" if value is None else f", {value:,.2f} USD"

    lines = ["inputs:"]
    names = {"save": "save (blocking)", "memory_save": "save to memory (blocking)",
             "restart": "restart", "mtbf": "M (mean time between "
             "interruptions)", "work": "work (failure-free compute)", "interval": "interval"}  # fmt: skip
    for key, item in out["inputs"].items():
        lines.append(f"  {names[key]:<42} {format_duration(item['seconds']):>10}  ({item['from']})")
    if out["usd_per_hour"] is not None:
        lines.append(f"  {'price per wall hour':<42} {out['usd_per_hour']:>10,.2f}  "
                     f"({out['usd_per_hour_from']})")  # fmt: skip
    lines.append(
        f"optimum: checkpoint every {format_duration(out['interval_s'])} of compute (Daly 2006; "
        f"Young 1974: {format_duration(out['young_interval_s'])})"
    )
    lines.append(
        f"  ETTR {out['ettr']:.3f}, {out['expected_interruptions']:.1f} interruptions expected, "
        f"wall {format_duration(out['wall_s'])}{money(out['cost_usd'])}"
    )
    cur = out["current"]
    if cur is not None:
        lines.append(f"at the interval given ({format_duration(cur['interval_s'])}):")
        lines.append(
            f"  ETTR {cur['ettr']:.3f}, {cur['expected_interruptions']:.1f} interruptions "
            f"expected, wall {format_duration(cur['wall_s'])}{money(cur['cost_usd'])}"
        )
        if cur["cost_usd"] is not None and out["cost_usd"] is not None:
            lines.append(
                f"  the optimum saves {cur['cost_usd'] - out['cost_usd']:,.2f} USD per run"
            )
    sims = out.get("simulated")
    if sims:
        how = (
            "exponential"
            if sims["weibull_shape"] is None
            else f"Weibull k={sims['weibull_shape']:g}"
        )
        lines.append(
            f"simulated: {sims['runs']} runs, {how} interruptions, persist window "
            f"{format_duration(sims['persist_s'])}"
        )
        for name in ("optimum", "current"):
            if name in sims:
                s = sims[name]
                lines.append(
                    f"  {name}: ETTR {s['ettr']:.3f}, {s['interruptions']:.1f} interruptions, "
                    f"wall {format_duration(s['wall_s'])}"
                )
    tier = out.get("memory_tier")
    if tier:
        lines.extend(_tier_text(tier, money))
    lines.append("(predicted: the model of docs/checkpoint-interval.md, not a measurement)")
    return "\n".join(lines)


def _tier_text(tier: dict[str, Any], money: Any) -> list[str]:
    def shares(s: dict[str, float]) -> str:
        names = (("disk_saves", "saves to disk"), ("memory_saves", "saves to memory"),
                 ("restarts", "restarts"), ("lost_work", "work lost"))  # fmt: skip
        return ", ".join(f"{label} {100 * s[k]:.1f}%" for k, label in names if s[k] > 0)

    lines = [
        f"with a memory tier (a save to memory blocks {format_duration(tier['memory_save_s'])}; "
        f"reachable after {100 * tier['survives']:.0f}% of interruptions: {tier['survives_from']}):",
        f"  to memory every {format_duration(tier['memory_interval_s'])} of compute, to disk "
        f"every {format_duration(tier['interval_s'])}",
        f"  ETTR {tier['ettr']:.3f}, {tier['expected_interruptions']:.1f} interruptions "
        f"expected, wall {format_duration(tier['wall_s'])}{money(tier['cost_usd'])}",
        f"  where the wall time goes besides work: {shares(tier['shares'])}",
        f"  without it, at the same disk interval: ETTR {tier['without']['ettr']:.3f}; "
        f"{shares(tier['without']['shares'])}",
    ]
    if "simulated" in tier:
        sim = tier["simulated"]
        lines.append(
            f"  simulated ({sim['runs']:.0f} runs): ETTR {sim['ettr']:.3f}, "
            f"{sim['interruptions']:.1f} interruptions"
        )
    return lines


HELP = "how often to checkpoint: the optimum interval, ETTR and cost (before a run)"
DESCRIPTION = (
    "The checkpoint-interval model (docs/checkpoint-interval.md) for the figures given, or a "
    "spec's: its recorded runs give the save and restart costs."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``ckpt plan`` (and of ``plan``, its name until the next release)."""
    positive, zero_ok = duration(), duration(zero_ok=True)
    p.add_argument(
        "spec", nargs="?", type=file_arg, help="a spec: its interval, price and recorded runs"
    )
    p.add_argument("--mtbf", type=positive, metavar="DURATION",
                   help="mean time between interruptions of the whole job")  # fmt: skip
    p.add_argument("--gpus", type=positive_int(MAX_GPUS, example="512"), metavar="N",
                   help="the job's GPUs (M = --mtbf-gpu / N)")  # fmt: skip
    p.add_argument("--mtbf-gpu", type=positive, metavar="DURATION",
                   help="one GPU's mean time to failure (default: a published fleet rate)")  # fmt: skip
    p.add_argument("--save", type=positive, metavar="DURATION",
                   help="what one checkpoint blocks the loop for")  # fmt: skip
    p.add_argument("--restart", type=zero_ok, metavar="DURATION",
                   help="interruption to the restarted first step (detect, restart, restore)")  # fmt: skip
    p.add_argument("--work", type=positive, metavar="DURATION",
                   help="the failure-free compute the run needs")  # fmt: skip
    p.add_argument("--interval", type=positive, metavar="DURATION",
                   help="an interval to compare (default: the spec's)")  # fmt: skip
    p.add_argument("--usd-per-hour", type=usd, metavar="USD",
                   help="what the whole job costs per hour (0 or more)")  # fmt: skip
    p.add_argument(
        "--simulate", type=positive_int(MAX_SIMULATED_RUNS, example="1000"), metavar="N",
        help=f"also simulate N runs event by event (at most {MAX_SIMULATED_RUNS:,}; "
        f"bounded to {SIMULATE_DEADLINE_S:.0f} s)",
    )  # fmt: skip
    p.add_argument("--persist", type=zero_ok, metavar="DURATION",
                   help="simulated: an asynchronous persist window (lost with an interruption)")  # fmt: skip
    p.add_argument(
        "--weibull", type=finite_float(least=0.1, most=10.0, example="0.7"), metavar="K",
        help="simulated: Weibull interruptions of shape K, 0.1 to 10 (1: exponential; "
        "under 0.1 the scale's gamma(1 + 1/K) passes 10^100)",
    )  # fmt: skip
    p.add_argument("--memory-save", type=zero_ok, metavar="DURATION",
                   help="with a memory tier: what one save to memory blocks the loop for")  # fmt: skip
    p.add_argument("--memory-interval", type=positive, metavar="DURATION",
                   help="with a memory tier: its interval (default: the optimum)")  # fmt: skip
    p.add_argument(
        "--memory-survives", type=finite_float(least=0.0, most=1.0, example="0.8"),
        metavar="SHARE", help="with a memory tier: the share of interruptions after which "
        "its copy is reachable, 0 to 1 (default 1)",
    )  # fmt: skip
    p.add_argument("--seed", type=seed, default=0, help="simulated: the random seed")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.set_defaults(func=cmd_plan)


LONG_RUN_S = 3600.0  # a run that may last longer than this should checkpoint


def interval_warnings(args: argparse.Namespace, spec: Any, usage: str = "client") -> list[str]:
    """``spec check``'s warnings about the checkpoint interval (docs/checkpoint-interval.md).

    A long run (``limits.wall_time`` or the top of ``limits.expected_runtime`` over an hour)
    that sets no interval; an interval more than 2x away from the optimum for the save cost
    its recorded runs measured and the M it declares, measured or takes from the fleet.
    ``usage``: the command's use of the client (workload/usage.py); the interval is the
    client's, so a black box (its own saves, ``checkpoint.watch``) gets no warning.
    """
    from acceptrun.cost.interval import FLEET, daly_interval

    if spec.serving.enabled or spec.inference.enabled or usage != "client":
        return []
    ck, lim = spec.checkpoint, spec.limits
    longest = max(
        float(lim.wall_time or 0.0),
        float(lim.expected_runtime[1]) if lim.expected_runtime else 0.0,
    )
    found = _recorded(args, spec)
    m = found[1] if found is not None else None
    if spec.checkpoint.mtbf is not None:
        mtbf, mtbf_from = float(spec.checkpoint.mtbf), "checkpoint.mtbf"
    elif m is not None and m.mtbf_s is not None:
        mtbf, mtbf_from = m.mtbf_s, m.mtbf_from
    else:
        gpus = max(1, int(spec.resources.gpus) * int(spec.resources.nodes))
        mtbf, mtbf_from = (
            FLEET.gpu_mtbf_s / gpus,
            f"the published rate of {FLEET.name} / {gpus} GPU(s)",
        )
    out = []
    if ck.every is None and ck.every_steps is None and not ck.watch:
        if longest > LONG_RUN_S:
            advice = (
                f'checkpoint.every = "{format_duration(daly_interval(m.save_s, mtbf))}" '
                f"(the optimum for a save of {m.save_s:.3g} s and M = {format_duration(mtbf)}, "
                f"{mtbf_from})"
                if m is not None and m.save_s
                else "checkpoint.every (`acceptrun ckpt plan SPEC --save 30s` prints the optimum)"
            )
            out.append(
                f"checkpoint interval: a run of up to {format_duration(longest)} sets none "
                f"(checkpoint.every / every_steps), so an interruption loses all its work; "
                f"set {advice}"
            )
        return out
    if m is None or not m.save_s:
        return out  # no save cost measured yet: nothing to compare the interval with
    if ck.every is not None:
        current, what = float(ck.every), f"checkpoint.every = {format_duration(float(ck.every))}"
    elif m.interval_s is not None:
        current, what = (
            m.interval_s,
            f"checkpoint.every_steps = {ck.every_steps} ({m.interval_from})",
        )
    else:
        return out
    best = daly_interval(m.save_s, mtbf)
    if not (best / 2.0 <= current <= best * 2.0):
        out.append(
            f"checkpoint interval: {what} is {current / best:.2g}x the optimum "
            f"{format_duration(best)} for a save of {m.save_s:.3g} s ({found[0]}) and "
            f"M = {format_duration(mtbf)} ({mtbf_from}); `acceptrun ckpt plan {args.file}` shows "
            "what each costs"
        )
    return out
