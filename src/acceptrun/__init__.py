"""acceptrun: turn GPU time into accepted runs.

The public API is small: :func:`init` attaches a training script to its run (or starts a
standalone one) and returns a :class:`Run`; everything else is the ``acceptrun`` command.
Importing this package imports neither torch nor any other heavy dependency.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from acceptrun.checkpoint.loader import ResumableLoader, ResumableSampler
    from acceptrun.run.standalone import init
    from acceptrun.workload.run import Run

from acceptrun._version import __version__


def __getattr__(name: str) -> object:
    # Imported on first use: the client (init, Run) only by a training script, so that the
    # `acceptrun` command does not load it; the torch-backed helpers so that
    # `import acceptrun` stays light.
    if name == "init":
        from acceptrun.run.standalone import init

        return init
    if name == "Run":
        from acceptrun.workload.run import Run

        return Run
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
