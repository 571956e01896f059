"""The user's list of workspaces, so ``acceptrun ls --all`` and ``cost --all`` see every project
and a command given a run id finds it in any of them (:mod:`acceptrun.record.lookup`).

One JSON file, ``workspaces.json``, in the user's configuration directory:
``$ACCEPTRUN_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/acceptrun``, else
``~/.config/acceptrun``. A workspace is added when it is created and its ``last_used``
refreshed when a command opens it (:func:`~acceptrun.record.workspace.find_workspace`). The list
is only an address book: a workspace removed from disk stays listed until
:func:`forget` drops it, and readers skip it with a note.

The list is the user's own: the directory is created mode 0700, and a directory or file
owned by another user or writable by anyone is refused (:class:`RegistryRefused`, naming
the path and the fix), since whoever writes it could point ``ls --all`` and the run lookup
at any folder. A listed workspace whose ``.acceptrun`` belongs to another user is left out
of :func:`owned` and counted.

>>> remember(Path("/home/me/proj/.acceptrun"))
>>> [e.path for e in listed()]
[PosixPath('/home/me/proj/.acceptrun')]
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json, write_json_atomic
from acceptrun._util.paths import owned_by_another, ownership_problem
from acceptrun.errors import RecordError, WorkspaceError

__all__ = [
    "ENV_CONFIG_DIR",
    "Listed",
    "Owned",
    "RegistryRefused",
    "config_dir",
    "forget",
    "listed",
    "owned",
    "remember",
]

ENV_CONFIG_DIR = "ACCEPTRUN_CONFIG_DIR"
FILE = "workspaces.json"
KIND = "acceptrun.workspaces"
# A workspace opened again within this many seconds keeps its last_used: `acceptrun logs -f`
# in a loop must not rewrite the user's config file on every call.
REFRESH_S = 60.0


class RegistryRefused(WorkspaceError):
    """The list of workspaces (or its directory) is not the user's own: it is not read."""


@dataclass(frozen=True, slots=True)
class Listed:
    """One listed workspace: its ``.acceptrun`` path and the project it belongs to."""

    path: Path
    project: str
    added_at: float
    last_used: float

    @property
    def exists(self) -> bool:
        return (self.path / "runs").is_dir()

    @property
    def of_another_user(self) -> bool:
        """True when the workspace is there and belongs to another user (its ``st_uid``)."""
        return owned_by_another(self.path)


@dataclass(frozen=True, slots=True)
class Owned:
    """The listed workspaces of the user's own (:func:`owned`), and how many were left out."""

    workspaces: list[Listed]
    others: int
    bad: int = 0  # entries skipped: not an absolute path, a NUL or control character in it

    def note(self) -> str | None:
        """``2 workspaces of other users left out``, and bad entries skipped, or None."""
        notes = []
        if self.others:
            noun = "workspace" if self.others == 1 else "workspaces"
            notes.append(
                f"{self.others} {noun} of other users left out (listed in "
                f"{config_dir() / FILE}, owned by someone else)"
            )
        if self.bad:
            noun = "entry" if self.bad == 1 else "entries"
            notes.append(
                f"{self.bad} {noun} of {config_dir() / FILE} skipped: not an absolute path, or "
                "holding a NUL or control character; fix or remove them in that file"
            )
        return "; ".join(notes) or None


def config_dir() -> Path:
    """Where the list lives (see the module docstring for the order)."""
    explicit = os.environ.get(ENV_CONFIG_DIR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "acceptrun"


def project_name(workspace_root: Path) -> str:
    """The project a workspace belongs to: the name of the directory that holds it."""
    root = Path(workspace_root)
    return root.parent.name if root.name == ".acceptrun" else root.name


def listed(bad: list[str] | None = None) -> list[Listed]:
    """The listed workspaces, most recently used first; an unreadable list is empty.

    An entry that cannot be a workspace's path (not a string, not absolute, a NUL or
    another control character in it: the OS refuses a NUL, and a terminal acts on the
    others) is skipped, and described in ``bad`` when given. Raises
    :class:`RegistryRefused` when the list or its directory is not the user's own.
    """
    directory = config_dir()
    _check_own(directory)
    entries = _read(directory / FILE)
    out = []
    for i, e in enumerate(entries, 1):
        try:
            path = e["path"]
            if not isinstance(path, str) or not path.startswith("/") or not path.isprintable():
                raise ValueError(f"entry {i}: its path is not an absolute path of printable text")
            project = e.get("project")
            project = project if isinstance(project, str) and project.isprintable() else None
            out.append(
                Listed(
                    Path(path), project or project_name(Path(path)),
                    float(e.get("added_at", 0.0)), float(e.get("last_used", 0.0)),
                )
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            if bad is not None:
                bad.append(str(exc) if isinstance(exc, ValueError) else f"entry {i}: {exc!r}")
    return sorted(out, key=lambda x: -x.last_used)


def owned() -> Owned:
    """The listed workspaces the user owns (a missing one too: readers note it is gone),
    and the count of those that belong to other users, left out."""
    mine: list[Listed] = []
    bad: list[str] = []
    others = 0
    for entry in listed(bad):
        if entry.of_another_user:
            others += 1
        else:
            mine.append(entry)
    return Owned(mine, others, len(bad))


def remember(workspace_root: Path) -> None:
    """Add a workspace to the list, or refresh its ``last_used``.

    Never raises: a read-only home must not stop a run. A failure is said once on stderr.
    """
    root = Path(workspace_root).resolve()
    now = time.time()
    try:
        with _locked() as path:
            entries = _read(path, set_aside=True)
            for e in entries:
                if e.get("path") == str(root):
                    if now - float(e.get("last_used", 0.0)) < REFRESH_S:
                        return
                    e["last_used"] = now
                    break
            else:
                entries.append(
                    {
                        "path": str(root),
                        "project": project_name(root),
                        "added_at": now,
                        "last_used": now,
                    }
                )
            _write(path, entries)
    except RegistryRefused as exc:
        _warn(f"{exc}; `acceptrun ls --all` will not show {root}")
    except OSError as exc:
        _warn(f"cannot update the list of workspaces in {config_dir()} ({exc}); "
              f"`acceptrun ls --all` will not show {root}. Set ${ENV_CONFIG_DIR} to a writable "
              "directory to fix it")  # fmt: skip


def forget(workspace_root: Path) -> bool:
    """Drop a workspace from the list; True when it was listed."""
    root = str(Path(workspace_root).resolve())
    with _locked() as path:
        entries = _read(path, set_aside=True)
        kept = [e for e in entries if e.get("path") != root]
        if len(kept) == len(entries):
            return False
        _write(path, kept)
        return True


# ---- file ------------------------------------------------------------------------------------

_warned = False


def _warn(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"acceptrun: warning: {message}", file=sys.stderr, flush=True)


def _check_own(directory: Path) -> None:
    """Refuse a directory or list that is not the user's own (see the module docstring)."""
    for path, what in ((directory, "directory"), (directory / FILE, "list of workspaces")):
        problem = ownership_problem(path)
        if problem is None:
            continue
        fix = f"set ${ENV_CONFIG_DIR} to a directory of your own (e.g. ~/.config/acceptrun)"
        try:
            shared = owned_by_another(path) or bool(path.stat().st_mode & stat.S_ISVTX)
        except OSError:
            shared = True
        if not shared:
            # the user's own, only too open (a shared directory such as /tmp has the sticky
            # bit: it must never be told to close itself)
            fix += f", or make it yours alone: chmod {'700' if path == directory else '600'} {path}"
        raise RegistryRefused(
            f"the {what} {path} is {problem}, so it is not read: whoever can write it could "
            f"point acceptrun at any folder. To fix it, {fix}"
        )


def _make_dir(directory: Path) -> None:
    """Create the configuration directory mode 0700 (the user's alone), whatever the umask."""
    if directory.is_dir():
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        return  # made by a concurrent command, with the same mode
    directory.chmod(0o700)


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    """The list's path, held under an exclusive lock: two runs starting at once add both."""
    directory = config_dir()
    _make_dir(directory)
    _check_own(directory)
    with open(directory / f".{FILE}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield directory / FILE
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _read(path: Path, *, set_aside: bool = False) -> list[dict[str, Any]]:
    """The list's entries; a damaged list is ignored with a warning, and with
    ``set_aside`` (a write follows) renamed to ``workspaces.json.damaged-<unix seconds>``
    first: what the user wrote is kept, never overwritten."""
    if not path.is_file():
        return []
    try:
        doc = read_json(path)
    except (RecordError, OSError, ValueError) as exc:
        why = str(exc).split(";")[0].removeprefix(f"{path} ")
        if set_aside:
            aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
            os.rename(path, aside)
            _warn(f"{path} {why}; it was moved aside to {aside} and a new list started")
        else:
            _warn(f"{path} {why}; it is ignored. Fix it, or the next run moves it aside")
        return []
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        return []
    items = doc.get("workspaces")
    return [e for e in items if isinstance(e, dict)] if isinstance(items, list) else []


def _write(path: Path, entries: list[dict[str, Any]]) -> None:
    write_json_atomic(path, {"kind": KIND, "schema": 1, "workspaces": entries})
