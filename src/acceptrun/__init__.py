"""acceptrun: turn GPU time into accepted runs.

The public API is small: :func:`init` attaches a training script to its run (or starts a
standalone one) and returns a :class:`Run`; everything else is the ``acceptrun`` command.
Importing this package imports neither torch nor any other heavy dependency.
"""

from acceptrun.errors import (
    AcceptrunError,
    DataError,
    PreflightError,
    RecordError,
    SpecError,
    UserError,
    WorkspaceError,
)
from acceptrun.workload.contract import ENV_VARS
from acceptrun.workload.run import Run, init

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # torch-backed helpers, imported on first use so `import acceptrun` stays light.
    if name in ("ResumableLoader", "ResumableSampler"):
        from acceptrun.checkpoint import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'acceptrun' has no attribute {name!r}")


__all__ = [
    "ENV_VARS",
    "AcceptrunError",
    "DataError",
    "PreflightError",
    "RecordError",
    "ResumableLoader",
    "ResumableSampler",
    "Run",
    "SpecError",
    "UserError",
    "WorkspaceError",
    "__version__",
    "init",
]
