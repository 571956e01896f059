"""The ``acceptrun`` command. The only place that catches acceptrun errors.

Exit codes: 0 success (a run ACCEPTED), 1 a run REJECTED or a damaged record,
2 bad input (spec, paths, data, failed preflight), 130 interrupted.
Imports stay lazy so ``acceptrun --help`` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sqlite3
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acceptrun._util.console import configure_console
from acceptrun.errors import AcceptrunError

__all__ = ["main"]

# Command groups defined beside their code: each module has ``register(sub)``, which adds
# its subcommands to the top-level subparsers. Those modules keep their imports lazy too.
COMMAND_MODULES: tuple[str, ...] = (
    "acceptrun.queue.cli",
    "acceptrun.telemetry.cli",
    "acceptrun.tune.cli",
    "acceptrun.tune.scaling",
    "acceptrun.report.cli",
    "acceptrun.backends.cli",
    "acceptrun.ui.cli",
)


def _say(message: str) -> None:
    print(f"acceptrun: {message}", file=sys.stderr, flush=True)


def _workspace(args: argparse.Namespace, create: bool = False) -> Any:
    from acceptrun.record.workspace import find_workspace

    return find_workspace(args.workspace, create=create)


# ---- commands ---------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from acceptrun.run.launch import launch
    from acceptrun.verdict.core import format_verdict

    result = launch(
        args.spec, workspace=args.workspace, echo=not args.quiet, say=_say, inject=args.inject,
        run_id=args.run_id, prometheus_port=args.prometheus_port,
    )  # fmt: skip
    print()
    print(format_verdict(result.verdict, name=result.spec.name))
    print(f"record: {result.record.path}")
    return result.exit_code


# ---- operations drill (acceptrun.run.drills.operations) ----
def cmd_drill(args: argparse.Namespace) -> int:
    from acceptrun.run.drills.operations import format_drill, run_ops_drill

    report = run_ops_drill(
        args.spec,
        workspace=args.workspace,
        tolerance=args.tolerance,
        echo=args.verbose,
        say=_say,
    )
    print()
    print(format_drill(report))
    return 0 if report.ok else 1


# ---- end of operations drill ----


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
    lim = spec.limits
    print(f"{args.file}: ok" + (f" ({len(findings)} warning(s))" if findings else ""))
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
    return 0


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
    from acceptrun.errors import UserError
    from acceptrun.spec.model import parse_spec
    from acceptrun.spec.schema import starter_spec

    path = Path(args.file)
    if path.exists() and not args.force:
        raise UserError(
            f"{path} already exists; pass --force to overwrite it, or give another file name"
        )
    text = starter_spec(name=args.name or Path.cwd().name, command=args.command)
    parse_spec(text, source=str(path))  # the starter must always validate
    write_atomic(path, text)
    print(
        f"wrote {path}; edit it, check it with `acceptrun spec check {path}`, run it with `acceptrun run {path}`"
    )
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from acceptrun.capture import provenance

    prov = provenance.capture()
    print(
        json.dumps(prov, indent=2, sort_keys=True)
        if args.json
        else provenance.format_provenance(prov)
    )
    return 0


def cmd_env_diff(args: argparse.Namespace) -> int:
    from acceptrun.capture import provenance
    from acceptrun.errors import RecordError

    ws = _workspace(args)
    provs = []
    for ref in (args.run_a, args.run_b):
        rec = ws.get_run(ref)
        prov = rec.read_json("provenance.json")
        if prov is None:
            raise RecordError(
                f"run {rec.run_id} has no provenance.json (it stopped before preflight)"
            )
        provs.append(prov)
    print(provenance.format_diff(provenance.diff(provs[0], provs[1])))
    return 0


def cmd_data_snapshot(args: argparse.Namespace) -> int:
    from acceptrun.capture import data

    exclude = list(args.exclude)
    out = Path(args.output)
    src = Path(args.path)
    if "://" not in args.path and src.is_dir() and out.resolve().is_relative_to(src.resolve()):
        exclude.append(
            out.resolve().relative_to(src.resolve()).as_posix()
        )  # never hash the manifest itself
    manifest = data.snapshot(args.path, exclude=exclude)
    data.write_manifest(out, manifest)
    print(
        f"{out}: {manifest['count']} files, {manifest['total_bytes']:,} bytes, root {manifest['root_hash']}"
    )
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    from acceptrun.capture import data

    result = data.verify(args.path, data.load_manifest(args.manifest), ignore=[args.manifest])
    print(data.format_verify(result, manifest_path=args.manifest))
    return 0 if result.ok else 2


def _listed_workspaces() -> tuple[list[tuple[str, Any]], list[str]]:
    """The user's listed workspaces that exist as (project, Workspace); notes on the others."""
    from acceptrun.record import registry
    from acceptrun.record.workspace import Workspace

    found, notes = [], []
    for entry in registry.listed():
        if entry.exists:
            found.append((entry.project, Workspace(entry.path)))
        else:
            notes.append(f"skipped {entry.path} ({entry.project}): it no longer exists")
    if not found and not notes:
        notes.append(
            f"no workspace is listed in {registry.config_dir() / registry.FILE}; "
            "`acceptrun run SPEC` lists the one it uses"
        )
    return found, notes


def cmd_ls_all(args: argparse.Namespace) -> int:
    from acceptrun.record.liveness import interrupted_note, interruption
    from acceptrun.spec.model import format_duration

    workspaces, notes = _listed_workspaces()
    rows = []
    for project, ws in workspaces:
        try:
            rows += [(project, r) for r in ws.list_runs()]
        except (AcceptrunError, OSError, sqlite3.Error) as exc:
            notes.append(f"skipped {ws.root} ({project}): {exc}")
    rows.sort(key=lambda pr: pr[1].run_id)  # run ids start with their UTC start time
    width = max([len("PROJECT"), *(len(p) for p, _ in rows)])
    if rows:
        print(
            f"{'PROJECT':<{width}} {'RUN':<40} {'STATUS':<16} {'VERDICT':<9} {'ATT':>3} {'DURATION':>9}"
        )
    for project, r in rows[-args.limit :]:
        status = r.status
        if gone := interruption(r.path, r.status):  # its supervisor died (record/liveness.py)
            status, notes = "interrupted", [*notes, interrupted_note(r.run_id, gone)]
        print(
            f"{project:<{width}} {r.run_id:<40} {status:<16} {(r.verdict or '-'):<9} "
            f"{r.attempts:>3} {format_duration(r.duration_s):>9}"
        )
    if not rows:
        print("no runs yet in any listed workspace")
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from acceptrun.record.liveness import interrupted_note, interruption
    from acceptrun.spec.model import format_duration

    if args.all:
        return cmd_ls_all(args)
    rows = _workspace(args).list_runs()
    if not rows:
        print("no runs yet; start one with `acceptrun run SPEC`")
        return 0
    print(f"{'RUN':<40} {'STATUS':<16} {'VERDICT':<9} {'ATT':>3} {'DURATION':>9}")
    notes: list[str] = []
    for r in rows[-args.limit :]:
        status = r.status
        if gone := interruption(r.path, r.status):  # its supervisor died (record/liveness.py)
            status, notes = "interrupted", [*notes, interrupted_note(r.run_id, gone)]
        print(
            f"{r.run_id:<40} {status:<16} {(r.verdict or '-'):<9} {r.attempts:>3} {format_duration(r.duration_s):>9}"
        )
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from acceptrun.report import format_show
    from acceptrun.report.terminal import show_dict

    record = _workspace(args).get_run(args.run)
    if args.json:
        print(json.dumps(show_dict(record), indent=2))
    else:
        print(format_show(record))
    return 0


def _store_of(record: Any) -> Any:
    from acceptrun.checkpoint.store import CheckpointStore
    from acceptrun.spec.model import load_spec

    spec = load_spec(record.spec_path)
    root = (
        Path(spec.resolve_path(spec.checkpoint.dir))
        if spec.checkpoint.dir
        else record.checkpoints_dir
    )
    return CheckpointStore(root)


def cmd_ckpt_ls(args: argparse.Namespace) -> int:
    record = _workspace(args).get_run(args.run)
    store = _store_of(record)
    infos = store.list()
    if not infos:
        print(f"no checkpoints in {store.root}")
        return 0
    latest = store.latest()
    mirror = {
        int(k): v for k, v in (record.read_json("mirror.json") or {}).get("steps", {}).items()
    }
    print(f"{'STEP':>8}  {'CREATED':<24} {'SIZE':>10} {'FILES':>5}  {'MIRROR':<8} METRICS")
    for i in infos:
        mark = "*" if latest is not None and i.step == latest.step else " "
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(i.metrics.items()))
        state = mirror.get(i.step, {}).get("state", "-")
        print(
            f"{i.step:>7}{mark}  {i.created_at:<24} {i.total_bytes / 1e6:>8.1f}MB {len(i.files):>5}  {state:<8} {metrics}"
        )
    print(f"(* = LATEST; {store.root})")
    return 0


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    record = _workspace(args).get_run(args.run)
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

    record = _workspace(args).get_run(args.run)
    _say(f"restore drill of {record.run_id}{' on CPU' if args.cpu else ''}")
    result = restore_drill(record, cpu=args.cpu, timeout=args.timeout, echo=args.verbose)
    print(f"restore drill {'PASSED' if result.ok else 'FAILED'}: {result.evidence}")
    print(f"logs: {result.log_dir}")
    return 0 if result.ok else 1


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    ws = _workspace(args)
    count, skipped = ws.rebuild_index()
    print(f"indexed {count} runs from {ws.runs_dir}")
    for s in skipped:
        print(f"  skipped {s}: run.json missing or damaged")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from acceptrun.run.lifecycle import ENDED, load_verdict, request_stop, stop_promise, wait_closed
    from acceptrun.spec.model import load_spec
    from acceptrun.verdict.core import format_verdict

    record = _workspace(args).get_run(args.run)
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

    record = _workspace(args).get_run(args.run)
    result = resume_run(
        record, mirror=args.mirror, from_mirror=args.from_mirror, force=args.force,
        from_scratch=args.from_scratch, reason=args.reason, echo=not args.quiet, say=_say,
    )  # fmt: skip
    print()
    print(format_verdict(result.verdict, name=result.spec.name))
    print(f"record: {record.path}")
    return result.exit_code


def cmd_logs(args: argparse.Namespace) -> int:
    from acceptrun.run.lifecycle import show_logs

    record = _workspace(args).get_run(args.run)
    show_logs(
        record, attempt=args.attempt, stderr_only=args.stderr_only, follow=args.follow, say=_say
    )
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from acceptrun.record.workspace import RunRecord
    from acceptrun.run.retention import GcOptions, apply_plan, format_gc, parse_age, plan_gc

    older_than = parse_age(args.older_than) if args.older_than is not None else None
    ws = _workspace(args)
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


# ---- cost (acceptrun.cost) ----
def cmd_prices(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import format_prices, load_catalog
    from acceptrun.record.workspace import find_workspace

    root = None
    try:
        root = find_workspace(args.workspace).root
    except AcceptrunError:  # no workspace: the packaged catalog alone
        root = None
    print(format_prices(load_catalog(root)))
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import format_summary, parse_since, select_ledgers, summarize

    since = parse_since(args.since) if args.since else None
    if args.all:
        return cmd_cost_all(args, since)
    ws = _workspace(args)
    ledgers, live = select_ledgers(
        ws, load_catalog(ws.root), since=since,
        spec=args.spec, provider=args.provider, gpu=args.gpu,
    )  # fmt: skip
    summary = summarize(ledgers)
    if args.json:
        print(json.dumps({**summary, "live": live}, indent=2))
    else:
        print(format_summary(summary, live=live))
    return 0


def cmd_cost_all(args: argparse.Namespace, since: Any) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import format_by_workspace, select_ledgers, summarize

    workspaces, notes = _listed_workspaces()
    rows, every, live = [], [], []
    for project, ws in workspaces:
        try:
            ledgers, running = select_ledgers(
                ws, load_catalog(ws.root), since=since,
                spec=args.spec, provider=args.provider, gpu=args.gpu,
            )  # fmt: skip
        except (AcceptrunError, OSError) as exc:
            notes.append(f"skipped {ws.root} ({project}): {exc}")
            continue
        rows.append({"project": project, "workspace": str(ws.root), **summarize(ledgers)})
        every += ledgers
        live += running
    total = summarize(every)
    if args.json:
        print(
            json.dumps({"workspaces": rows, "total": total, "live": live, "notes": notes}, indent=2)
        )
    else:
        print(format_by_workspace(rows, total, live=live, notes=notes))
    return 0


def cmd_cost_add(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.ledger import add_costs, build_ledger

    ws = _workspace(args)
    record = ws.get_run(args.run)
    add_costs(
        record, human_minutes=args.human_minutes, rate_per_hour=args.rate,
        switching_usd=args.switching_usd, note=args.note,
    )  # fmt: skip
    ledger = build_ledger(record, load_catalog(ws.root))
    t = ledger["totals"]
    print(
        f"{record.run_id}: people ${t['human_usd']:,.2f}, switching ${t['switching_usd']:,.2f}, "
        f"total ${ledger['total_usd']:,.2f}"
    )
    return 0


def cmd_cost_show(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import format_ledger, ledger_for

    ws = _workspace(args)
    ledger = ledger_for(ws.get_run(args.run), load_catalog(ws.root))
    print(json.dumps(ledger, indent=2) if args.json else format_ledger(ledger))
    return 0


def cmd_cost_whatif(args: argparse.Namespace) -> int:
    from acceptrun.cost.catalog import load_catalog
    from acceptrun.cost.report import format_projection, ledger_for, project
    from acceptrun.errors import UserError

    ws = _workspace(args)
    record = ws.get_run(args.run)
    provider, sep, instance = args.on.partition(":")
    if not sep or not provider or not instance:
        raise UserError(
            f"--on: {args.on!r} is not PROVIDER:INSTANCE; e.g. --on lambda:gpu_1x_h100_sxm5 "
            "(`acceptrun prices` lists them)"
        )
    catalog = load_catalog(ws.root)
    target = catalog.lookup(provider, instance)
    projection = project(ledger_for(record, catalog), target)
    print(json.dumps(projection, indent=2) if args.json else format_projection(projection))
    return 0


# ---- end of cost ----


# ---- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from acceptrun import __version__

    p = argparse.ArgumentParser(
        prog="acceptrun",
        description="Turn GPU time into accepted runs: spec, provenance, verified data, supervision, verdict.",
    )
    p.add_argument("--version", action="version", version=f"acceptrun {__version__}")
    p.add_argument(
        "--workspace",
        metavar="DIR",
        help="workspace directory (default: nearest .acceptrun/, or $ACCEPTRUN_WORKSPACE)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a spec: preflight, supervise, verdict")
    run.add_argument("spec", help="the run spec (TOML)")
    run.add_argument("-q", "--quiet", action="store_true", help="do not echo the workload's output")
    run.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="FAULT",
        help="inject a fault for a drill: kill|term|hang|nan|oom|exit=N @step=N or @time=30s "
        "(kill and term only), optionally :attempt=K; repeatable",
    )
    run.add_argument(
        "--run-id", help="id of the new record, chosen in advance by a queue or a batch job"
    )
    run.add_argument(
        "--prometheus-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics during the run (0: a free "
        "port); overrides telemetry.prometheus_port",
    )
    run.set_defaults(func=cmd_run)

    # ---- operations drill ----
    drill = sub.add_parser(
        "drill",
        help="operations drill: run a spec clean, then killed and preempted; compare, time the recoveries",
    )
    drill.add_argument(
        "spec",
        help="the run spec (TOML): a client workload, or a script with checkpoint.watch and "
        "progress.pattern (its preemption is skipped)",
    )
    drill.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="allowed relative difference of losses and metrics (default 0: bitwise equal)",
    )
    drill.add_argument("-v", "--verbose", action="store_true", help="echo the workload's output")
    drill.set_defaults(func=cmd_drill)
    # ---- end of operations drill ----

    spec = sub.add_parser("spec", help="check a spec, or print its JSON Schema")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True, metavar="ACTION")
    check = spec_sub.add_parser("check", help="validate a spec without running it")
    check.add_argument("file")
    check.set_defaults(func=cmd_spec_check)
    schema = spec_sub.add_parser("schema", help="print the JSON Schema of run specs (for editors)")
    schema.set_defaults(func=cmd_spec_schema)
    docs = spec_sub.add_parser("docs", help="print the spec reference (Markdown)")
    docs.set_defaults(func=cmd_spec_docs)

    init = sub.add_parser("init", help="write a commented starter spec")
    init.add_argument("file", nargs="?", default="acceptrun.toml")
    init.add_argument("--name", help="run name (default: this directory's name)")
    init.add_argument("--command", default="python train.py", help="the job's command")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(func=cmd_init)

    env = sub.add_parser("env", help="print this machine's provenance, or diff two runs'")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=cmd_env)
    env_sub = env.add_subparsers(dest="env_command", metavar="ACTION")
    ediff = env_sub.add_parser("diff", help="what changed between two runs' environments")
    ediff.add_argument("run_a")
    ediff.add_argument("run_b")
    ediff.set_defaults(func=cmd_env_diff)

    data = sub.add_parser("data", help="snapshot data into a manifest, or verify it")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    snap = data_sub.add_parser("snapshot", help="hash every file of PATH into a manifest")
    snap.add_argument("path", help="directory, file or fsspec URL")
    snap.add_argument("-o", "--output", required=True, help="manifest file to write")
    snap.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out matching files (repeatable)",
    )
    snap.set_defaults(func=cmd_data_snapshot)
    ver = data_sub.add_parser("verify", help="check PATH against a manifest")
    ver.add_argument("path")
    ver.add_argument("manifest")
    ver.set_defaults(func=cmd_data_verify)

    ls = sub.add_parser("ls", help="list runs in the workspace")
    ls.add_argument("-n", "--limit", type=int, default=50, help="show the newest N (default 50)")
    ls.add_argument(
        "--all", action="store_true", help="runs of every workspace in the user's list, together"
    )
    ls.set_defaults(func=cmd_ls)

    show = sub.add_parser("show", help="a run at a glance: verdict, attempts, steps, metrics")
    show.add_argument("run", nargs="?", default="latest", help="run id, unique prefix, or latest")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)

    ckpt = sub.add_parser("ckpt", help="list, verify and drill a run's checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="ckpt_command", required=True, metavar="ACTION")
    cls = ckpt_sub.add_parser(
        "ls", help="checkpoints of a run, with sizes, metrics and mirror state"
    )
    cls.add_argument("run", nargs="?", default="latest")
    cls.set_defaults(func=cmd_ckpt_ls)
    cver = ckpt_sub.add_parser("verify", help="re-read and hash a checkpoint (default: LATEST)")
    cver.add_argument("run", nargs="?", default="latest")
    cver.add_argument("--step", type=int, help="the step to verify")
    cver.set_defaults(func=cmd_ckpt_verify)
    cdrill = ckpt_sub.add_parser(
        "drill", help="restore the latest checkpoint in a fresh process and run one step"
    )
    cdrill.add_argument("run", nargs="?", default="latest")
    cdrill.add_argument(
        "--cpu", action="store_true", help="hide the GPUs: prove it restores on CPU"
    )
    cdrill.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds (default 600); a script without the client has that long to log a step "
        "after the checkpoint's",
    )
    cdrill.add_argument("-v", "--verbose", action="store_true", help="show the workload's output")
    cdrill.set_defaults(func=cmd_ckpt_drill)

    for action, func, text in (
        ("stop", cmd_stop, "stop a running run gracefully: checkpoint, then exit"),
        ("kill", cmd_kill, "kill a running run's workload now: no checkpoint, no restart"),
    ):
        lc = sub.add_parser(action, help=text)
        lc.add_argument("run", help="run id, unique prefix, or latest")
        lc.add_argument("--reason", help="why, for the audit trail")
        lc.add_argument("--wait", action="store_true", help="wait for the verdict")
        lc.add_argument(
            "--timeout",
            type=float,
            help="seconds to wait (default: grace period + 120); exit 1 after",
        )
        lc.set_defaults(func=func, action=action)

    resume = sub.add_parser(
        "resume", help="continue a stopped or failed run from its last checkpoint"
    )
    resume.add_argument("run", help="run id, unique prefix, or latest")
    resume.add_argument(
        "--mirror",
        metavar="URL",
        help="fetch the newest checkpoint from this mirror if none is here",
    )
    resume.add_argument(
        "--from-mirror", action="store_true", help="the same, from the spec's checkpoint.mirror"
    )
    resume.add_argument(
        "--from-scratch", action="store_true", help="start from step 0 when there is no checkpoint"
    )
    resume.add_argument("--force", action="store_true", help="resume even an ACCEPTED run")
    resume.add_argument("--reason", help="why, for the audit trail")
    resume.add_argument(
        "-q", "--quiet", action="store_true", help="do not echo the workload's output"
    )
    resume.set_defaults(func=cmd_resume)

    logs = sub.add_parser("logs", help="print a run's stdout and stderr; -f follows it")
    logs.add_argument("run", nargs="?", default="latest", help="run id, unique prefix, or latest")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the run ends"
    )
    logs.add_argument("--attempt", type=int, metavar="N", help="only attempt N")
    logs.add_argument("--stderr-only", action="store_true", help="only stderr")
    logs.set_defaults(func=cmd_logs)

    gc = sub.add_parser(
        "gc", help="free checkpoint space across runs by retention and age (dry run by default)"
    )
    gc.add_argument("--apply", action="store_true", help="delete; without it nothing changes")
    gc.add_argument(
        "--older-than",
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

    index = sub.add_parser("index", help="maintain the workspace index")
    index_sub = index.add_subparsers(dest="index_command", required=True, metavar="ACTION")
    rebuild = index_sub.add_parser("rebuild", help="recreate index.sqlite from the run directories")
    rebuild.set_defaults(func=cmd_index_rebuild)

    # ---- cost ----
    prices = sub.add_parser("prices", help="the price catalog: instances, prices, billing rules")
    prices.set_defaults(func=cmd_prices)

    cost = sub.add_parser(
        "cost", help="what runs cost: totals, split, cost per accepted run; show, add, whatif"
    )
    cost.add_argument("--since", metavar="DATE", help="runs created on or after DATE (2026-11-01)")
    cost.add_argument("--spec", metavar="NAME", help="runs of the spec with this name")
    cost.add_argument("--provider", metavar="P", help="runs priced on this provider")
    cost.add_argument("--gpu", metavar="G", help="runs on this GPU model (e.g. H100)")
    cost.add_argument(
        "--all", action="store_true", help="every workspace in the user's list, by project"
    )
    cost.add_argument("--json", action="store_true")
    cost.set_defaults(func=cmd_cost)
    cost_sub = cost.add_subparsers(dest="cost_command", metavar="ACTION")
    cadd = cost_sub.add_parser("add", help="add people's time or a switching cost to a run")
    cadd.add_argument("run", help="run id, unique prefix, or latest")
    cadd.add_argument("--human-minutes", type=float, metavar="MIN", help="minutes people spent")
    cadd.add_argument("--rate", type=float, metavar="USD", help="their rate in USD per hour")
    cadd.add_argument("--switching-usd", type=float, metavar="USD", help="a one-off cost in USD")
    cadd.add_argument("--note", help="what it was for")
    cadd.set_defaults(func=cmd_cost_add)
    cshow = cost_sub.add_parser("show", help="one run's cost ledger")
    cshow.add_argument("run", nargs="?", default="latest", help="run id, unique prefix, or latest")
    cshow.add_argument("--json", action="store_true")
    cshow.set_defaults(func=cmd_cost_show)
    cwhat = cost_sub.add_parser(
        "whatif", help="project a run's cost on another instance (same wall time)"
    )
    cwhat.add_argument("run", help="run id, unique prefix, or latest")
    cwhat.add_argument("--on", required=True, metavar="PROVIDER:INSTANCE")
    cwhat.add_argument("--json", action="store_true")
    cwhat.set_defaults(func=cmd_cost_whatif)
    # ---- end of cost ----
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_console()  # the library's log lines: "acceptrun: ..." on stderr
    try:
        code: int = args.func(args)
        return code
    except AcceptrunError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
