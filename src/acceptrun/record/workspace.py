"""The workspace and its run records.

A workspace is a ``.acceptrun/`` directory, found like ``.git``: the ``--workspace``
option, else ``$ACCEPTRUN_WORKSPACE``, else the nearest ``.acceptrun/`` walking up from
the current directory (then from the spec's directory). When there is none, a new one is
created at the root of the git repository that holds the spec (or in the spec's
directory outside git): one workspace per project. It ignores itself (``.gitignore``
holding ``*``), so runs never make the repository dirty, and it is added to the user's
list of workspaces (:mod:`acceptrun.record.registry`). It holds one directory per run under
``runs/`` and an SQLite index that is only a cache (:mod:`acceptrun.record.index`):
``acceptrun index rebuild`` recreates it from the run directories alone, which stay the
single source of truth.

A run directory appears whole: it is assembled under a temporary name (frozen spec and
``run.json``) and renamed into place, so no reader ever sees a half-created run.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import secrets
import shutil
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.durable import (
    AppendLog,
    fsync_dir,
    loads_json,
    read_bytes_bounded,
    read_json,
    read_jsonl,
    write_atomic,
    write_json_atomic,
)
from acceptrun.errors import RecordError, WorkspaceError
from acceptrun.record import index
from acceptrun.record.index import IndexRow
from acceptrun.record.models import record_format, stamp
from acceptrun.record.status import RunStatus

if TYPE_CHECKING:
    from acceptrun.spec.model import RunSpec

__all__ = [
    "WORKSPACE_DIR",
    "IndexRow",
    "RunRecord",
    "Workspace",
    "find_workspace",
    "iso_seconds",
    "now_iso",
    "project_root",
]

WORKSPACE_DIR = ".acceptrun"
ENV_WORKSPACE = "ACCEPTRUN_WORKSPACE"

# What a workspace root holds (runs, caches, queue, reproductions, batch jobs): a directory
# with anything else is someone's project, never told to ignore itself.
OWN_ENTRIES = frozenset(
    {"runs", "index.sqlite", "prices.toml", "queue", "queue.sqlite", "worktrees", "reproduce",
     "slurm", "slurm_jobs.jsonl", "tune", "ui"}
)  # fmt: skip

# Run states written to run.json, in lifecycle order.
STATES = tuple(RunStatus)


# Frozen specs parsed in this process, by path: (size, mtime ns, inode) and the spec.
_SPECS: dict[Path, tuple[tuple[int, int, int], RunSpec]] = {}
_SPECS_KEPT = 256


def frozen_spec(path: Path) -> RunSpec:
    """The spec at ``path`` (a record's spec.toml), parsed once while the file is unchanged."""
    from acceptrun.spec.model import load_spec

    try:
        st = os.stat(path)
    except OSError:
        return load_spec(path)  # raises the SpecError that names the file
    key = (st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _SPECS.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    spec = load_spec(path)
    if len(_SPECS) >= _SPECS_KEPT:
        _SPECS.clear()
    _SPECS[path] = (key, spec)
    return spec


def now_iso(t: float | None = None) -> str:
    """ISO-8601 UTC timestamp with milliseconds (sortable, unambiguous)."""
    moment = datetime.fromtimestamp(time.time() if t is None else t, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_seconds(value: Any) -> float | None:
    """Unix seconds of an ISO-8601 time (:func:`now_iso`'s, ``Z`` or an offset), None when
    ``value`` is not one."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    return slug[:40] or "run"


def new_run_id(name: str, t: float | None = None) -> str:
    """``20261129-234501-charlm-3f2a``: sorts by start time (UTC), readable, unique."""
    stamp = datetime.fromtimestamp(time.time() if t is None else t, tz=UTC)
    return f"{stamp:%Y%m%d-%H%M%S}-{_slug(name)}-{secrets.token_hex(2)}"


def user_at_host() -> str:
    """``user@host`` for audit lines; never fails."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class RunRecord:
    """One run's directory. Every write goes through :mod:`acceptrun._util.durable`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._events: AppendLog | None = None  # opened by the first event written
        self._steps: Any = None  # the StepWriter, opened by the first step written
        self.run_id = self.path.name

    # Layout (see docs/architecture.md, "The run record").
    @property
    def spec_path(self) -> Path:
        return self.path / "spec.toml"

    @property
    def spec(self) -> RunSpec:
        """The frozen spec, parsed once per process while spec.toml is unchanged.

        Shared by every reader of the record in this process (a render reads it from
        several places): read it, never change it (``dataclasses.replace`` makes a copy).
        """
        return frozen_spec(self.spec_path)

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def telemetry_path(self) -> Path:
        return self.path / "telemetry.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def outputs_dir(self) -> Path:
        return self.path / "outputs"

    def attempt_dir(self, n: int) -> Path:
        return self.path / "attempts" / str(n)

    def file(self, name: str) -> Path:
        return self.path / name

    def exists(self, name: str) -> bool:
        return (self.path / name).exists()

    def write_json(self, name: str, obj: Any) -> None:
        """Write a JSON file of the record; a ledger.json refreshes the index's cost row."""
        write_json_atomic(self.path / name, obj)
        if name == index.LEDGER_FILE:  # `acceptrun cost` reads the index, not the ledgers
            Workspace(self.path.parent.parent).index_run(self)

    def read_json(self, name: str, default: Any = None) -> Any:
        """A JSON file of the record, ``default`` when it is not there.

        Read only as a regular file reached without a symlink below the record
        (:func:`acceptrun._util.confined.open_regular`): anything else raises
        :class:`~acceptrun.errors.UnsafeFileError` (a RecordError) naming it.
        """
        path = self.path / name
        if not os.path.lexists(path):  # a dangling link is not "missing": it is refused
            return default
        return read_json(path, root=self.path)

    def read_text(self, name: str, limit: int = 16 << 20) -> str:
        """A text file of the record (the frozen spec.toml), at most ``limit`` bytes.

        Read like :meth:`read_json`: a link, a FIFO or a device raises
        :class:`~acceptrun.errors.UnsafeFileError`; a missing file FileNotFoundError, a
        larger one ValueError, bytes that are not UTF-8 UnicodeDecodeError (a ValueError).
        """
        return read_bytes_bounded(self.path / name, limit, root=self.path).decode("utf-8")

    def event(
        self, kind: str, *, sync: bool = False, defer: bool = False, **fields: Any
    ) -> dict[str, Any]:
        """Append one event (``{"t": unix seconds, "kind": kind, ...}``) to events.jsonl.

        ``defer=True`` (step events) may hold the line up to 0.2 s, to be written with the
        next ones (see :class:`~acceptrun._util.durable.AppendLog`); any other event writes the
        held lines first, so the file stays in order.
        """
        record = {"t": round(time.time(), 6), "kind": kind, **fields}
        if kind == "step":
            return self.step_event(record, defer=defer, sync=sync)
        if self._steps is not None:
            self._steps.flush()  # the steps before this event are on disk before it
        if self._events is None:
            self._events = AppendLog(self.events_path)
        self._events.append(record, sync=sync, defer=defer)
        return record

    def step_event(
        self, record: dict[str, Any], *, defer: bool = False, sync: bool = False
    ) -> dict[str, Any]:
        """Append one step event, built whole (``t``, ``kind``: "step", ``attempt``, ``step``,
        its values): the path of :meth:`event` for steps, which the training loop calls
        directly (one dict a step, not three).

        Step events go to the step log (record/steplog.py), one fixed-width record each;
        one that cannot be a record (no integer step) stays a JSON line in events.jsonl.
        """
        if self._steps is None:
            from acceptrun.record.stepwriter import StepWriter

            self._steps = StepWriter(self.path)
        attempt = record.get("attempt")
        if self._steps.append(attempt if isinstance(attempt, int) else 0, record):
            if not defer:
                self._steps.flush()
            return record
        if self._events is None:
            self._events = AppendLog(self.events_path)
        self._events.append(record, sync=sync, defer=defer)
        return record

    def flush_events(self) -> None:
        """Write the step events held by :meth:`event` now."""
        if self._steps is not None:
            self._steps.flush()
        if self._events is not None:
            self._events.flush()

    def events(self, *kinds: str) -> Iterator[dict[str, Any]]:
        """Events in order, optionally only those of the given kinds.

        Steps are in the step log (record/steplog.py): asking for ``step`` events (or
        for every event) builds them as dicts, merged by time, which suits small runs;
        a reader of a long run reads ``StepLog(record.path)`` in chunks of arrays.
        """
        if kinds and "step" not in kinds:
            for ev in read_jsonl(self.events_path, root=self.path):
                if ev.get("kind") in kinds:
                    yield ev
            return
        from acceptrun.record.view import RecordView

        for ev in RecordView(self).events(*kinds):
            yield ev

    def audit(self, action: str, **fields: Any) -> dict[str, Any]:
        """Record a lifecycle action (run, stop, kill, resume, drill): what, who, when."""
        return self.event("audit", sync=True, action=action, by=user_at_host(), **fields)

    @property
    def state(self) -> dict[str, Any]:
        """The contents of run.json (status, times, verdict, attempts)."""
        data = self.read_json("run.json")
        if not isinstance(data, dict):
            raise RecordError(f"{self.path / 'run.json'} is missing; this is not a run record")
        record_format(data, self.path / "run.json")  # a newer format raises, naming the fix
        return data

    def update_state(self, **changes: Any) -> dict[str, Any]:
        """Merge ``changes`` into run.json atomically, refresh the index, return the new state."""
        data = self.state
        data.update(changes)
        self.write_json("run.json", data)
        # A record always lives in <workspace>/runs/<run_id>/; the index is a cache of run.json.
        Workspace(self.path.parent.parent).index_run(self)
        return data


class Workspace:
    """A ``.acceptrun/`` directory: runs plus an index rebuilt from them on demand."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.runs_dir = self.root / "runs"
        self.index_path = self.root / "index.sqlite"
        # Set by list_runs when the index could not be used: why, for the listing's note.
        self.index_note: str | None = None

    @classmethod
    def create(cls, root: str | Path) -> Workspace:
        """Create (or open) a workspace directory at ``root``; it ignores itself in git."""
        ws = cls(root)
        new = not ws.root.exists() or not any(ws.root.iterdir())
        ws.runs_dir.mkdir(parents=True, exist_ok=True)
        ws.ensure_ignored(new=new)
        return ws

    def ensure_ignored(self, *, new: bool = False) -> None:
        """Write ``.gitignore`` (``*``) so that git never sees the workspace's files.

        A workspace inside a repository would otherwise make it dirty with every run (and
        put the records into the run's own provenance). Only in a directory that is
        acceptrun's alone (``new``, named ``.acceptrun``, or holding only a workspace's
        entries): ``--workspace .`` in a project must never ignore the project. Best
        effort on a read-only workspace: provenance also leaves the workspace out by path.
        """
        path = self.root / ".gitignore"
        if path.exists() or not self.root.is_dir() or (self.root / ".git").exists():
            return
        if not new and self.root.name != WORKSPACE_DIR:
            try:
                names = {e.name for e in self.root.iterdir() if not e.name.startswith(".")}
            except OSError:
                return
            if not names <= OWN_ENTRIES:
                return
        with contextlib.suppress(OSError):  # read-only: provenance excludes it by path anyway
            write_atomic(path, "# acceptrun's records: never part of the project's code\n*\n")

    # ---- runs -------------------------------------------------------------------------

    def create_run(
        self, name: str, *, spec_text: str, state: dict[str, Any], run_id: str | None = None
    ) -> RunRecord:
        """Create a run directory holding the frozen spec and run.json, atomically."""
        run_id = run_id or new_run_id(name)
        final = self.runs_dir / run_id
        tmp = self.runs_dir / f".creating-{run_id}"
        tmp.mkdir(parents=True)
        try:
            write_atomic(tmp / "spec.toml", spec_text, raw=True)  # the user's: resume reads it
            record_state = {
                **stamp(),
                "run_id": run_id,
                "name": name,
                "created_at": now_iso(),
                "created_by": user_at_host(),
                "status": RunStatus.CREATED,
                "verdict": None,
                "attempts": 0,
                **state,
            }
            write_json_atomic(tmp / "run.json", record_state)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(self.runs_dir)
        record = RunRecord(final)
        self.index_run(record)
        return record

    def run_ids(self) -> list[str]:
        """Run ids on disk, oldest first.

        Ids start with their UTC second; only runs created in the same second need their
        run.json read to be ordered (by ``created_at``, in milliseconds).
        """
        if not self.runs_dir.is_dir():
            return []
        # A symlink in runs/ is no run acceptrun made (it creates each by a rename): it
        # would lead every reader out of the workspace, so it is not a run.
        dirs = [
            p
            for p in self.runs_dir.iterdir()
            if not p.is_symlink()
            and p.is_dir()
            and not p.name.startswith(".")
            and (p / "run.json").exists()
        ]
        tied = {s for s, n in Counter(p.name[:15] for p in dirs).items() if n > 1}

        def key(p: Path) -> tuple[str, str, str]:
            created = ""
            if p.name[:15] in tied:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    created = str(
                        loads_json(read_bytes_bounded(p / "run.json", root=p)).get("created_at", "")
                    )
            return (p.name[:15], created, p.name)

        return [p.name for p in sorted(dirs, key=key)]

    def linked_runs(self) -> list[Path]:
        """Symlinks in runs/: no run of acceptrun's (see :meth:`run_ids`), named by ``ls``."""
        try:
            return sorted(p for p in self.runs_dir.iterdir() if p.is_symlink())
        except OSError:
            return []

    def matching(self, ref: str, ids: list[str] | None = None) -> list[str]:
        """The ids ``ref`` names here: itself, else every id it begins or ends (one is a match,
        several are ambiguous). ``latest`` is not an id: see :meth:`get_run`."""
        ids = self.run_ids() if ids is None else ids
        if ref in ids:
            return [ref]
        return [i for i in ids if ref and (i.startswith(ref) or i.endswith(ref))]

    def get_run(self, ref: str) -> RunRecord:
        """A run by id, unique prefix, unique name suffix, or ``latest``."""
        ids = self.run_ids()
        named = bool(ref) and "/" not in ref and not ref.startswith(".")  # a name, not a path
        if named and ref not in ids and (self.runs_dir / ref).is_symlink():
            raise RecordError(
                f"{self.runs_dir / ref} is a symbolic link, not a run record acceptrun made; "
                "it is not followed. Remove the link (or move the record itself into runs/)."
            )
        if named and ref not in ids and (self.runs_dir / ref).is_dir():
            raise RecordError(  # a run directory that lost its run.json: say so, not "no run"
                f"{self.runs_dir / ref / 'run.json'} is missing; this run record is damaged. "
                "Restore run.json from a copy, or remove the directory."
            )
        if not ids:
            raise WorkspaceError(
                f"workspace {self.root} has no runs yet; start one with `acceptrun run SPEC`"
            )
        if ref in ("latest", "last", "@"):
            return RunRecord(self.runs_dir / ids[-1])
        if ref in ids:
            return RunRecord(self.runs_dir / ref)
        matches = self.matching(ref, ids)
        if len(matches) == 1:
            return RunRecord(self.runs_dir / matches[0])
        if len(matches) > 1:
            shown = ", ".join(matches[-5:])
            raise WorkspaceError(
                f"run {ref!r} is ambiguous: {len(matches)} runs match ({shown}); give more of the id"
            )
        recent = ", ".join(ids[-3:])
        raise WorkspaceError(
            f"no run {ref!r} in {self.root}; recent runs: {recent}. List them with `acceptrun ls`."
        )

    # ---- index (record/index.py) --------------------------------------------------------

    def records(self) -> list[RunRecord]:
        """Every run on disk, oldest first (what the index caches)."""
        return [RunRecord(self.runs_dir / run_id) for run_id in self.run_ids()]

    def index_problem(self) -> str | None:
        """What index.sqlite is when it is not a regular file (never opened), else None."""
        return index.problem(self.index_path)

    def index_run(self, record: RunRecord) -> None:
        """Upsert a run's summary into the index. Best effort: the index is a cache."""
        # `acceptrun index rebuild` recovers a stale index; never fail a run over its cache.
        with contextlib.suppress(sqlite3.Error, WorkspaceError):
            index.upsert(self.index_path, record)

    def list_runs(self) -> list[IndexRow]:
        """Index rows, oldest first. Rebuilds the index if it is missing.

        Where the index can be neither rebuilt nor opened (a read-only copy of a workspace
        without its index.sqlite, a damaged index, one that is a directory or a link) the
        rows are read from the run directories, the source of truth the index caches, and
        :attr:`index_note` says why and what fixes it.
        """
        self.index_note = None
        try:
            if not os.path.lexists(self.index_path):
                self.rebuild_index()
            return index.read_rows(self.index_path)
        except (sqlite3.DatabaseError, WorkspaceError, OSError) as exc:
            if (
                isinstance(exc, WorkspaceError)
                and exc.__cause__ is None
                and not self.index_problem()
            ):
                raise  # an index of a newer release: upgrading is the fix, said by the error
            cause = exc.__cause__ if isinstance(exc.__cause__, sqlite3.Error) else exc
            if isinstance(cause, sqlite3.OperationalError | OSError):  # unwritable, not damage
                fix = "On a writable copy, `acceptrun index rebuild` recreates it."
            else:  # damaged, or not a regular file
                fix = "`acceptrun index rebuild` sets it aside and writes a new one."
            problem = str(exc).split(";")[0].removeprefix(f"{self.index_path} ")
            self.index_note = (
                f"{self.index_path} cannot be used ({problem}); runs listed from their "
                f"directories. {fix}"
            )
            return self._rows_from_records()

    def _rows_from_records(self) -> list[IndexRow]:
        """What the index would hold, read from each run.json (damaged ones left out)."""
        rows = []
        for record in self.records():
            with contextlib.suppress(RecordError):
                rows.append(index.row_from_state(record, record.state))
        return rows

    def rebuild_index(self) -> tuple[int, list[str]]:
        """Recreate the index from run directories; returns (runs indexed, skipped paths).

        An unusable index is moved aside, never deleted; :attr:`index_note` says where
        (see :func:`acceptrun.record.index.rebuild`).
        """
        done = index.rebuild(self.index_path, self.records())
        if done.aside is not None:
            self.index_note = f"the unusable index was moved aside to {done.aside}"
        return done.count, done.skipped


def project_root(directory: str | Path) -> Path:
    """The root of the git repository holding ``directory``, else ``directory`` itself.

    Found by walking up to a ``.git`` entry (a directory, or a file in a worktree or a
    submodule), without running git.
    """
    here = Path(directory).resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return here


def _opened(ws: Workspace) -> Workspace:
    """A workspace about to be used: it ignores itself, and the user's list knows it."""
    from acceptrun.record import registry

    ws.ensure_ignored()
    registry.remember(ws.root)
    return ws


def find_workspace(
    explicit: str | Path | None = None,
    *,
    start: str | Path | None = None,
    create: bool = False,
    anchor: str | Path | None = None,
) -> Workspace:
    """Locate the workspace: ``explicit``, ``$ACCEPTRUN_WORKSPACE``, or walk up.

    ``explicit`` and the environment variable may name either the ``.acceptrun``
    directory or the directory that contains it. Otherwise the nearest ``.acceptrun/``
    up from ``start`` (default: the current directory), then up from ``anchor`` (the
    spec's directory), is used. With ``create=True`` a missing workspace is created at
    the root of the git repository holding ``anchor`` (default: ``start``), or in that
    directory outside git: one per project, not one per spec folder.

    >>> find_workspace(create=True, anchor=Path("examples/charlm")).root
    PosixPath('/home/me/proj/.acceptrun')
    """
    given = explicit or os.environ.get(ENV_WORKSPACE)
    if given:
        path = Path(given).expanduser()
        if path.name != WORKSPACE_DIR and (path / WORKSPACE_DIR).is_dir():
            path = path / WORKSPACE_DIR
        if path.is_dir() or create:
            return _opened(Workspace.create(path) if create else Workspace(path))
        source = "--workspace" if explicit else f"${ENV_WORKSPACE}"
        raise WorkspaceError(
            f"{source} is {given!r}, which is not a directory; create it or fix the path"
        )
    here = Path(start or os.getcwd()).resolve()
    anchored = Path(anchor).resolve() if anchor is not None else None
    for origin in (here, anchored):
        if origin is None:
            continue
        for directory in (origin, *origin.parents):
            candidate = directory / WORKSPACE_DIR
            if candidate.is_dir():
                return _opened(Workspace(candidate))
    if create:
        return _opened(Workspace.create(project_root(anchored or here) / WORKSPACE_DIR))
    raise WorkspaceError(
        f"no {WORKSPACE_DIR}/ workspace in {here} or any parent; run `acceptrun run SPEC` "
        f"here to create one, or pass --workspace / set ${ENV_WORKSPACE}"
    )
