"""Where a path from a spec, a record or a checkpoint may reach: one mechanism for all.

Every relative path that comes from user input or from a file on disk (a cleanup glob,
an output, a watched checkpoint, a restore target, a manifest entry) is resolved by
:func:`confine` against the directory it belongs to; anything acceptrun is asked to
delete first passes :func:`check_removable`. Both resolve symlinks, so a link planted
in the workdir never carries a read, a write or a removal out of it.

::

    confine(workdir, "out/model.pt", field="outputs.model")   # a Path inside workdir
    confine(workdir, "../etc/passwd", field="cleanup.remove")  # UserError naming both
    check_removable(p, workdir=wd, protected=[workspace])      # None, or why it is refused

A file that tells acceptrun where to look (the user's list of workspaces) is trusted only
when it is the user's own: :func:`ownership_problem` says why it is not (another owner,
writable by anyone).

Lexical rules (:func:`lexical_problem`) are also what the spec's ``workdir-glob`` format
checks at ``spec check``, so a value refused at run time was already refused there.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from acceptrun.errors import AcceptrunError, UserError

__all__ = [
    "WORKSPACE_NAME",
    "check_removable",
    "confine",
    "escape_problem",
    "inside",
    "lexical_problem",
    "owned_by_another",
    "ownership_problem",
]

# The workspace's directory name (record/workspace.py WORKSPACE_DIR; _util sits below
# record, so the name is repeated here and a unit test keeps the two equal).
WORKSPACE_NAME = ".acceptrun"


def escape_problem(name: str) -> str | None:
    """Why a relative name read from a file (a manifest entry) leads out of its root.

    Refused: empty, NUL (the OS refuses it), an absolute path, a ``..`` part.
    """
    if not name:
        return "an empty name"
    if "\x00" in name:
        return "a NUL character"
    if name.startswith("/"):
        return "an absolute path"
    if ".." in name.split("/"):
        return "a '..' part leads out of it"
    return None


def lexical_problem(value: str) -> str | None:
    """Why ``value`` (a relative path or glob from a spec) may lead out of its root, or None.

    What :func:`escape_problem` refuses, and also ``~`` (expanded to a home directory)
    and a part named ``.acceptrun`` (a workspace: run records and checkpoint stores).
    """
    if why := escape_problem(value):
        return why
    if value.startswith("~"):
        return "a home directory path (~)"
    if WORKSPACE_NAME in PurePosixPath(value).parts:
        return f"{WORKSPACE_NAME} is a workspace: its run records and checkpoints are not the run's files"
    return None


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """True when ``path``, symlinks resolved, is ``root`` or lies under it (resolved).

    The one containment predicate. A path that cannot be resolved (a NUL in it, a
    symlink loop) is not inside: False.
    """
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return False


def confine(
    root: str | os.PathLike[str],
    rel: str | os.PathLike[str],
    *,
    field: str,
    fix: str = "",
    within: str = "the workdir",
    error: type[AcceptrunError] = UserError,
) -> Path:
    """``root / rel`` with symlinks resolved, or ``error`` when it is not inside ``root``.

    ``field`` names where the value came from (``cleanup.remove``, ``manifest entry``);
    the message carries it, the value, ``within`` (what ``root`` is, in words), where it
    leads and ``fix`` (a default fix when empty). Never follows a symlink out: a path whose resolution leaves ``root`` is
    refused even when its text looks relative.
    """
    text = os.fspath(rel)
    how = fix or "use a path relative to it, without '..', that stays inside it"
    real_root = Path(os.path.realpath(root))
    why = lexical_problem(text)
    if why is None:
        real = Path(os.path.realpath(real_root / text))
        if real.is_relative_to(real_root):
            return real
        why = f"it resolves to {real} (a symlink?)"
    raise error(f"{field}: {text!r} leads outside {within} {real_root}: {why}; {how}")


def check_removable(
    path: str | os.PathLike[str],
    *,
    workdir: str | os.PathLike[str],
    protected: Iterable[str | os.PathLike[str]] = (),
) -> str | None:
    """None when ``path`` may be removed, else why not (for the record and the verdict).

    A removal stays inside ``workdir`` (never the workdir itself, nor a path that
    contains it), never touches a workspace (a ``.acceptrun`` directory), nor any of the
    ``protected`` paths (the workspace, run records, checkpoint stores, the data), nor a
    path inside one or containing one. A symlink is judged as the link itself: removing
    it removes the link only, so it may go whatever it points to, as long as the link
    lies in the workdir. Symlinks in the path's parents are resolved: ``link/x`` where
    ``link`` leads out is outside.
    """
    wd = Path(os.path.realpath(workdir))
    lexical = Path(os.path.abspath(path))
    parent = Path(os.path.realpath(lexical.parent))
    link = lexical.is_symlink()
    target = parent / lexical.name if link else Path(os.path.realpath(lexical))
    if not target.is_relative_to(wd) or target == wd:
        return f"refused: {lexical} resolves to {target}, outside the workdir {wd}"
    if wd.is_relative_to(target):
        return f"refused: {lexical} contains the workdir {wd}"
    if WORKSPACE_NAME in target.relative_to(wd).parts:
        return (
            f"refused: {lexical} is in a workspace ({WORKSPACE_NAME}): run records and checkpoints"
        )
    if not link and (target / WORKSPACE_NAME).is_dir():
        return (
            f"refused: {lexical} holds a workspace ({WORKSPACE_NAME}): run records and checkpoints"
        )
    for kept in protected:
        real = Path(os.path.realpath(kept))
        lex = Path(os.path.abspath(kept))
        for p in {real, lex}:
            if target == p or p.is_relative_to(target):
                return f"refused: {lexical} holds {p}, which acceptrun keeps (workspace, run record, checkpoints or data)"
            if target.is_relative_to(p):
                return f"refused: {lexical} is inside {p}, which acceptrun keeps (workspace, run record, checkpoints or data)"
    return None


def ownership_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not the current user's own, or None when it is (or does not exist).

    Refused: owned by another user (its ``st_uid`` is not the effective uid) or writable by
    anyone (``o+w``): either could have been written by someone else, to point acceptrun at
    any folder. Symlinks are followed (the target is what is read). Root is held to the
    same rule: a file of uid 65534 is not root's own either.

    >>> ownership_problem("/etc")                      # as a user other than root
    'owned by uid 0, not by you (uid 1000)'
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    me = os.geteuid()
    if st.st_uid != me:
        return f"owned by uid {st.st_uid}, not by you (uid {me})"
    if st.st_mode & stat.S_IWOTH:
        return f"writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def owned_by_another(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` exists and its owner (``st_uid``) is not the effective user."""
    try:
        return os.stat(path).st_uid != os.geteuid()
    except OSError:
        return False
