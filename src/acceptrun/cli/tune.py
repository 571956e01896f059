"""Commands of the training-efficiency playbook: ``acceptrun tune``, ``acceptrun bench comm``
and ``acceptrun bench scaling`` (``acceptrun scaling`` until the next release).

Registered through ``acceptrun.cli.main.COMMANDS``. Nothing here imports torch at
import time: ``acceptrun --help`` stays light; the trials and the communication
benchmark import it in their own processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import (
    MAX_DURATION_S,
    MAX_STEP,
    PATH_MAX,
    count,
    file_arg,
    finite_float,
    fraction,
    positive_int,
    seed,
    text,
)
from acceptrun._util.console import get_logger
from acceptrun._util.units import parse_size
from acceptrun.cli.main import OLD_NAME
from acceptrun.errors import UserError

__all__ = ["parse_size", "register", "run_tune"]


def _duration(text: str, what: str) -> float:
    from acceptrun.spec.model import parse_duration

    try:
        return parse_duration(text, what)
    except ValueError:  # spec's Problem: the value is not a duration
        raise UserError(f"{what}: {text!r} is not a duration; write e.g. 90s, 5m or 1h") from None


_log = get_logger("acceptrun.tune")  # printed by the CLI as "acceptrun: ..." on stderr
# A batch the tune search may reach: 2^24 samples is past any one device's memory.
MAX_BATCH = 2**24
# All-reduces or DDP steps a benchmark times per setting: 10^6 already takes hours.
MAX_ITERS = 1_000_000


# ---- tune --------------------------------------------------------------------------------


def run_tune(options: Any, *, workspace: str | None, out: str | None) -> tuple[Any, Any]:
    """Run a sweep inside a new run record (mode "tune"); returns (report, record).

    The record holds the provenance of the machine, ``tune.json`` (rewritten after every
    trial, so an interrupted sweep keeps what it measured) and a ``trial`` event per trial.
    """
    from acceptrun.capture import provenance
    from acceptrun.record.workspace import find_workspace, now_iso
    from acceptrun.spec.model import RunSpec
    from acceptrun.tune.report import write_best
    from acceptrun.tune.sweep import Tuner
    from acceptrun.tune.target import load_target, target_name

    target = load_target(options.target)
    name = f"tune-{target_name(target)}"
    command = [sys.executable, "-m", "acceptrun", *sys.argv[1:]]
    spec = RunSpec(name=name, command=command, workdir=os.getcwd())
    spec.source = "tune: " + " ".join(command)
    ws = find_workspace(workspace, create=True)
    record = ws.create_run(
        name, spec_text=spec.to_toml(),
        state={"mode": "tune", "status": "running", "started_at": now_iso(), "attempts": 0},
    )  # fmt: skip
    _log.info(f"tune record {record.run_id}")
    record.write_json("provenance.json", provenance.capture(diff_path=record.file("git.diff")))
    started = time.time()

    def on_trial(report: Any, trial: dict[str, Any]) -> None:
        record.event("trial", id=trial["id"], axis=trial["axis"], label=trial["label"],
                     ok=trial["ok"], samples_per_s=trial.get("samples_per_s"),
                     numerics=trial.get("numerics"), error=trial.get("error"))  # fmt: skip
        record.write_json("tune.json", report.to_dict())

    tuner = Tuner(options, target, on_trial=on_trial)
    status = "finished"
    try:
        report = tuner.run()
    except BaseException:
        status = "failed"
        raise
    finally:
        record.update_state(
            status=status, ended_at=now_iso(), duration_s=round(time.time() - started, 3)
        )
    record.write_json("tune.json", report.to_dict())
    if out and report.best is not None:
        write_best(out, report)
        record.event("output", name="best_config", path=str(Path(out).resolve()))
    return report, record


def cmd_tune(args: argparse.Namespace) -> int:
    from acceptrun.tune.report import format_table
    from acceptrun.tune.sweep import AXES, TuneOptions

    axes = tuple(a.strip() for a in args.axes.split(",") if a.strip()) if args.axes else AXES
    unknown = [a for a in axes if a not in AXES]
    if unknown:
        raise UserError(f"--axes: unknown {', '.join(unknown)}; choose from {','.join(AXES)}")
    if args.check_steps > args.warmup + args.steps:
        raise UserError(f"--check-steps {args.check_steps} is more than the {args.warmup + args.steps} "
                        "steps a trial runs; lower it or raise --steps")  # fmt: skip
    options = TuneOptions(
        target=_absolute_target(args.target), device=args.device,
        budget=_duration(args.budget, "--budget"), warmup=args.warmup, steps=args.steps,
        check_steps=args.check_steps, tolerance=args.tolerance, axes=axes,
        memory_limit=parse_size(args.memory_limit, "--memory-limit") if args.memory_limit else None,
        max_batch=args.max_batch, batch_multiple=args.batch_multiple,
        peak_tflops=args.peak_tflops, threads=args.threads, seed=args.seed,
        confirm=not args.no_confirm,
    )  # fmt: skip
    if args.out:  # before the sweep: a refusal costs nothing
        _claim_out(args, TUNE_MARKS[".json" if args.out.endswith(".json") else ".toml"],
                   inputs=_target_files(args.target), what="tune result")  # fmt: skip
    report, record = run_tune(options, workspace=args.workspace, out=args.out)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_table(report), end="")
    info = sys.stderr if args.json else sys.stdout  # --json: stdout is one JSON document
    if args.out and report.best is not None:
        print(f"best configuration: {args.out}", file=info)
    print(f"record: {record.path}", file=info)
    base = report.trial(report.baseline)
    return 0 if base is not None and base["ok"] else 1


# What marks an earlier `tune --out` (its TOML header, a key of its JSON) or `bench comm
# --out` (the definition it cites), so that writing it again needs no --force.
TUNE_MARKS = {
    ".toml": "# The best configuration found by `acceptrun tune`",
    ".json": '"samples_per_s": ',
}
COMM_MARK = '"definition": '


def _claim_out(args: argparse.Namespace, mark: str, *, inputs: list[Path], what: str) -> None:
    """Refuse ``--out`` over a file the user wrote (acceptrun._util.outputs), before any work."""
    from acceptrun._util.outputs import claim_output

    claim_output(Path(args.out), mark=mark, force=args.force, inputs=inputs, what=what,
                 flag="--out")  # fmt: skip


def _target_files(ref: str) -> list[Path]:
    """The file of a FILE.py:ATTR target: an input ``--out`` must never replace."""
    module, sep, _ = ref.rpartition(":")
    return [Path(module)] if sep and (module.endswith(".py") or "/" in module) else []


def _absolute_target(ref: str) -> str:
    """A file target made absolute: trials run the same file whatever their directory."""
    module, sep, attr = ref.rpartition(":")
    if sep and (module.endswith(".py") or "/" in module):
        return f"{Path(module).expanduser().resolve()}:{attr}"
    return ref


# ---- bench comm ----------------------------------------------------------------------------


def cmd_bench_comm(args: argparse.Namespace) -> int:
    from acceptrun.tune.comm import CommOptions, format_comm, run_comm

    if args.out:  # before the benchmark: a refusal costs nothing
        _claim_out(args, COMM_MARK, inputs=[], what="benchmark result")
    options = CommOptions(
        backend=args.backend, procs=args.procs, iters=args.iters, warmup=args.warmup,
        timeout=args.timeout, ddp_steps=args.ddp_steps, nodes=args.nodes,
    )  # fmt: skip
    if args.sizes:
        options.sizes = [parse_size(s, "--sizes") for s in args.sizes.split(",")]
    if args.buckets:
        try:
            options.buckets_mb = [float(b) for b in args.buckets.split(",")]
        except ValueError:
            raise UserError(
                f"--buckets: {args.buckets!r} is not a list of MB, e.g. 1,5,25"
            ) from None
    result = run_comm(options)
    if args.out:
        from acceptrun._util.durable import write_json_atomic

        write_json_atomic(args.out, result)  # claimed before the benchmark ran
    print(
        json.dumps(result, indent=2) if args.json else format_comm(result),
        end="" if not args.json else "\n",
    )
    return 0


def register(sub: Any) -> None:
    """Add ``tune`` and ``bench`` (``comm``, ``scaling``), and the old name ``scaling``."""
    from acceptrun.tune.sweep import AXES

    tune = sub.add_parser(
        "tune",
        help="find a faster training configuration: precision, batch, ...",
    )
    tune.add_argument(
        "target",
        type=text(most=PATH_MAX),
        help="MODULE:ATTR or FILE.py:ATTR of a tune target (see docs/tune.md)",
    )
    tune.add_argument(
        "--device", type=text(most=100), help="cuda, cuda:N or cpu (default: cuda when present)"
    )
    tune.add_argument(
        "--budget", type=text(most=40), default="5m", help="time for the whole sweep (default 5m)"
    )
    tune.add_argument(
        "--steps",
        type=positive_int(MAX_STEP),
        default=10,
        help="timed steps per trial (default 10)",
    )
    tune.add_argument(
        "--warmup", type=count(MAX_STEP), default=3, help="untimed steps first (default 3)"
    )
    tune.add_argument("--check-steps", type=positive_int(MAX_STEP), default=3, metavar="K",
                      help="numerics: compare the loss after K steps (default 3)")  # fmt: skip
    tune.add_argument("--tolerance", type=fraction, default=0.05,
                      help="numerics: relative loss difference allowed (default 0.05)")  # fmt: skip
    tune.add_argument(
        "--axes", type=text(), help=f"comma-separated axes in order (default {','.join(AXES)})"
    )
    tune.add_argument("--memory-limit", type=text(most=40), metavar="SIZE",
                      help="CPU: memory a trial may use beyond torch (RLIMIT_AS), e.g. 2GiB")  # fmt: skip
    tune.add_argument(
        "--max-batch",
        type=positive_int(MAX_BATCH),
        default=1024,
        help="largest batch searched (default 1024)",
    )
    tune.add_argument("--batch-multiple", type=positive_int(MAX_BATCH), default=1,
                      help="batch sizes the search bisects to (8 suits tensor cores)")  # fmt: skip
    tune.add_argument(
        "--peak-tflops",
        type=finite_float(above=0.0, most=1e9, example="989"),
        help="peak TFLOP/s for MFU (default: known GPUs)",
    )
    tune.add_argument("--threads", type=positive_int(4096), help="torch threads per trial (CPU)")
    tune.add_argument("--seed", type=seed, default=0)
    tune.add_argument("--no-confirm", action="store_true",
                      help="do not time the default and the best again, back to back, at the end")  # fmt: skip
    tune.add_argument(
        "--out",
        type=file_arg,
        metavar="FILE",
        help="write the best configuration (.toml or .json); an existing FILE is replaced only "
        "when it is an earlier result, or with --force",
    )
    tune.add_argument("--force", action="store_true", help="replace FILE even when it is not one")
    tune.add_argument("--json", action="store_true", help="print tune.json instead of the table")
    tune.set_defaults(func=cmd_tune)

    bench = sub.add_parser("bench", help="benchmarks: communication, scaling over processes")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="ACTION")
    comm = bench_sub.add_parser(
        "comm", help="all-reduce algbw/busbw by size, DDP bucket sweep, scaling 1..N processes"
    )
    _comm_arguments(comm)
    scaling = bench_sub.add_parser(
        "scaling", help="run a spec at 1, 2, ... processes: throughput and scaling efficiency",
        description=_scaling_doc(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    _scaling_arguments(scaling)
    # The name before `bench scaling`, kept for a release: no help= keeps it out of the list.
    old = sub.add_parser("scaling", description=f"{OLD_NAME % 'bench scaling'}\n\n{_scaling_doc()}",
                         formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _scaling_arguments(old)
    old.set_defaults(renamed="bench scaling")


def _comm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl with GPUs, else gloo")
    p.add_argument(
        "--procs",
        type=positive_int(4096),
        help="processes per node (default: GPUs for nccl, 2 for gloo)",
    )
    p.add_argument(
        "--nodes",
        type=positive_int(100_000),
        default=1,
        help="nodes (default 1); more runs the workers with srun inside a Slurm allocation",
    )
    p.add_argument("--sizes", type=text(), help="message sizes, e.g. 4KiB,1MiB,64MiB")
    p.add_argument("--buckets", type=text(), help="DDP bucket_cap_mb values, e.g. 1,5,25")
    p.add_argument(
        "--iters", type=positive_int(MAX_ITERS), default=10, help="timed all-reduces per size"
    )
    p.add_argument(
        "--warmup", type=count(MAX_ITERS), default=3, help="untimed all-reduces per size"
    )
    p.add_argument(
        "--ddp-steps", type=positive_int(MAX_ITERS), default=8, help="timed DDP steps per setting"
    )
    p.add_argument(
        "--timeout",
        type=finite_float(above=0.0, most=MAX_DURATION_S, example="300"),
        default=300.0,
        help="seconds for the whole benchmark",
    )
    p.add_argument(
        "--out",
        type=file_arg,
        metavar="FILE",
        help="also write the figures as JSON; an existing FILE is replaced only when it is an "
        "earlier benchmark's, or with --force",
    )
    p.add_argument("--force", action="store_true", help="replace FILE even when it is not one")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=cmd_bench_comm)


# ---- bench scaling ---------------------------------------------------------------------------


def _scaling_doc() -> str | None:
    from acceptrun.tune import scaling

    return scaling.__doc__


def _scaling_arguments(p: argparse.ArgumentParser) -> None:
    from acceptrun.tune.scaling import DEFAULT_STEPS

    p.add_argument(
        "spec", type=file_arg, help="the run spec (its command is launched through torchrun)"
    )
    p.add_argument(
        "--processes",
        type=text(),
        default="1,2",
        help="comma-separated process counts, e.g. 1,2,4 (default 1,2)",
    )
    p.add_argument(
        "--layouts",
        type=text(),
        help="instead of --processes: NODESxPROCESSES per node, e.g. 1x2,2x1 (several "
        "nodes: run it inside a Slurm allocation of that many nodes)",
    )
    p.add_argument(
        "--steps",
        type=positive_int(MAX_STEP),
        default=DEFAULT_STEPS,
        help=f"at most this many steps per run (default {DEFAULT_STEPS})",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="show the runs' own output")
    p.set_defaults(func=cmd_scaling)


def cmd_scaling(args: argparse.Namespace) -> int:
    import logging

    from acceptrun._util.console import configure_console
    from acceptrun.tune.scaling import format_scaling, parse_counts, parse_layouts, run_scaling

    layouts = parse_layouts(args.layouts) if args.layouts else None
    counts = parse_counts(args.processes)
    if args.steps < 1:
        raise UserError(f"--steps {args.steps}: give a number of steps of 1 or more, e.g. 50")
    if args.json:  # stdout is one JSON document; progress lines would only be noise
        configure_console(logging.WARNING)
    points = run_scaling(
        args.spec, counts, steps=args.steps, workspace=args.workspace, echo=args.verbose,
        layouts=layouts,
    )  # fmt: skip
    if args.json:
        print(json.dumps([p.to_dict() for p in points], indent=2))
    else:
        print(format_scaling(points))
    return 0 if all(p.throughput is not None for p in points) else 1
