"""One exception hierarchy for acceptrun.

::

    AcceptrunError                 anything acceptrun raises on purpose
    ├── UserError                  bad input: the user can fix it (CLI exit code 2)
    │   ├── SpecError              a run spec that does not load or validate
    │   ├── WorkspaceError         no workspace, no such run, an unreadable record
    │   ├── DataError              data missing or not matching its manifest
    │   ├── PreflightError         an environment expectation or smoke test failed
    │   ├── GitError               git missing, timed out, or a git command failed
    │   └── DiskFullError          (also OSError) a file system full, or a file-size limit hit
    ├── RecordError                a run record that is damaged on disk (CLI exit code 1)
    │   └── UnsafeFileError        (also OSError) a file to read that is a link, FIFO, device...
    │
    │   raised by the workload API (acceptrun.init, Run, ResumableLoader, CheckpointStore,
    │   the framework callbacks) where it raised a built-in before; each is also that
    │   built-in, so ``except ValueError`` in a training script still catches it:
    ├── AcceptrunValueError        (also ValueError)    a bad argument or value
    ├── AcceptrunTypeError         (also TypeError)     a value of a type that cannot be used
    ├── AcceptrunKeyError          (also KeyError)      a name that is not there
    ├── AcceptrunFileNotFoundError (also FileNotFoundError)
    └── AcceptrunRuntimeError      (also RuntimeError)  a call in the wrong state or order

The CLI maps these to exit codes (``acceptrun.cli.main`` prints ``Type: message``).
Elsewhere they are caught only where a failure is optional and then recorded (close,
the verdict and the report write a ``best_effort_failed`` event), never swallowed.
Messages name the thing, the bad value and the fix, so a user never needs the traceback.
"""

from __future__ import annotations

import errno as errno_module
from typing import Any

__all__ = [
    "AcceptrunError",
    "AcceptrunFileNotFoundError",
    "AcceptrunKeyError",
    "AcceptrunRuntimeError",
    "AcceptrunTypeError",
    "AcceptrunValueError",
    "DataError",
    "DiskFullError",
    "GitError",
    "PreflightError",
    "RecordError",
    "SpecError",
    "UnsafeFileError",
    "UserError",
    "WorkspaceError",
]


class AcceptrunError(Exception):
    """Base of every error acceptrun raises on purpose."""

    exit_code = 1


class UserError(AcceptrunError):
    """Bad input that the user can fix; the message says how."""

    exit_code = 2


class SpecError(UserError):
    """A run spec that does not load or validate.

    ``problems`` holds one line per problem, each naming the field path, the bad value
    and what would be accepted, so all of them can be fixed in one pass.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"{source}: {len(self.problems)} problems\n{lines}"
        super().__init__(message)


class WorkspaceError(UserError):
    """No workspace where one is needed, or no such run in it."""


class DataError(UserError):
    """Data that is missing or does not match its manifest."""


class PreflightError(UserError):
    """A check before the first step failed; the run was not launched."""


class GitError(UserError):
    """git is not installed, did not finish in time, or a git command failed.

    The message names the command, the checkout and git's own last line of complaint.
    """


class DiskFullError(UserError, OSError):
    """A write met a full file system (ENOSPC, EDQUOT) or a file-size limit (EFBIG).

    Also an :class:`OSError` with that ``errno`` (and ``filename``: the directory), so
    ``except OSError`` in a training script still catches what was a raw ``OSError``
    before. ``directory`` is where the space ran out; ``needed`` and ``free`` are bytes
    (None when unknown); the message says how much, what was kept and the fix.

    >>> raise DiskFullError("ck is full: ...", errno=28, directory="ck")  # doctest: +SKIP
    """

    def __init__(
        self,
        message: str,
        *,
        errno: int,
        directory: str,
        needed: int | None = None,
        free: int | None = None,
    ) -> None:
        super().__init__(message)
        self.errno = errno
        self.strerror = self.message = message
        self.filename = directory
        self.directory = directory
        self.needed = needed
        self.free = free

    def __str__(self) -> str:
        return self.message  # OSError's "[Errno 28] ..." form would hide the message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments: the default reduction would call DiskFullError(message)
        # and fail, so an error sent between processes (DCP gathers a rank's exception
        # with pickle, multiprocessing returns it) could not be rebuilt on the other side.
        # A subclass's own attributes (CheckpointDiskFullError.intact) travel as state.
        args = (type(self), self.message, self.errno, self.directory, self.needed, self.free)
        return (_rebuild_disk_full, args, dict(self.__dict__))


def _rebuild_disk_full(
    cls: type[DiskFullError],
    message: str,
    errno: int,
    directory: str,
    needed: int | None,
    free: int | None,
) -> DiskFullError:
    return cls(message, errno=errno, directory=directory, needed=needed, free=free)


class RecordError(AcceptrunError):
    """A run record on disk is damaged (for example a JSON file that does not parse)."""


class UnsafeFileError(RecordError, OSError):
    """A file to read is not a regular file of its place: a symlink, a FIFO, a device, a
    directory, or a path that leads out of its record (:mod:`acceptrun._util.confined`).

    Also an :class:`OSError` (``errno`` EINVAL), so a reader that skips a file it cannot
    read skips this one too. ``path`` is the file, ``what`` what it is in words
    (``"a symbolic link"``); the target of a link is never named.
    """

    def __init__(self, message: str, *, path: str, what: str) -> None:
        super().__init__(message)
        self.errno = errno_module.EINVAL
        self.strerror = self.message = message
        self.filename = path
        self.path = path
        self.what = what

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_unsafe, (self.message, self.path, self.what))


def _rebuild_unsafe(message: str, path: str, what: str) -> UnsafeFileError:
    return UnsafeFileError(message, path=path, what=what)


# ---- the workload API: acceptrun errors that are also the built-ins raised before ----------


class AcceptrunValueError(AcceptrunError, ValueError):
    """A bad argument or value passed to the workload API (also a :class:`ValueError`).

    >>> run.metric("", 1.0)  # doctest: +SKIP
    AcceptrunValueError: metric name is empty; use a name such as 'eval/accuracy'
    """


class AcceptrunTypeError(AcceptrunError, TypeError):
    """A value of a type the workload API cannot use (also a :class:`TypeError`)."""


class AcceptrunKeyError(AcceptrunError, KeyError):
    """A name that is not where it was asked for (also a :class:`KeyError`)."""

    def __str__(self) -> str:
        # KeyError quotes its argument as a repr; the message reads better as written.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class AcceptrunFileNotFoundError(AcceptrunError, FileNotFoundError):
    """A file the workload API needs is not there (also a :class:`FileNotFoundError`)."""


class AcceptrunRuntimeError(AcceptrunError, RuntimeError):
    """A call made in the wrong state or order (also a :class:`RuntimeError`).

    For example ``acceptrun.init()`` under a supervisor whose ``$ACCEPTRUN_RUN_DIR`` is
    not a run record.
    """
