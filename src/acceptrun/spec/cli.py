"""``acceptrun spec check|schema|docs`` and ``acceptrun init``: the spec's commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger

__all__ = ["register"]

_log = get_logger(__name__)
_say = _log.info


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


def register(sub: argparse._SubParsersAction[Any]) -> None:
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
