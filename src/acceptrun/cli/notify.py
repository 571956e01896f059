"""``acceptrun watch``: follow workspaces and tell each run's targets when its supervisor dies.

Registered through ``acceptrun.cli.main.COMMANDS``; imports stay inside the command.
"""

from __future__ import annotations

import argparse
from typing import Any

from acceptrun._util.console import get_logger

__all__ = ["register"]

_log = get_logger("acceptrun.notify")  # printed by the CLI as "acceptrun: ..." on stderr


def cmd_watch(args: argparse.Namespace) -> int:
    from acceptrun.errors import UserError
    from acceptrun.notify.watch import Watcher
    from acceptrun.record.workspace import Workspace, find_workspace
    from acceptrun.spec.units import parse_duration

    try:
        every = parse_duration(args.every, "--every")
    except ValueError as exc:
        raise UserError(f"--every {args.every!r}: {exc}; e.g. --every 2s") from None
    if every <= 0:
        raise UserError(f"--every {args.every!r} is not a positive duration; e.g. --every 2s")
    if args.all:
        from acceptrun.record import registry

        workspaces = [Workspace(e.path) for e in registry.listed() if e.exists]
        if not workspaces:
            raise UserError("no listed workspace exists; pass --workspace DIR")
    else:
        workspaces = [find_workspace(args.watch_workspace or args.workspace)]
    watcher = Watcher(workspaces)
    shown = ", ".join(str(w.root) for w in workspaces)
    if args.once:
        found = watcher.check()
        watcher.settle(120.0)
        _log.info(f"watch: {found} gone supervisor(s) found in {shown}")
        return 0
    _log.info(f"watch: following {shown} every {every:g} s (Ctrl-C ends it)")
    try:
        watcher.run(float(every))
    except KeyboardInterrupt:
        watcher.settle(10.0)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``watch``."""
    p = sub.add_parser("watch", help="tell [notify] targets when a run's supervisor is gone")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--workspace", dest="watch_workspace", metavar="DIR",
        help="the workspace to follow (default: as for every command)",
    )  # fmt: skip
    where.add_argument("--all", action="store_true", help="every workspace in the user's list")
    p.add_argument("--every", default="5s", help='seconds between checks, e.g. "2s" (default 5s)')
    p.add_argument(
        "--once", action="store_true",
        help="check once, deliver what it found, and exit (for cron)",
    )  # fmt: skip
    p.set_defaults(func=cmd_watch)
