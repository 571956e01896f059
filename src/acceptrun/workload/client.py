"""The client API under its former module name: :func:`init`, :class:`Run`, the contract.

The client lives in :mod:`acceptrun.workload.run` (the :class:`Run` and :func:`init`) and
its parts (:mod:`~acceptrun.workload.loop`, :mod:`~acceptrun.workload.signals`,
:mod:`~acceptrun.workload.checkpointing`, :mod:`~acceptrun.workload.watch`); the names the
supervisor and the workload agree on are in :mod:`acceptrun.workload.contract`. Scripts
import ``acceptrun`` itself; this module keeps ``acceptrun.workload.client`` importable.
"""

from __future__ import annotations

from acceptrun.workload.contract import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_DRILL,
    ENV_HEARTBEAT_S,
    ENV_INJECT,
    ENV_INJECT_RANK,
    ENV_MAX_STEPS,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    ENV_RUN_ID,
    ENV_SPEC,
    ENV_VARS,
    EXIT_DIVERGED,
    EXIT_STOPPED,
    HEARTBEAT_S,
)
from acceptrun.workload.run import Run, init

__all__ = [
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_DRILL",
    "ENV_HEARTBEAT_S",
    "ENV_INJECT",
    "ENV_INJECT_RANK",
    "ENV_MAX_STEPS",
    "ENV_RESUME_FROM",
    "ENV_RUN_DIR",
    "ENV_RUN_ID",
    "ENV_SPEC",
    "ENV_VARS",
    "EXIT_DIVERGED",
    "EXIT_STOPPED",
    "HEARTBEAT_S",
    "Run",
    "init",
]
