"""The states a run record and a queue job can be in, each declared once.

Every value a module writes to run.json ``status``, to a check, to exit.json ``outcome``
and ``class``, or to the queue's ``jobs.state`` is a member here. The enums are
``StrEnum``: a member compares equal to its string and serialises to it, so writers may
write either and run.json stays byte-identical.

>>> RunStatus.FINISHED == "finished", RunStatus("stopped") in RUN_ENDED
(True, True)
"""

from __future__ import annotations

import enum

__all__ = [
    "ATTEMPT_STOPPED_ON_PURPOSE",
    "JOB_ACTIVE",
    "JOB_ENDED",
    "RESPONSIBILITY",
    "RETRYABLE_CLASSES",
    "RUN_CLOSED",
    "RUN_ENDED",
    "RUN_LIVE",
    "RUN_OWNED",
    "RUN_SUPERVISED",
    "AttemptOutcome",
    "CheckStatus",
    "FailureClass",
    "JobState",
    "Responsibility",
    "RunStatus",
]


class RunStatus(enum.StrEnum):
    """run.json ``status``: where a run is in its life."""

    CREATED = "created"  # Workspace.create_run, before launch writes anything else
    PREFLIGHT = "preflight"  # launch: checks before the first attempt
    RUNNING = "running"  # the supervisor (or a standalone/tune process) runs attempts
    CLOSING = "closing"  # close_run: cleanup, verdict, ledger
    FINISHED = "finished"  # closed with a verdict
    FAILED_PREFLIGHT = "failed_preflight"  # closed before any attempt: preflight failed
    STOPPED = "stopped"  # closed after a stop during preflight
    FAILED = "failed"  # a tune sweep that raised
    INTERRUPTED = "interrupted"  # the supervisor died before closing the run


class CheckStatus(enum.StrEnum):
    """verdict.json ``checks[].status``."""

    PASS = "pass"
    FAIL = "fail"
    NOT_RECORDED = "not_recorded"


class FailureClass(enum.StrEnum):
    """exit.json ``class``: why an attempt ended (rules in supervisor/classify.py)."""

    SUCCESS = "success"
    PREEMPTED = "preempted"
    KILLED = "killed"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    DISTRIBUTED = "distributed"
    NODE_LOST = "node_lost"
    GPU_FAULT = "gpu_fault"
    HANG = "hang"
    DATA_STALL = "data_stall"
    DIVERGED = "diverged"
    DISK_FULL = "disk_full"
    USER_ERROR = "user_error"
    SETUP_CHANGED = "setup_changed"  # the data or packages changed between attempts
    WALL_TIME = "wall_time"
    BUDGET = "budget"
    IDLE = "idle"
    STOPPED = "stopped"
    FAILED = "failed"


class AttemptOutcome(enum.StrEnum):
    """exit.json ``outcome``: how an attempt ended mechanically, before classification."""

    SUCCESS = "success"
    FAILED = "failed"
    SIGNALED = "signaled"
    STOPPED = "stopped"
    WALL_TIME = "wall_time"
    BUDGET = "budget"
    IDLE = "idle"
    SERVING = "serving"
    HANG = "hang"
    DATA_STALL = "data_stall"
    NOT_STARTED = "not_started"
    INTERRUPTED = "interrupted"  # its supervisor died (supervisor/lease.py take_over)


class JobState(enum.StrEnum):
    """The queue's ``jobs.state`` (queue/db.py)."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTING = "preempting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A supervisor may be working on the run (lifecycle: stop, resume and wait look at it).
RUN_SUPERVISED: frozenset[RunStatus] = frozenset({RunStatus.PREFLIGHT, RunStatus.RUNNING})
# A supervisor owns the record: the queue leaves such a run alone.
RUN_OWNED: frozenset[RunStatus] = RUN_SUPERVISED | {RunStatus.CLOSING}
# Not ended yet: `acceptrun top`, the board, the cost report and retention show or keep it.
RUN_LIVE: frozenset[RunStatus] = RUN_OWNED | {RunStatus.CREATED}
# close_run has written the verdict.
RUN_CLOSED: frozenset[RunStatus] = frozenset(
    {RunStatus.FINISHED, RunStatus.FAILED_PREFLIGHT, RunStatus.STOPPED}
)
# The run will not change any more without a resume.
RUN_ENDED: frozenset[RunStatus] = RUN_CLOSED | {RunStatus.FAILED, RunStatus.INTERRUPTED}

# Failure classes a restart may cure (supervisor/classify.py retry_allowed).
RETRYABLE_CLASSES: frozenset[FailureClass] = frozenset(
    {
        FailureClass.PREEMPTED,
        FailureClass.KILLED,
        FailureClass.CUDA_OOM,
        FailureClass.HOST_OOM,
        FailureClass.DISTRIBUTED,
        FailureClass.NODE_LOST,
        FailureClass.GPU_FAULT,
        FailureClass.HANG,
        FailureClass.DATA_STALL,
        FailureClass.FAILED,
    }
)


class Responsibility(enum.StrEnum):
    """Whose failure a failed or lost span was (the ledger's ``responsibility``)."""

    PROVIDER = "provider"  # the platform: preemption, a lost node, a GPU fault
    WORKLOAD = "workload"  # the run itself: its code, data, model or its own limits
    UNKNOWN = "unknown"  # the evidence does not tell the two apart
    DRILL = "drill"  # a fault the run injected into itself (--inject, a drill): asked for
    NONE = "none"  # not a failure (an attempt that succeeded)


# Whose failure each class is: one entry per FailureClass (a unit test fails on a class
# without one). Provider: what the platform did to the run. Workload: what the run did
# to itself, or asked for (its limits, a stop). Unknown: the class covers both (a
# SIGKILL without OOM evidence may be the provider's OOM killer or the user's kill; an
# NCCL error may be a flaky fabric or a rank that crashed; a data stall may be a storage
# outage or a slow loader).
RESPONSIBILITY: dict[FailureClass, Responsibility] = {
    FailureClass.SUCCESS: Responsibility.NONE,
    FailureClass.PREEMPTED: Responsibility.PROVIDER,
    FailureClass.NODE_LOST: Responsibility.PROVIDER,
    FailureClass.GPU_FAULT: Responsibility.PROVIDER,
    FailureClass.KILLED: Responsibility.UNKNOWN,
    FailureClass.DISTRIBUTED: Responsibility.UNKNOWN,
    FailureClass.DATA_STALL: Responsibility.UNKNOWN,
    FailureClass.FAILED: Responsibility.UNKNOWN,
    FailureClass.CUDA_OOM: Responsibility.WORKLOAD,
    FailureClass.HOST_OOM: Responsibility.WORKLOAD,
    FailureClass.HANG: Responsibility.WORKLOAD,
    FailureClass.DIVERGED: Responsibility.WORKLOAD,
    FailureClass.DISK_FULL: Responsibility.WORKLOAD,
    FailureClass.USER_ERROR: Responsibility.WORKLOAD,
    # The data or the packages the run was verified with changed between attempts: the
    # run's own inputs (its data set, its environment), whoever changed them; a platform
    # that rewrites a data set or a venv under a job is not what a provider does.
    FailureClass.SETUP_CHANGED: Responsibility.WORKLOAD,
    FailureClass.WALL_TIME: Responsibility.WORKLOAD,
    FailureClass.BUDGET: Responsibility.WORKLOAD,
    FailureClass.IDLE: Responsibility.WORKLOAD,
    FailureClass.STOPPED: Responsibility.WORKLOAD,
}

# Attempt outcomes that were asked for (a stop, a limit), not failures.
ATTEMPT_STOPPED_ON_PURPOSE: frozenset[AttemptOutcome] = frozenset(
    {AttemptOutcome.STOPPED, AttemptOutcome.WALL_TIME, AttemptOutcome.BUDGET}
)

JOB_ACTIVE: frozenset[JobState] = frozenset({JobState.RUNNING, JobState.PREEMPTING})
JOB_ENDED: frozenset[JobState] = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
