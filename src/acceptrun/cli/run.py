"""``acceptrun run``, ``drill``, ``ckpt``, ``stop``, ``kill``, ``resume``, ``logs``, ``gc``, ``spec``
and ``init``: checking and running a spec, and acting on a run and its checkpoints.

``spec check`` is a dry run of ``run``: it loads the spec, runs the static preflight and
reads how the command uses the client, which is why the spec's commands live here and not
in ``spec/`` (below ``capture`` and ``workload``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import (
    MAX_DURATION_S,
    MAX_STEP,
    PATH_MAX,
    count,
    duration,
    file_arg,
    finite_float,
    path_arg,
    positive_int,
    text,
)
from acceptrun._util.console import get_logger
from acceptrun.cli.main import OLD_NAME
from acceptrun.cli.record import add_run_argument, open_run

__all__ = ["register"]

_log = get_logger(__name__)
_say = _log.info


def cmd_run(args: argparse.Namespace) -> int:
    from acceptrun.run.launch import launch
    from acceptrun.verdict.core import format_verdict

    result = launch(
        args.spec, workspace=args.workspace, echo=not args.quiet, inject=args.inject,
        run_id=args.run_id, prometheus_port=args.prometheus_port, existing=args.existing,
    )  # fmt: skip
    print()
    print(format_verdict(result.verdict, name=result.spec.name))
    print(f"record: {result.record.path}")
    return result.exit_code


def cmd_drill(args: argparse.Namespace) -> int:
    from acceptrun.errors import UserError
    from acceptrun.run.drills.operations import format_drill, run_ops_drill

    if args.campaign is not None:
        return _drill_campaign(args)
    if args.json:
        raise UserError("--json: only the campaign prints JSON; add --campaign")
    if args.spec is None:
        raise UserError("acceptrun drill: give the run spec, e.g. `acceptrun drill spec.toml`")
    report = run_ops_drill(
        args.spec,
        workspace=args.workspace,
        tolerance=args.tolerance,
        echo=args.verbose,
    )
    print()
    print(format_drill(report))
    return 0 if report.ok else 1


_DEFAULT_CAMPAIGN = "default"


def _drill_campaign(args: argparse.Namespace) -> int:
    """``drill --campaign [FILE] [--json] SPEC``: every fault kind, scored (run/drills/campaign)."""
    from acceptrun.errors import UserError
    from acceptrun.run.drills.campaign import (
        default_campaign,
        format_scorecard,
        load_campaign,
        run_campaign,
    )

    spec, file = args.spec, args.campaign
    if spec is None and file != _DEFAULT_CAMPAIGN:
        spec, file = file, _DEFAULT_CAMPAIGN  # `drill --campaign SPEC`: the default campaign
    if spec is None:
        raise UserError(
            "acceptrun drill --campaign: give the run spec, e.g. `--campaign spec.toml`"
        )
    campaign = default_campaign() if file == _DEFAULT_CAMPAIGN else load_campaign(file)
    report = run_campaign(
        spec, campaign, workspace=args.workspace, tolerance=args.tolerance, echo=args.verbose
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print()
        print(format_scorecard(report))
    return 0 if report.ok else 1


def _store_of(record: Any) -> Any:
    """The run's own store, its owner checked (another run's: StoreOwnedError, exit 2)."""
    from acceptrun.checkpoint.owner import open_run_store

    return open_run_store(record, retention=False)


def cmd_ckpt_ls(args: argparse.Namespace) -> int:
    record = open_run(args, args.run)
    store = _store_of(record)
    infos = store.list()
    # A step directory whose manifest does not parse is left out of the list: say so.
    listed = {i.step for i in infos}
    damaged = sorted(
        int(p.name[5:])
        for p in (store.root.iterdir() if store.root.is_dir() else ())
        if p.name.startswith("step-") and p.name[5:].isdigit() and int(p.name[5:]) not in listed
    )
    notes = [
        f"step {step}: damaged, not listed: {'; '.join(store.verify(step).problems)} "
        "(restarts skip it)"
        for step in damaged
    ]
    if not infos:
        print("\n".join([f"no checkpoints in {store.root}", *notes]))
        return 0
    latest = store.latest()
    mirror = {
        int(k): v for k, v in (record.read_json("mirror.json") or {}).get("steps", {}).items()
    }
    print(f"{'STEP':>8}  {'CREATED':<24} {'SIZE':>10} {'FILES':>5}  {'MIRROR':<8} METRICS")
    estimated: list[str] = []
    for i in infos:
        mark = "*" if latest is not None and i.step == latest.step else " "
        dated = i.meta.get("dated")
        if isinstance(dated, dict) and dated.get("estimate"):
            mark = mark.strip() + "~"
            estimated.append(f"step {i.step}: an estimate ({dated.get('by')}; {dated['estimate']})")
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(i.metrics.items()))
        state = mirror.get(i.step, {}).get("state", "-")
        print(
            f"{i.step:>7}{mark:<2} {i.created_at:<24} {i.total_bytes / 1e6:>8.1f}MB {len(i.files):>5}  {state:<8} {metrics}"
        )
    legend = "* = LATEST" + (", ~ = its step is an estimate" if estimated else "")
    print(f"({legend}; {store.root})")
    for line in estimated:
        print(line)
    for note in notes:
        print(note)
    return 0


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    record = open_run(args, args.run)
    store = _store_of(record)
    result = store.verify(args.step)
    rate = result.checked_bytes / 1e6 / max(result.seconds, 1e-9)
    if result.ok:
        print(f"step {result.step}: ok, {len(store.get(result.step).files)} files, "
              f"{result.checked_bytes / 1e6:.1f} MB hashed in {result.seconds:.2f}s ({rate:.0f} MB/s)")  # fmt: skip
        return 0
    print(f"{result.path}: FAILED verification")
    for problem in result.problems:
        print(f"  - {problem}")
    print("restarts skip it and use the previous good checkpoint (it is quarantined then)")
    return 1


def cmd_ckpt_drill(args: argparse.Namespace) -> int:
    from acceptrun.run.drills.restore import restore_drill

    record = open_run(args, args.run)
    _say(f"restore drill of {record.run_id}{' on CPU' if args.cpu else ''}")
    result = restore_drill(record, cpu=args.cpu, timeout=args.timeout, echo=args.verbose)
    print(f"restore drill {'PASSED' if result.ok else 'FAILED'}: {result.evidence}")
    print(f"logs: {result.log_dir}")
    return 0 if result.ok else 1


def cmd_stop(args: argparse.Namespace) -> int:
    from acceptrun.run.lifecycle import ENDED, load_verdict, request_stop, stop_promise, wait_closed
    from acceptrun.spec.model import load_spec
    from acceptrun.verdict.core import format_verdict

    record = open_run(args, args.run)
    pid = request_stop(record, args.action, reason=args.reason)
    what = stop_promise(record, args.action)
    _say(f"{args.action} sent to run {record.run_id} (supervisor pid {pid}): {what}")
    if not args.wait:
        _say(f"follow it with `acceptrun logs -f {record.run_id}`")
        return 0
    # A stop may take the grace period, then the close re-verifies the last checkpoint.
    timeout = args.timeout
    if timeout is None:
        timeout = load_spec(record.spec_path).limits.grace_period + 120.0
    state = wait_closed(record, timeout)
    if state is None:
        _say(
            f"run {record.run_id} is still running after {timeout:.0f} s; "
            f"see `acceptrun show {record.run_id}`"
        )
        return 1
    verdict = load_verdict(record)
    if state.get("status") not in ENDED or verdict is None:
        _say(
            f"the supervisor of run {record.run_id} exited without closing it; "
            f"`acceptrun resume {record.run_id}` continues it"
        )
        return 1
    print(format_verdict(verdict, name=str(state.get("name", ""))))
    print(f"record: {record.path}")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    return cmd_stop(args)


def cmd_resume(args: argparse.Namespace) -> int:
    from acceptrun.run.lifecycle import resume_run
    from acceptrun.verdict.core import format_verdict

    record = open_run(args, args.run)
    result = resume_run(
        record, mirror=args.mirror, from_mirror=args.from_mirror, force=args.force,
        from_scratch=args.from_scratch, reason=args.reason, echo=not args.quiet, step=args.step,
    )  # fmt: skip
    print()
    print(format_verdict(result.verdict, name=result.spec.name))
    print(f"record: {record.path}")
    return result.exit_code


def cmd_gc(args: argparse.Namespace) -> int:
    from acceptrun.record.lookup import workspace_of
    from acceptrun.record.workspace import RunRecord
    from acceptrun.run.retention import GcOptions, apply_plan, format_gc, plan_gc

    older_than = args.older_than  # seconds, checked by argparse
    ws = workspace_of(args)
    options = GcOptions(
        older_than=older_than,
        keep_rejected=args.keep_rejected,
        include_quarantine=args.include_quarantine,
    )
    plans = plan_gc(ws, options)
    if args.apply:
        for plan in plans:
            if plan.delete and not plan.skipped:
                apply_plan(RunRecord(ws.runs_dir / plan.run_id), plan)
    print(format_gc(plans, applied=args.apply))
    return 0


def cmd_spec_check(args: argparse.Namespace) -> int:
    from acceptrun.capture.preflight import check_static
    from acceptrun.spec.model import format_duration, load_spec
    from acceptrun.workload.usage import detect_usage, raise_errors, spec_findings

    spec = load_spec(args.file)
    check_static(spec)
    usage = detect_usage(spec)
    findings = spec_findings(spec, usage)
    for f in findings:
        if f.level == "warning":
            _say(str(f))
    raise_errors(spec, findings)  # exit 2, with every error and its fix
    from acceptrun.cli.plan import interval_warnings

    advice = interval_warnings(args, spec, usage.kind)
    for line in advice:
        _say(f"warning: {line}")
    lim = spec.limits
    warned = len(findings) + len(advice)
    print(f"{args.file}: ok" + (f" ({warned} warning(s))" if warned else ""))
    print(f"  name      {spec.name}")
    print(f"  command   {' '.join(spec.command) if not spec.shell else spec.command[2]}")
    print(f"  workdir   {spec.workdir_path}")
    print(
        f"  limits    wall time {format_duration(lim.wall_time)}, max restarts {lim.max_restarts}"
    )
    checks = [f"{k} {v}" for k, v in spec.acceptance.metrics.items()] + [
        f"output {o}" for o in spec.acceptance.outputs
    ]
    print(f"  accepts   {', '.join(checks) or 'exit 0'}")
    if spec.inference.enabled:  # a batch inference run
        inf = spec.inference
        print(
            f"  batch     {inf.input} -> {inf.output}, shards of {inf.shard_size}, "
            f"coverage >= {inf.min_coverage:g}"
        )
    print(f"  uses      {usage.kind}: {usage.reason}")
    declared = [f"{k} = {v}" for k, v in spec.outputs.items()]
    print(f"  outputs   declared in [outputs]: {', '.join(declared) or 'none'}")
    scripted = [o for o in spec.acceptance.outputs if o not in spec.outputs]
    if scripted:
        must = ", ".join(scripted)
        print(f"            the script must register: {must} (run.output(name, path))")
    if spec.checkpoint.watch:
        _say_leftovers(spec)
    return 0


def _say_leftovers(spec: Any) -> None:
    """What checkpoint.watch matches already, and what a run will do with it."""
    from acceptrun.checkpoint.leftovers import describe, find_leftovers

    found = find_leftovers(spec.checkpoint.watch, spec.workdir_path, [Path(".acceptrun")])
    if not found:
        print("  watched   nothing there yet: a run starts from scratch")
        return
    mode = spec.checkpoint.existing
    then = {
        "refuse": "a run is refused at preflight; move it aside, or set checkpoint.existing = "
        '"move" (moved into the record) or "start" (begin from it, named in the verdict)',
        "move": "a run moves it into its record's leftovers/ before the first attempt",
        "start": "a run begins from it and its verdict names it",
    }[mode]
    for entry in found:
        print(f"  watched   already there: {describe(entry)}")
    print(f"            checkpoint.existing = {mode!r}: {then}")


def cmd_spec_schema(args: argparse.Namespace) -> int:
    from acceptrun.spec.schema import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_spec_docs(args: argparse.Namespace) -> int:
    from acceptrun.spec.schema import reference_markdown

    print(reference_markdown(), end="")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from acceptrun._util.durable import write_atomic
    from acceptrun.errors import SpecError, UserError
    from acceptrun.spec.model import parse_spec
    from acceptrun.spec.schema import starter_spec

    path = Path(args.file)
    if path.exists() and not args.force:
        raise UserError(
            f"{path} already exists; pass --force to overwrite it, or give another file name"
        )
    if not path.parent.is_dir():
        raise UserError(f"{path}: the folder {path.parent} does not exist; create it first")
    watch, resume_args = _own_checkpoints(args)
    text = starter_spec(name=args.name or Path.cwd().name, command=args.command, file=str(path),
                        watch=watch, resume_args=resume_args)  # fmt: skip
    try:
        parse_spec(text, source=str(path))  # the starter must always validate
    except SpecError as exc:  # only what the flags put in can make it fail
        raise UserError(f"--own-checkpoints {watch!r}: {exc}") from None
    write_atomic(path, text, raw=True)  # the user's new spec
    print(
        f"wrote {path}; edit it, check it with `acceptrun spec check {path}`, run it with `acceptrun run {path}`"
    )
    return 0


def _own_checkpoints(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The checkpoint the script saves itself and its resume flags: from the flags, else
    asked at a terminal (never from a pipe: a script's `init` must not wait for a reader)."""
    import shlex
    import sys

    from acceptrun.errors import UserError

    watch, words = args.own_checkpoints, args.resume_args
    if watch is None and words is None and sys.stdin.isatty() and sys.stdout.isatty():
        try:
            watch = input("Does the script save its own checkpoints? Their path or glob, "
                          "e.g. out/ckpt.pt (Enter: no): ").strip() or None  # fmt: skip
            if watch:
                words = input("The arguments it resumes with, {checkpoint} for the path "
                              "(Enter: fill in later): ").strip() or None  # fmt: skip
        except EOFError:
            watch = None
    if words is not None and not watch:
        raise UserError("--resume-args needs --own-checkpoints PATH: the files it resumes from")
    try:
        resume_args = shlex.split(words or "")
    except ValueError as exc:
        raise UserError(f"--resume-args {words!r}: {exc}; quote it as a shell would") from None
    return watch, resume_args


def cmd_logs(args: argparse.Namespace) -> int:
    from acceptrun.run.lifecycle import show_logs

    record = open_run(args, args.run)
    show_logs(
        record, attempt=args.attempt, stderr_only=args.stderr_only, follow=args.follow,
        raw=args.raw,
    )  # fmt: skip
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    run = sub.add_parser("run", help="run a spec: preflight, supervise, verdict")
    run.add_argument("spec", type=file_arg, help="the run spec (TOML)")
    run.add_argument("-q", "--quiet", action="store_true", help="do not echo the workload's output")
    run.add_argument(
        "--existing",
        choices=("refuse", "move", "start"),
        default=None,
        help="what to do with files checkpoint.watch already matches before the first attempt "
        "(overrides checkpoint.existing): refuse, move them into the record, or start from them",
    )
    run.add_argument(
        "--inject",
        action="append",
        type=text(),
        default=[],
        metavar="FAULT",
        help="inject a fault for a drill: kill|term|hang|nan|oom|exit=N @step=N or @time=30s "
        "(kill and term only), optionally :attempt=K; repeatable",
    )
    run.add_argument(
        "--run-id",
        type=text(),
        help="id of the new record, chosen in advance by a queue or a batch job",
    )
    run.add_argument(
        "--prometheus-port",
        type=count(65535, example="9400"),
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics during the run (0: a free "
        "port); overrides telemetry.prometheus_port",
    )
    run.set_defaults(func=cmd_run)
    drill = sub.add_parser(
        "drill",
        help="run a spec clean, killed and preempted; time the recoveries",
    )
    drill.add_argument(
        "spec",
        type=file_arg,
        nargs="?",
        help="the run spec (TOML): a client workload, or a script with checkpoint.watch and "
        "progress.pattern (its preemption is skipped)",
    )
    drill.add_argument(
        "--campaign",
        nargs="?",
        const=_DEFAULT_CAMPAIGN,
        type=file_arg,
        metavar="FILE",
        help="a resilience campaign instead: the spec once per fault kind (a campaign file "
        "lists kinds and steps; default: every kind), each named, timed and compared "
        "(docs/campaign.md)",
    )
    drill.add_argument(
        "--json", action="store_true", help="with --campaign: print the scorecard as JSON"
    )
    drill.add_argument(
        "--tolerance",
        type=finite_float(least=0.0, most=1e6, example="0.01"),
        default=0.0,
        help="allowed relative difference of losses and metrics (default 0: bitwise equal)",
    )
    drill.add_argument("-v", "--verbose", action="store_true", help="echo the workload's output")
    drill.set_defaults(func=cmd_drill)
    ckpt = sub.add_parser(
        "ckpt", help="a run's checkpoints: list, verify, drill; plan the interval"
    )
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True, metavar="ACTION")
    cls = ckpt_sub.add_parser(
        "ls", help="checkpoints of a run, with sizes, metrics and mirror state"
    )
    add_run_argument(cls, default="latest")
    cls.set_defaults(func=cmd_ckpt_ls)
    cver = ckpt_sub.add_parser("verify", help="re-read and hash a checkpoint (default: LATEST)")
    add_run_argument(cver, default="latest")
    cver.add_argument("--step", type=count(MAX_STEP), help="the step to verify")
    cver.set_defaults(func=cmd_ckpt_verify)
    cdrill = ckpt_sub.add_parser(
        "drill", help="restore the latest checkpoint in a fresh process and run one step"
    )
    add_run_argument(cdrill, default="latest")
    cdrill.add_argument(
        "--cpu", action="store_true", help="hide the GPUs: prove it restores on CPU"
    )
    cdrill.add_argument(
        "--timeout",
        type=finite_float(above=0.0, most=MAX_DURATION_S, example="600"),
        default=600.0,
        help="seconds (default 600); a script without the client has that long to log a step "
        "after the checkpoint's",
    )
    cdrill.add_argument("-v", "--verbose", action="store_true", help="show the workload's output")
    cdrill.set_defaults(func=cmd_ckpt_drill)
    from acceptrun.cli import plan

    cplan = ckpt_sub.add_parser("plan", help=plan.HELP, description=plan.DESCRIPTION)
    plan.add_arguments(cplan)
    # The name before `ckpt plan`, kept for a release: no help= keeps it out of the list.
    old_plan = sub.add_parser("plan", description=f"{OLD_NAME % 'ckpt plan'} {plan.DESCRIPTION}")
    plan.add_arguments(old_plan)
    old_plan.set_defaults(renamed="ckpt plan")
    for action, func, summary in (
        ("stop", cmd_stop, "stop a running run gracefully: checkpoint, then exit"),
        ("kill", cmd_kill, "kill a run's workload now: no checkpoint, no restart"),
    ):
        lc = sub.add_parser(action, help=summary)
        add_run_argument(lc)
        lc.add_argument("--reason", type=text(), help="why, for the audit trail")
        lc.add_argument("--wait", action="store_true", help="wait for the verdict")
        lc.add_argument(
            "--timeout",
            type=finite_float(above=0.0, most=MAX_DURATION_S, example="300"),
            help="seconds to wait (default: grace period + 120); exit 1 after",
        )
        lc.set_defaults(func=func, action=action)
    resume = sub.add_parser(
        "resume", help="continue a stopped or failed run from its last checkpoint"
    )
    add_run_argument(resume)
    resume.add_argument(
        "--mirror",
        type=text(most=PATH_MAX),
        metavar="URL",
        help="fetch the newest checkpoint that verifies from this mirror if none is here",
    )
    resume.add_argument(
        "--from-mirror", action="store_true", help="the same, from the spec's checkpoint.mirror"
    )
    resume.add_argument(
        "--step",
        type=count(MAX_STEP),
        metavar="N",
        help="with --from-mirror or --mirror: resume from mirrored step N (default: the "
        "newest local checkpoint that verifies, else the newest mirrored one that does)",
    )
    resume.add_argument(
        "--from-scratch", action="store_true", help="start from step 0 when there is no checkpoint"
    )
    resume.add_argument("--force", action="store_true", help="resume even an ACCEPTED run")
    resume.add_argument("--reason", type=text(), help="why, for the audit trail")
    resume.add_argument(
        "-q", "--quiet", action="store_true", help="do not echo the workload's output"
    )
    resume.set_defaults(func=cmd_resume)
    gc = sub.add_parser("gc", help="free checkpoints across runs by retention and age (dry run)")
    gc.add_argument("--apply", action="store_true", help="delete; without it nothing changes")
    gc.add_argument(
        "--older-than",
        type=duration(zero_ok=True, example="30d"),
        metavar="DURATION",
        help="runs ended before this (e.g. 30d) lose all checkpoints but an accepted "
        "run's newest verified one",
    )
    gc.add_argument(
        "--keep-rejected",
        action="store_true",
        help="old runs that were not accepted keep what retention keeps",
    )
    gc.add_argument(
        "--include-quarantine",
        action="store_true",
        help="also delete quarantined checkpoints (kept by default as evidence)",
    )
    gc.set_defaults(func=cmd_gc)
    spec = sub.add_parser("spec", help="check a spec, or print its JSON Schema")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True, metavar="ACTION")
    check = spec_sub.add_parser("check", help="validate a spec without running it")
    check.add_argument("file", type=file_arg)
    check.set_defaults(func=cmd_spec_check)
    schema = spec_sub.add_parser("schema", help="print the JSON Schema of run specs (for editors)")
    schema.set_defaults(func=cmd_spec_schema)
    docs = spec_sub.add_parser("docs", help="print the spec reference (Markdown)")
    docs.set_defaults(func=cmd_spec_docs)
    init = sub.add_parser("init", help="write a commented starter spec")
    init.add_argument("file", nargs="?", type=path_arg, default="acceptrun.toml")
    init.add_argument("--name", type=text(), help="run name (default: this directory's name)")
    init.add_argument(
        "--command", type=text(most=PATH_MAX), default="python train.py", help="the job's command"
    )
    init.add_argument(
        "--own-checkpoints", type=text(most=PATH_MAX), metavar="PATH",
        help="the checkpoint the script saves itself, a path or glob in the workdir (e.g. "
        "out/ckpt.pt): writes checkpoint.watch, resume_args and [progress] for it",
    )  # fmt: skip
    init.add_argument(
        "--resume-args", type=text(most=PATH_MAX), metavar="ARGS",
        help="with --own-checkpoints: the arguments the script resumes with, {checkpoint} for "
        "the restored path (--resume-args='--resume {checkpoint}')",
    )  # fmt: skip
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(func=cmd_init)
    logs = sub.add_parser("logs", help="print a run's stdout and stderr; -f follows it")
    add_run_argument(logs, default="latest")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the run ends"
    )
    logs.add_argument("--attempt", type=positive_int(MAX_STEP), metavar="N", help="only attempt N")
    logs.add_argument("--stderr-only", action="store_true", help="only stderr")
    logs.add_argument(
        "--raw",
        action="store_true",
        help="the workload's bytes as it wrote them: not redacted, control characters "
        "(colours, titles, clipboard writes) sent to the terminal as they are",
    )
    logs.set_defaults(func=cmd_logs)
