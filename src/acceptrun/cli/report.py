"""Commands of the verdict's last mile: report, bundle, reproduce, diff, portability, howto.

Registered through ``acceptrun.cli.main.COMMANDS``; imports stay inside the command
functions so ``acceptrun --help`` loads none of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import file_arg
from acceptrun.cli.record import add_run_argument, find, open_run

__all__ = ["register"]


# What marks each format of `report -o FILE` as acceptrun's own earlier output, so that
# writing it again needs no --force (acceptrun._util.outputs).
_JSON_MARK = '"generator": "acceptrun report"'
_MD_MARK = "<!-- generator: acceptrun report -->"
_HTML_MARK = '<meta name="generator" content="acceptrun report">'


def cmd_report(args: argparse.Namespace) -> int:
    from acceptrun.report.data import report_data
    from acceptrun.report.html import REPORT_FILE, render_html
    from acceptrun.report.markdown import render_markdown

    record = open_run(args, args.run)
    output = Path(args.output) if args.output else None
    if output is not None:
        mark = {"json": _JSON_MARK, "md": _MD_MARK, "html": _HTML_MARK}[args.format]
        what = f"{args.format} report"
        from acceptrun._util.outputs import claim_output

        claim_output(output, mark=mark, force=args.force, what=what)  # before the rendering
    data = report_data(record)
    if args.format == "json":
        generator = {"generator": "acceptrun report"} if output is not None else {}
        text = json.dumps({**generator, **data}, indent=2, default=str)
    elif args.format == "md":
        text = render_markdown(data)
        text = f"{text}\n{_MD_MARK}\n" if output is not None else text  # last: # heading first
    else:
        text = render_html(data)
        text = text.replace("<head>", f"<head>{_HTML_MARK}", 1) if output is not None else text
    if output is None and args.format != "html":
        print(text)
        return 0
    if output is not None:
        from acceptrun._util.outputs import write_output

        write_output(output, text, mark=mark, force=args.force, what=what)
        target = output
    else:
        from acceptrun._util.durable import write_atomic

        target = record.file(REPORT_FILE)  # the record's own file: acceptrun's to replace
        write_atomic(target, text)
    print(target.resolve())
    if args.open:
        import webbrowser

        webbrowser.open(target.resolve().as_uri())
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from acceptrun.run.reproduce import reproduce
    from acceptrun.verdict.core import format_verdict

    found = find(args, args.run)  # the repeat is recorded beside the original
    ws, record = found.workspace, found.record
    result = reproduce(ws, record, worktree=args.worktree, echo=not args.quiet)
    print()
    print(format_verdict(result.verdict, name=result.spec.name))
    print(f"record: {result.record.path}")
    print(f"compare: acceptrun diff {record.run_id} {result.record.run_id}")
    code: int = result.exit_code
    return code


def cmd_diff(args: argparse.Namespace) -> int:
    from acceptrun.verdict.diff import diff_runs, format_run_diff

    d = diff_runs(open_run(args, args.run_a), open_run(args, args.run_b))
    print(json.dumps(d.to_dict(), indent=2, default=str) if args.json else format_run_diff(d))
    return 0 if d.reproduced else 1


def cmd_portability(args: argparse.Namespace) -> int:
    from acceptrun.verdict.portability import check_run, check_spec_file, format_portability

    target = Path(args.target)
    report = check_spec_file(target) if target.is_file() else check_run(open_run(args, args.target))
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_portability(report))
    return 1 if report.blockers else 0


def cmd_howto(args: argparse.Namespace) -> int:
    from acceptrun.report.howto import format_howto

    print(format_howto(open_run(args, args.run)))
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    from acceptrun.cost.billing import format_bytes
    from acceptrun.report.bundle import build_bundle, check_output

    record = open_run(args, args.run)
    path = check_output(Path(args.output), record, force=args.force)
    bundle = build_bundle(record, path, include_logs=args.include_logs)
    print(
        f"wrote {path}: run {record.run_id} ({format_bytes(bundle.bytes)}, "
        f"{len(bundle.files)} files, redacted; "
        f"README.txt inside says what it holds and what it left out ({len(bundle.left_out)} items))"
    )
    return 0


def _register_bundle(sub: argparse._SubParsersAction[Any]) -> None:
    bundle = sub.add_parser("bundle", help="one redacted archive of a run, for support (.tar.gz)")
    add_run_argument(bundle, default="latest")
    bundle.add_argument(
        "-o",
        "--output",
        required=True,
        type=file_arg,
        metavar="FILE",
        help="the archive to write (*.tar.gz)",
    )
    bundle.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    bundle.add_argument(
        "--include-logs",
        action="store_true",
        help="add each attempt's whole stdout and stderr, redacted",
    )
    bundle.set_defaults(func=cmd_bundle)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    _register_show(sub)
    _register_bundle(sub)
    report = sub.add_parser(
        "report", help="a run's report (HTML): verdict, five tests, charts, cost"
    )
    add_run_argument(report, default="latest")
    report.add_argument(
        "--format",
        choices=("html", "md", "json"),
        default="html",
        help="html (default: written into the record as report.html), md or json (printed)",
    )
    report.add_argument(
        "-o",
        "--output",
        type=file_arg,
        metavar="FILE",
        help="write here instead; an existing FILE is replaced only when it is an earlier "
        "report of the same format, or with --force",
    )
    report.add_argument(
        "--force", action="store_true", help="replace FILE even when it is not a report"
    )
    report.add_argument("--open", action="store_true", help="open it in the browser")
    report.set_defaults(func=cmd_report)

    rep = sub.add_parser("reproduce", help="run a recorded run again: frozen spec, commit and diff")
    add_run_argument(rep)
    rep.add_argument(
        "--worktree",
        action="store_true",
        help="always rebuild the code in a git worktree, even when the checkout matches",
    )
    rep.add_argument("-q", "--quiet", action="store_true", help="do not echo the workload's output")
    rep.set_defaults(func=cmd_reproduce)

    diff = sub.add_parser("diff", help="did RUN_B reproduce RUN_A? data, metrics, curve, outputs")
    add_run_argument(diff, "run_a", help="the original run (id, prefix or directory)")
    add_run_argument(diff, "run_b", help="the repeat (id, prefix or directory)")
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=cmd_diff)

    port = sub.add_parser(
        "portability", help="what ties a spec or run to one machine, and how to move it"
    )
    add_run_argument(port, "target", help="a spec file, or a run id / prefix / latest / directory")
    port.add_argument("--json", action="store_true")
    port.set_defaults(func=cmd_portability)

    howto = sub.add_parser("howto", help="the commands to repeat a run on another machine")
    add_run_argument(howto, default="latest")
    howto.set_defaults(func=cmd_howto)


def cmd_show(args: argparse.Namespace) -> int:
    from acceptrun.report.terminal import format_show, show_dict

    record = open_run(args, args.run)
    if args.json:
        print(json.dumps(show_dict(record), indent=2))
    else:
        print(format_show(record, explain=args.explain))
    return 0


def _register_show(sub: argparse._SubParsersAction[Any]) -> None:
    show = sub.add_parser("show", help="a run at a glance: verdict, attempts, steps, metrics")
    add_run_argument(show, default="latest")
    show.add_argument("--json", action="store_true")
    show.add_argument(
        "--explain",
        action="store_true",
        help="each verdict check's whole evidence (the model of the checkpoint interval, "
        "every attempt's class), wrapped; the plain verdict gives one line a check",
    )
    show.set_defaults(func=cmd_show)
