"""``acceptrun top``: registered through ``acceptrun.cli.main.COMMANDS``."""

from __future__ import annotations

import argparse
from typing import Any

from acceptrun._util.argtypes import finite_float

__all__ = ["register"]


def cmd_top(args: argparse.Namespace) -> int:
    from acceptrun.errors import UserError
    from acceptrun.record.workspace import find_workspace
    from acceptrun.report.top import top

    if args.interval <= 0:
        raise UserError(
            f"--interval is {args.interval:g}; give a positive number of seconds, e.g. 2"
        )
    ws = find_workspace(args.workspace)
    return top(ws, interval=args.interval, once=args.once, as_json=args.json)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``top``."""
    p = sub.add_parser(
        "top",
        help="running runs, live: step, throughput, ETA, use, cost so far",
    )
    p.add_argument(
        "-n",
        "--interval",
        type=finite_float(least=0.1, most=86400.0, example="2"),
        default=2.0,
        help="seconds between refreshes (default 2)",
    )
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--json", action="store_true", help="print the rows as JSON once and exit")
    p.set_defaults(func=cmd_top)
