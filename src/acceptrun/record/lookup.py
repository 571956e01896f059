"""Which run a command means: the one lookup every command that takes a run goes through.

A reference is, in this order:

1. a path to a run record (``.acceptrun/runs/<id>``, ``./copied-record``, ``~/ws/runs/<id>``:
   anything with a ``/`` or starting with ``.`` or ``~``), taken as it is, whatever
   workspace holds it; it must hold a ``run.json``;
2. ``latest`` (``last``, ``@``): the newest run of the current workspace;
3. a run id, unique prefix or unique name suffix, looked up in the current workspace
   first, then in every other workspace of the user's list (:mod:`acceptrun.record.registry`,
   the user's own only). Found in the current workspace, it is that one; found in exactly
   one other workspace, it is that one; found in several, it is an error that lists their
   record paths (give one of them to pick). A miss names every workspace searched and the
   fix.

With ``--workspace`` or ``$ACCEPTRUN_WORKSPACE`` the user named the workspace: only that
one is searched, and a miss says so.

>>> found = find_run("20261129-234501-charlm-3f2a")   # from any folder of the user's
>>> found.record.path, found.where
(PosixPath('/home/me/b/.acceptrun/runs/20261129-234501-charlm-3f2a'), 'listed')
"""

from __future__ import annotations

import os
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from acceptrun.errors import WorkspaceError
from acceptrun.record.workspace import ENV_WORKSPACE, RunRecord, Workspace, find_workspace

__all__ = ["LATEST", "Found", "find_run", "looks_like_path", "workspace_of"]

LATEST = ("latest", "last", "@")
SHOWN = 5  # workspaces or runs named in a message, at most


def workspace_of(args: Namespace, create: bool = False) -> Workspace:
    """The workspace of a command: ``--workspace``, else the nearest ``.acceptrun/``."""
    return find_workspace(args.workspace, create=create)


@dataclass(frozen=True, slots=True)
class Found:
    """A run a reference named, the workspace that holds it, and how it was found:
    ``path`` (the reference was its directory), ``here`` (the current workspace) or
    ``listed`` (another workspace of the user's list)."""

    record: RunRecord
    workspace: Workspace
    where: str


def looks_like_path(ref: str) -> bool:
    """A run reference written as a path (``runs/ID``, ``./x``, ``~/ws/runs/ID``), not an id."""
    return "/" in ref or ref.startswith((".", "~"))


def find_run(ref: str, *, workspace: str | Path | None = None) -> Found:
    """The run ``ref`` names (see the module docstring); ``workspace``: ``--workspace``.

    Raises :class:`~acceptrun.errors.WorkspaceError` (a miss, an ambiguous reference, a
    path that is no record) or :class:`~acceptrun.errors.RecordError` (a damaged record).
    """
    if looks_like_path(ref):
        return _by_path(ref)
    explicit = workspace or os.environ.get(ENV_WORKSPACE)
    try:
        here: Workspace | None = find_workspace(workspace)
    except WorkspaceError:
        if explicit:
            raise  # the named workspace is not there: that is the error to fix
        here = None
    if ref in LATEST:
        if here is None:
            raise WorkspaceError(
                f"{ref!r} is the newest run of the current workspace, and there is no "
                f"workspace in {Path.cwd()} or any parent; run the command in the project's "
                "folder, pass --workspace, or give the run's id or directory"
            )
        return Found(here.get_run(ref), here, "here")
    if here is not None and (here.matching(ref) or (here.runs_dir / ref).is_dir()):
        # found here (or ambiguous, or a damaged record: get_run's own message says which)
        return Found(here.get_run(ref), here, "here")
    if explicit and here is not None:
        source = "--workspace" if workspace else f"${ENV_WORKSPACE}"
        try:
            here.get_run(ref)  # its miss, naming the workspace and its recent runs
        except WorkspaceError as exc:
            raise WorkspaceError(
                f"{exc} ({source} names the workspace, so only it was searched: drop "
                f"{source} to search all your workspaces, or give the run's directory)"
            ) from None
    return _in_listed(ref, here)


def _by_path(ref: str) -> Found:
    path = Path(ref).expanduser()
    if (path / "run.json").is_file():
        record = RunRecord(path.resolve())
        return Found(record, Workspace(record.path.parent.parent), "path")
    if path.is_dir():
        raise WorkspaceError(
            f"{ref} is a directory but not a run record (no run.json in it); give a run's "
            "directory (<workspace>/runs/<id>) or its id"
        )
    raise WorkspaceError(f"{ref} does not exist; give a run's directory or its id")


def _in_listed(ref: str, here: Workspace | None) -> Found:
    """``ref`` in the user's other workspaces: exactly one match, or the error that says why not."""
    from acceptrun.record import registry

    searched = [] if here is None else [here.root]
    refused: str | None = None
    others = 0
    hits: list[tuple[Workspace, str]] = []
    try:
        mine = registry.owned()
    except registry.RegistryRefused as exc:
        refused, entries = str(exc), []
    else:
        others, entries = mine.others, mine.workspaces
    for entry in entries:
        if not entry.exists or (here is not None and entry.path.resolve() == here.root):
            continue
        ws = Workspace(entry.path)
        searched.append(ws.root)
        hits += [(ws, run_id) for run_id in ws.matching(ref)]
    exact = [(ws, run_id) for ws, run_id in hits if run_id == ref]
    hits = exact or hits
    if len(hits) == 1:
        ws, run_id = hits[0]
        return Found(ws.get_run(run_id), ws, "listed")
    if hits:
        paths = "; ".join(str(ws.runs_dir / run_id) for ws, run_id in hits[:SHOWN])
        more = f" and {len(hits) - SHOWN} more" if len(hits) > SHOWN else ""
        raise WorkspaceError(
            f"run {ref!r} is in more than one of your workspaces: {paths}{more}. Give the "
            "run's directory (one of those paths) to pick one, or more of its id"
        )
    raise WorkspaceError(_miss(ref, here, searched, others, refused))


def _miss(
    ref: str, here: Workspace | None, searched: list[Path], others: int, refused: str | None
) -> str:
    from acceptrun.record import registry

    shown = ", ".join(str(p) for p in searched[:SHOWN])
    if len(searched) > SHOWN:
        shown += f" and {len(searched) - SHOWN} more"
    where = f"in {len(searched)} workspace(s) ({shown})" if searched else "in no workspace"
    parts = [f"no run {ref!r} {where}"]
    recent = here.run_ids()[-3:] if here is not None else []
    if recent:
        parts.append(f"recent runs here: {', '.join(recent)} (`acceptrun ls`)")
    if here is None:
        parts.append(f"there is no workspace in {Path.cwd()} or any parent")
    if refused is not None:
        parts.append(f"your list of workspaces was not read: {refused}")
    elif len(searched) <= (0 if here is None else 1) and not others:
        parts.append(
            f"no other workspace is listed in {registry.config_dir() / registry.FILE} "
            "(a workspace is listed when a run is made in it)"
        )
    if others:
        parts.append(f"{others} workspace(s) of other users left out")
    return (
        "; ".join(parts) + ". List runs with `acceptrun ls --all`, or give the run's "
        "directory (<workspace>/runs/<id>)"
    )
