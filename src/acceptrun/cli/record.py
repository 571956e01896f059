"""``acceptrun ls`` and ``index rebuild``: the records of a workspace."""

from __future__ import annotations

import argparse
import sqlite3
from typing import TYPE_CHECKING, Any

from acceptrun._util.argtypes import MAX_STEP, path_arg, positive_int
from acceptrun._util.console import get_logger
from acceptrun.errors import AcceptrunError

if TYPE_CHECKING:
    from acceptrun.record.lookup import Found

__all__ = ["register"]

_log = get_logger(__name__)
_say = _log.info


RUN_HELP = (
    "run id, unique prefix or latest (looked up here, then in your other workspaces), "
    "or the run's directory"
)


def add_run_argument(
    parser: argparse.ArgumentParser,
    dest: str = "run",
    *,
    default: str | None = None,
    help: str = RUN_HELP,
    here_only: bool = False,
) -> None:
    """Declare a positional argument that names a run: every command that takes a run does
    it here, so that a unit test walking the parser finds the command. ``run_refs`` lists
    the arguments looked up through :func:`open_run` (any of the user's workspaces);
    ``here_only=True`` declares one the command looks up in the current workspace alone
    (``run_refs_here``), whose miss must say so (the phrase :data:`HERE_ONLY`)."""
    extra: dict[str, Any] = {} if default is None else {"nargs": "?", "default": default}
    parser.add_argument(dest, type=path_arg, help=help, **extra)  # an id, prefix or folder
    key = "run_refs_here" if here_only else "run_refs"
    parser.set_defaults(**{key: (*(parser.get_default(key) or ()), dest)})


# What the miss of a here-only run argument says, so that no one wonders why a run of
# another workspace is not found.
HERE_ONLY = "only this workspace is searched"


def find(args: argparse.Namespace, ref: str) -> Found:
    """The run a command names, with its workspace (:func:`acceptrun.record.lookup.find_run`)."""
    from acceptrun.record.lookup import find_run

    return find_run(ref, workspace=args.workspace)


def open_run(args: argparse.Namespace, ref: str) -> Any:
    """The run record a command names: its directory, or an id looked up in the current
    workspace and then in the user's other workspaces (:mod:`acceptrun.record.lookup`)."""
    return find(args, ref).record


def listed_workspaces() -> tuple[list[tuple[str, Any]], list[str]]:
    """The user's own listed workspaces that exist as (project, Workspace); notes on the
    others (gone, or of other users: counted, never read). What ``ls --all``, ``cost --all``
    and ``ui --all`` read."""
    from acceptrun.record import registry
    from acceptrun.record.workspace import Workspace

    found, notes = [], []
    mine = registry.owned()
    for entry in mine.workspaces:
        if entry.exists:
            found.append((entry.project, Workspace(entry.path)))
        else:
            notes.append(f"skipped {entry.path} ({entry.project}): it no longer exists")
    if (left_out := mine.note()) is not None:
        notes.append(left_out)
    if not found and not notes:
        notes.append(
            f"no workspace is listed in {registry.config_dir() / registry.FILE}; "
            "`acceptrun run SPEC` lists the one it uses"
        )
    return found, notes


def cmd_ls_all(args: argparse.Namespace) -> int:
    from acceptrun.record.liveness import interrupted_note, interruption
    from acceptrun.spec.model import format_duration

    workspaces, notes = listed_workspaces()
    rows = []
    for project, ws in workspaces:
        try:
            rows += [(project, r) for r in ws.list_runs()]
            if ws.index_note:
                notes.append(ws.index_note)
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
    from acceptrun.record.lookup import workspace_of
    from acceptrun.spec.model import format_duration

    if args.all:
        return cmd_ls_all(args)
    ws = workspace_of(args)
    rows = ws.list_runs()
    notes = unlisted_runs(ws, {r.run_id for r in rows})
    if ws.index_note:
        notes.insert(0, ws.index_note)
    if not rows:
        print("no readable runs" if notes else "no runs yet; start one with `acceptrun run SPEC`")
    else:
        print(f"{'RUN':<40} {'STATUS':<16} {'VERDICT':<9} {'ATT':>3} {'DURATION':>9}")
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


def unlisted_runs(ws: Any, listed: set[str]) -> list[str]:
    """Why each run directory on disk is missing from the listing: never a silent gap."""
    notes = [
        f"{link} is a symbolic link, not a run record acceptrun made: not followed"
        for link in ws.linked_runs()
    ]
    for run_id in ws.run_ids():
        if run_id in listed:
            continue
        try:
            ws.get_run(run_id).state  # noqa: B018 - read for the error naming the file
        except AcceptrunError as exc:
            notes.append(f"run {run_id} not listed: {exc}")
        else:
            notes.append(f"run {run_id} not listed: not in the index (`acceptrun index rebuild`)")
    return notes


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    from acceptrun.record.lookup import workspace_of

    ws = workspace_of(args)  # a new Workspace: its index_note is the rebuild's alone
    count, skipped = ws.rebuild_index()
    if ws.index_note:
        print(ws.index_note)
    print(f"indexed {count} runs from {ws.runs_dir}")
    for s in skipped:
        print(f"  skipped {s}: run.json missing or damaged")
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    ls = sub.add_parser("ls", help="list runs in the workspace")
    ls.add_argument(
        "-n",
        "--limit",
        type=positive_int(MAX_STEP),
        default=50,
        help="show the newest N (default 50)",
    )
    ls.add_argument(
        "--all", action="store_true", help="runs of every workspace in the user's list, together"
    )
    ls.set_defaults(func=cmd_ls)
    index = sub.add_parser("index", help="maintain the workspace index")
    index_sub = index.add_subparsers(dest="index_command", required=True, metavar="ACTION")
    rebuild = index_sub.add_parser("rebuild", help="recreate index.sqlite from the run directories")
    rebuild.set_defaults(func=cmd_index_rebuild)
