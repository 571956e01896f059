"""``acceptrun ui``: a local web board of runs, live runs, comparisons, the queue and the spend.

Layout: :mod:`~acceptrun.ui.board` reads the workspaces (index, records) and thins
series; :mod:`~acceptrun.ui.pages` renders the layout and the run pages,
:mod:`~acceptrun.ui.compare`, :mod:`~acceptrun.ui.pool` and :mod:`~acceptrun.ui.spend`
the others; :mod:`~acceptrun.ui.live` serves
the live feeds (server-sent events); :mod:`~acceptrun.ui.server` is the HTTP server and
its security rules; :mod:`~acceptrun.ui.assets` holds the stylesheet and the one script;
:mod:`~acceptrun.cli.ui` registers the command. Standard library only.

>>> server = make_server(Board.for_workspaces([find_workspace()]), token="s3cret")
>>> server.serve_forever()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from acceptrun.ui.board import Board, RunFilter
    from acceptrun.ui.server import BoardServer, make_server

__all__ = ["Board", "BoardServer", "RunFilter", "make_server"]


def __getattr__(name: str) -> object:
    # Imported on first use: every `acceptrun` command registers `ui` (cli/ui.py), and the
    # server with its pages and the report's stylesheet is only needed by `acceptrun ui`.
    if name in ("Board", "RunFilter"):
        from acceptrun.ui import board

        return getattr(board, name)
    if name in ("BoardServer", "make_server"):
        from acceptrun.ui import server

        return getattr(server, name)
    raise AttributeError(f"module 'acceptrun.ui' has no attribute {name!r}")
