"""The payloads of the event kinds of checkpoints, the mirror, notifications, telemetry,
tuning, batch inference and serving: the other half of :mod:`acceptrun.record.events`,
whose registry (``EVENT_KINDS``) names them. :class:`Event` is every payload's base.
"""

# No ``from __future__ import annotations``: TypedDict reads Required[...] at runtime
# (Python 3.11 does not see it through string annotations).
from typing import Any, Required, TypedDict

__all__ = [
    "CheckpointCapturedEvent",
    "CheckpointCommitEvent",
    "CheckpointDeleteEvent",
    "CheckpointFailedEvent",
    "CheckpointNotCapturedEvent",
    "CheckpointNotSettlingEvent",
    "CheckpointQuarantineEvent",
    "CheckpointRedatedEvent",
    "CheckpointStageEvent",
    "CheckpointStagingRemovedEvent",
    "Event",
    "MemorySavesEvent",
    "MemoryTierEvent",
    "MirrorBehindEvent",
    "MirrorDeleteEvent",
    "MirrorFailedEvent",
    "MirrorOkEvent",
    "NotifyEvent",
    "PrometheusEvent",
    "PrometheusFailedEvent",
    "ServingDoneEvent",
    "ServingErrorEvent",
    "ServingLoadStartEvent",
    "ServingReadyEvent",
    "ShardCommitEvent",
    "ShardRedoEvent",
    "StepCounterRestartedEvent",
    "TrialEvent",
]


class Event(TypedDict):
    """What every line of events.jsonl has."""

    t: float  # unix seconds, rounded to the microsecond
    kind: str


# ---- checkpoints and the mirror (checkpoint/*.py, supervisor/external.py) ------------------


class CheckpointStageEvent(Event, total=False):
    step: Required[int]
    bytes: Required[int]
    stall_s: Required[float]
    attempt: int
    captured: Any
    files: int
    overlapped: bool  # the parameters and optimizer state were copied beside the next step
    copy_s: float  # that background copy's seconds
    waited_s: float  # of stall_s: an optimizer step's wait for the copy


class MemoryTierEvent(Event, total=False):
    path: Required[str]
    shared: Required[bool]  # in host shared memory (/dev/shm), not the record's disk
    note: str  # why not, and the fix


class MemorySavesEvent(Event, total=False):
    path: Required[str]
    saves: Required[int]
    adopted: int  # durable commits copied in (the steps where both fell)
    stall_s: float  # all the loop waited for memory saves, seconds
    stall_max_s: float
    bytes: int  # one copy's tensor bytes
    last_step: int | None
    error: str  # the save that failed and turned the tier off
    attempt: int


class CheckpointCommitEvent(Event, total=False):
    step: Required[int]
    path: Required[str]
    total_bytes: Required[int]
    files: Required[int]
    seconds: Required[float]
    attempt: int
    source: str  # watched: a checkpoint the workload wrote itself, captured by the supervisor
    stall_s: float
    bytes: int
    capture_s: float
    redated_from: int  # the step it was stored under while its step was an estimate


class CheckpointFailedEvent(Event, total=False):
    error: Required[str]
    step: int | None
    attempt: int
    source: str
    source_path: str
    # A full checkpoint disk (checkpoint/saver.py): where, how many bytes, what is kept.
    fault: str  # "disk full"
    directory: str
    needed_bytes: int
    free_bytes: int | None
    intact_step: int | None  # the previous checkpoint, verified after the failure


class CheckpointDeleteEvent(Event, total=False):
    step: Required[int | None]
    reason: str
    path: str
    rule: str
    bytes: int
    error: str
    attempt: int
    redated_to: int  # not a deletion of work: stored again under the step now known


class CheckpointQuarantineEvent(Event, total=False):
    reason: Required[str]
    step: int | None
    path: str
    to: str
    attempt: int


class CheckpointStagingRemovedEvent(Event, total=False):
    path: Required[str]
    pid: Required[int | None]
    attempt: int


class CheckpointCapturedEvent(Event, total=False):
    step: Required[int]
    source_path: Required[str]
    complete_by: str  # how the file was known whole: settled, its format, a clean exit
    bytes: int
    files: int
    capture_s: float
    mb_per_s: float
    attempt: int
    dated_by: str  # how its step was known: its name, the steps reported before it, ...
    step_estimate: str  # why the step is not proven (absent: it is)


class CheckpointRedatedEvent(Event, total=False):
    step: Required[int]  # the step now known
    redated_from: Required[int]  # the step it was stored under
    source_path: Required[str]
    attempt: int
    dated_by: str
    estimate: bool  # True: later steps may still date it again


class CheckpointNotCapturedEvent(Event, total=False):
    reason: Required[str]
    step: int
    source: str
    source_path: str
    attempt: int


class StepCounterRestartedEvent(Event, total=False):
    resumed_from: Required[int]
    first_step: Required[int]
    offset: Required[int]
    source: str
    attempt: int


class CheckpointNotSettlingEvent(Event, total=False):
    source_path: Required[str]
    reason: Required[str]
    rewrites: int
    every_s: float
    settle_s: float
    attempt: int


class MirrorOkEvent(Event, total=False):
    step: Required[int]
    bytes: int
    seconds: float
    attempt: int


class MirrorFailedEvent(Event, total=False):
    step: Required[int]
    reason: str
    state: str
    retry_in_s: float
    attempt: int


class MirrorDeleteEvent(Event, total=False):
    step: Required[int]
    bytes: int
    attempt: int


class MirrorBehindEvent(Event, total=False):
    status: Required[dict[str, Any]]  # step -> mirror state
    attempt: int


# ---- notifications (notify/*.py) -------------------------------------------------------------


class NotifyEvent(Event, total=False):
    target: Required[str]  # webhook|slack <scheme://host/…>, email <host:port>, command <name>
    event: Required[str]  # the notification: rejected, divergence, supervisor_gone, ...
    outcome: Required[str]  # delivered | failed | dropped | not_delivered
    condition_t: Required[
        float
    ]  # the condition's own time (unix s): time to detect counts from here
    attempts: Required[int]  # tries made
    key: str  # the condition's dedupe key (divergence:1)
    condition: str  # the events.jsonl kind that recorded it ("lease": a gone supervisor)
    delivered_at: float  # unix s
    time_to_detect_s: float  # delivered_at - condition_t
    error: str  # the last try's failure
    by: str  # supervisor | watch
    attempt: int


# ---- telemetry, tune, inference, serving ---------------------------------------------------


class PrometheusEvent(Event, total=False):
    url: Required[str]


class PrometheusFailedEvent(Event, total=False):
    error: Required[str]
    port: int


class TrialEvent(Event, total=False):
    id: Required[Any]
    axis: Required[str]
    label: Required[str]
    ok: Required[bool]
    samples_per_s: float | None
    numerics: Any
    error: str | None


class ShardCommitEvent(Event, total=False):
    attempt: Required[int]
    shard: Required[int]
    file: str
    hash: str
    items: int
    failed: int
    tokens: int
    seconds: float


class ShardRedoEvent(Event, total=False):
    attempt: Required[int]
    shard: Required[int]
    reason: str


class ServingReadyEvent(Event, total=False):
    attempt: Required[int]
    ok: bool
    seconds: float
    by: str
    reason: str


class ServingLoadStartEvent(Event, total=False):
    attempt: Required[int]
    mode: Required[str]


class ServingDoneEvent(Event, total=False):
    attempt: Required[int]
    ok: bool
    p99: float | None
    requests: int
    seconds: float


class ServingErrorEvent(Event, total=False):
    attempt: Required[int]
    error: Required[str]
