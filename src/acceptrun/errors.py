"""One exception hierarchy for acceptrun.

::

    AcceptrunError                 anything acceptrun raises on purpose
    ├── UserError                  bad input: the user can fix it (CLI exit code 2)
    │   ├── SpecError              a run spec that does not load or validate
    │   ├── WorkspaceError         no workspace, no such run, an unreadable record
    │   ├── DataError              data missing or not matching its manifest
    │   └── PreflightError         an environment expectation or smoke test failed
    └── RecordError                a run record that is damaged on disk (CLI exit code 1)

Only ``acceptrun.cli.main`` catches these; it prints ``Type: message`` and exits non-zero.
Messages name the thing, the bad value and the fix, so a user never needs the traceback.
"""

from __future__ import annotations

__all__ = [
    "AcceptrunError",
    "DataError",
    "PreflightError",
    "RecordError",
    "SpecError",
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


class RecordError(AcceptrunError):
    """A run record on disk is damaged (for example a JSON file that does not parse)."""
