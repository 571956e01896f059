"""acceptrun: turn GPU time into accepted runs.

The public API is small: :func:`init` attaches a training script to its run (or starts a
standalone one) and returns a :class:`Run`; everything else is the ``acceptrun`` command.
Importing this package imports neither torch nor any other heavy dependency.
"""

from acceptrun.client import ENV_VARS, Run, init
from acceptrun.errors import (
    AcceptrunError,
    DataError,
    PreflightError,
    RecordError,
    SpecError,
    UserError,
    WorkspaceError,
)

__version__ = "0.1.0"

__all__ = [
    "ENV_VARS",
    "AcceptrunError",
    "DataError",
    "PreflightError",
    "RecordError",
    "Run",
    "SpecError",
    "UserError",
    "WorkspaceError",
    "__version__",
    "init",
]
