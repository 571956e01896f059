"""One way to run git: bounded in time, never prompting, with errors that say what failed.

Provenance, portability and reproduce all ask git about the code's checkout. Each call
here:

- runs with ``GIT_TERMINAL_PROMPT=0``, stdin closed and no controlling terminal (its own
  session), so a remote that wants credentials fails at once instead of waiting for a
  password nobody will type;
- is killed with everything it started (ssh, credential helpers) after ``timeout``
  seconds, so a stuck helper cannot hold the pipes open and hang the caller;
- takes no optional locks (``GIT_OPTIONAL_LOCKS=0``), so a user's concurrent ``git
  commit`` never trips over our ``git status``, and speaks English (``LC_ALL=C``).

>>> git(Path("."), "rev-parse", "--show-toplevel")   # doctest: +SKIP
'/home/me/project'

When git cannot run at all (not installed, timed out) :class:`GitError` says so; a
command that ran and failed raises it too unless ``check=False``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from acceptrun.errors import GitError

__all__ = ["GIT_TIMEOUT", "GitResult", "git", "run_git"]

GIT_TIMEOUT = 30.0  # seconds per git command; `git status` on a huge tree can be slow


@dataclass(frozen=True, slots=True)
class GitResult:
    """A git command that ran: its exit status and output (stdout empty when sent to a file)."""

    returncode: int
    stdout: str
    stderr: str


def _env() -> dict[str, str]:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    # ssh asks for passwords and host keys on /dev/tty, which GIT_TERMINAL_PROMPT does not
    # cover; batch mode makes it fail instead (a user's own GIT_SSH_COMMAND is kept).
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    env["GCM_INTERACTIVE"] = "never"  # Git Credential Manager: no dialog either
    return env


def run_git(
    root: Path, *args: str, stdout: IO[bytes] | None = None, timeout: float = GIT_TIMEOUT
) -> GitResult:
    """Run ``git args`` in ``root`` whatever its exit status.

    Raises :class:`GitError` only when git could not run (not installed, ``root`` missing)
    or did not finish within ``timeout`` seconds. With ``stdout`` (a binary file), git
    writes its output there, so a large diff never sits in memory.
    """
    try:
        proc = subprocess.Popen(
            ["git", *args],
            cwd=root,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # no terminal to prompt on; killable as a group
        )
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and exc.filename == "git":
            raise GitError(
                f"git is not installed or not on PATH ({exc.strerror}); install git or add "
                "its directory to PATH"
            ) from exc
        raise GitError(f"could not run git in {root} ({exc.strerror or exc})") from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Kill the whole group: a credential helper or ssh left behind would keep the
        # pipes open and communicate() would wait for it.
        with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise GitError(f"`git {args[0]}` timed out after {timeout:g} s in {root}") from None
    return GitResult(
        returncode=proc.returncode,
        stdout=(out or b"").decode(errors="surrogateescape"),
        stderr=(err or b"").decode(errors="replace"),
    )


def git(
    root: Path,
    *args: str,
    check: bool = True,
    stdout: IO[bytes] | None = None,
    timeout: float = GIT_TIMEOUT,
) -> str:
    """``git args`` in ``root``: its stdout without the trailing newline.

    A failing command raises :class:`GitError` with git's last line of complaint; with
    ``check=False`` it returns ``""`` instead. Empty too when ``stdout`` is a file.
    """
    res = run_git(root, *args, stdout=stdout, timeout=timeout)
    if res.returncode != 0:
        if not check:
            return ""
        complaint = (res.stderr.strip() or res.stdout.strip()).splitlines()
        detail = complaint[-1] if complaint else f"exit status {res.returncode}"
        command = " ".join(args)
        command = command if len(command) <= 60 else command[:57] + "..."
        raise GitError(f"`git {command}` failed in {root}: {detail}")
    return res.stdout.rstrip("\n")
