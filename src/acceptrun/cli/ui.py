"""``acceptrun ui``: serve the board of one workspace (or of every listed one) on loopback.

Registered through ``acceptrun.cli.main.COMMANDS``; the server is imported only when
the command runs, so ``acceptrun --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import secrets
from typing import Any

from acceptrun._util.argtypes import count, path_arg, text
from acceptrun._util.console import get_logger, show_secret

__all__ = ["ENV_TOKEN", "register"]

ENV_TOKEN = "ACCEPTRUN_UI_TOKEN"
DEFAULT_PORT = 8765


_log = get_logger("acceptrun.ui")  # printed by the CLI as "acceptrun: ..." on stderr


def cmd_ui(args: argparse.Namespace) -> int:
    from acceptrun.errors import UserError
    from acceptrun.record.workspace import find_workspace
    from acceptrun.ui.board import Board
    from acceptrun.ui.server import is_loopback, make_server

    if args.all:
        from acceptrun.cli.record import listed_workspaces

        listed, notes = listed_workspaces()  # the user's own (notes: gone, other users')
        found = [ws for _, ws in listed]
        if not found:
            raise UserError(
                f"no listed workspace of yours exists ({'; '.join(notes)}); pass "
                "--workspace PATH to show one"
            )
        board = Board.for_workspaces(found, notes)
    else:
        board = Board.for_workspaces([find_workspace(args.ui_workspace or args.workspace)])
    token = args.token or os.environ.get(ENV_TOKEN) or secrets.token_urlsafe(24)
    if len(token) < 16:
        raise UserError(
            f"the token is {len(token)} characters long; give at least 16 "
            f"(--token or ${ENV_TOKEN}), or leave both unset to have one generated"
        )
    if not is_loopback(args.host):
        _log.warning(
            f"listening on {args.host}: reachable from other machines; every request needs "
            "the token, and the traffic is plain HTTP (use an SSH tunnel where you can)"
        )
    server = make_server(board, args.host, args.port, token)
    shown = ", ".join(str(w.root) for _, w in board.workspaces)
    print(f"acceptrun ui: {len(board.workspaces)} workspace(s): {shown}", flush=True)
    # The token is the one secret this command exists to show its owner: past the redactor.
    show_secret(f"open {server.url()}?token={token}")
    show_secret(f"token (for the forms, or {ENV_TOKEN}): {token}")
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        server.stopping.set()
        server.server_close()
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``ui``."""
    p = sub.add_parser("ui", help="a local web board: runs, live runs, compare, queue, spend")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--workspace", dest="ui_workspace", type=path_arg, metavar="DIR",
        help="the workspace to show (default: as for every command)",
    )  # fmt: skip
    where.add_argument(
        "--all", action="store_true", help="every workspace in the user's list, together"
    )
    p.add_argument(
        "--host", type=text(most=253), default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; another one also answers other peers)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=count(65535, example=str(DEFAULT_PORT)), default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0 picks a free one)",
    )  # fmt: skip
    p.add_argument(
        "--token",
        type=text(),
        help=f"the token every page and action needs, on loopback too (default ${ENV_TOKEN}, "
        "else generated); the board lives under a path prefix made from it, where its "
        "cookie is scoped, so another service on 127.0.0.1 is never sent the token",
    )
    p.set_defaults(func=cmd_ui)
