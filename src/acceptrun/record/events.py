"""The event kinds of events.jsonl, each declared once with its payload.

Every line of events.jsonl is ``{"t": unix seconds, "kind": KIND, ...fields}``. Each
known kind has a ``TypedDict`` payload below: ``Required[...]`` fields are written by every
writer of that kind, the others by some. Readers call :func:`validate_event` (or read
through :class:`~acceptrun.record.view.RecordView`): an unknown kind passes through as it
is, marked ``known=False`` (a newer acceptrun wrote it, or a plugin); a known kind that
lacks a required field is reported in ``problems``, never a traceback, so an old record
still reads.

Writers keep writing plain dicts (``RunRecord.event(kind, **fields)``): the step event on
the training loop's hot path is never built through this module.

How to add an event kind: write a ``TypedDict`` payload here or, for checkpoints, the
mirror, notifications, telemetry, tuning, inference and serving, in
:mod:`acceptrun.record.event_payloads` (``Required`` for the fields
every writer writes), add it to ``EVENT_KINDS`` with a one-line meaning and its writer,
then regenerate the table in docs/architecture.md
(``python -m acceptrun.record.events > /tmp/t.md``; tests/unit/test_record_events.py
checks that the doc matches).

>>> validate_event({"t": 1.0, "kind": "step", "step": 3}).ok
True
>>> validate_event({"t": 1.0, "kind": "step"}).problems
('step event at t=1.0 lacks required field step',)
>>> validate_event({"t": 1.0, "kind": "from_the_future"}).known
False
"""

# No ``from __future__ import annotations``: TypedDict reads Required[...] at runtime
# (Python 3.11 does not see it through string annotations).
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Required

from acceptrun.record.event_payloads import (
    CheckpointCapturedEvent,
    CheckpointCommitEvent,
    CheckpointDeleteEvent,
    CheckpointFailedEvent,
    CheckpointNotCapturedEvent,
    CheckpointNotSettlingEvent,
    CheckpointQuarantineEvent,
    CheckpointRedatedEvent,
    CheckpointStageEvent,
    CheckpointStagingRemovedEvent,
    Event,
    MemorySavesEvent,
    MemoryTierEvent,
    MirrorBehindEvent,
    MirrorDeleteEvent,
    MirrorFailedEvent,
    MirrorOkEvent,
    NotifyEvent,
    PrometheusEvent,
    PrometheusFailedEvent,
    ServingDoneEvent,
    ServingErrorEvent,
    ServingLoadStartEvent,
    ServingReadyEvent,
    ShardCommitEvent,
    ShardRedoEvent,
    StepCounterRestartedEvent,
    TrialEvent,
)

__all__ = [
    "EVENT_KINDS",
    "EventCheck",
    "EventKind",
    "event_table",
    "validate_event",
]


# ---- launch and close (run/launch.py, run/close.py, run/lifecycle.py) ----------------------


class RunStartEvent(Event, total=False):
    spec_hash: Required[str]


class AuditEvent(Event, total=False):
    action: Required[str]  # run, stop, kill, resume, drill, cancel ...
    by: Required[str]  # user@host
    spec: str
    reason: str
    job: int
    drill: str
    step: int
    cpu: bool


class UsageEvent(Event, total=False):
    pass  # workload/usage.py's to_dict(): which client entry points the script calls


class SpecWarningEvent(Event, total=False):
    pass  # a spec finding's to_dict(): field, value, message


class StoppedBeforeLaunchEvent(Event, total=False):
    signal: Required[str]


class PreflightFailedEvent(Event, total=False):
    checks: Required[list[str]]  # names of the failed preflight checks


class CleanupEvent(Event, total=False):
    ok: Required[bool]
    command: str
    remove: str
    removed: list[str]
    seconds: float
    detail: str


class ErrorEvent(Event, total=False):
    error: Required[str]  # "Type: message"


class LogRepairedEvent(Event, total=False):
    torn_bytes: Required[int | None]  # the torn fragment's length; None past 1 MiB
    offset: int | None  # where the fragment starts in the file, bytes
    path: str  # the step log segment whose partial last record a resume cut


class BestEffortFailedEvent(Event, total=False):
    component: Required[str]  # ledger, report, telemetry summary, portability, notify, ...
    error: Required[str]  # "Type: message"
    traceback: str


class VerdictEvent(Event, total=False):
    verdict: Required[str]  # accepted | rejected
    after: str  # the operations drill: what it decided again after


class ReproducesEvent(Event, total=False):
    of: Required[str]  # the run reproduced
    commit: str | None
    root: str | None
    worktree: str | None
    diff_applied: bool
    reasons: list[str]
    notes: list[str]
    spec: str | None


class MirrorFetchEvent(Event, total=False):
    step: Required[int]
    url: Required[str]
    path: Required[str]


class MirrorQuarantineEvent(Event, total=False):
    step: Required[int]  # the mirrored step passed over
    url: Required[str]  # the mirror root
    reason: Required[str]  # what did not verify: the file and the fault


# ---- attempts (supervisor/core.py) ---------------------------------------------------------


class AttemptStartEvent(Event, total=False):
    attempt: Required[int]
    pid: Required[int]
    command: list[str]
    restored: Any
    resume_step: int | None
    containment: dict[str, Any] | None  # supervisor/containment.py: mechanism, cgroup, why
    start_mode: str  # "warm": a standby took over (supervisor/standby.py); "cold"
    cold_why: str | None  # why a cold start, in a run with limits.warm_restart
    standby_ready_s: float | None  # warm: its start to run.restore(); None: not there yet


class StandbyEvent(Event, total=False):
    attempt: Required[int]  # the attempt running beside it
    for_attempt: Required[int]  # the attempt it would become
    pid: int
    why: str
    returncode: int | None
    available_mib: int
    attempt_rss_mib: int
    headroom_mib: int


class ContainmentUnavailableEvent(Event, total=False):
    attempt: Required[int]
    why: Required[str]


class AttemptExitEvent(Event, total=False):
    """The attempt's exit.json, as written to attempts/<n>/exit.json."""

    attempt: Required[int]
    outcome: Required[str]  # record.status.AttemptOutcome
    returncode: int | None
    signal: str | None
    started_at: str
    ended_at: str
    duration_s: float
    reason: str
    work: dict[str, Any]
    decision: str | None


class DecisionEvent(Event, total=False):
    attempt: Required[int]
    action: Required[str]  # restart | give_up | rollback ...
    why: Required[str]


class RestartEvent(Event, total=False):
    attempt: Required[int]  # the attempt about to start
    after: Required[str]  # the failure class of the one before
    backoff_s: Required[float]


class GiveUpEvent(Event, total=False):
    attempt: Required[int]
    reason: Required[str]


class ReverifyEvent(Event, total=False):
    attempt: Required[int]  # the attempt about to start
    ok: Required[bool]
    seconds: Required[float]  # what the checks cost together
    data: dict[str, Any]  # ok, message, seconds, files, stat_only, rehashed, changed, ...
    environment: dict[str, Any]  # ok, message, seconds, python, packages, changed


class RollbackEvent(Event, total=False):
    attempt: Required[int]
    quarantined_step: Required[int]


class HangDetectedEvent(Event, total=False):
    attempt: Required[int]
    stall: Required[str]  # hang | data_stall
    evidence: Any


class StacksEvent(Event, total=False):
    attempt: Required[int]
    path: Required[str]


class SignalSentEvent(Event, total=False):
    attempt: Required[int]
    signal: Required[str]
    reason: str
    after_s: float
    by: str  # "watchdog" when the supervisor was gone; absent: the supervisor
    pids: list[int]  # the attempt's processes killed (supervisor's kill_sent, strays_killed)
    containment: str  # strays_killed: cgroup | subreaper | none


class PreemptionNoticeEvent(Event, total=False):
    provider: Required[str]  # aws | gcp | azure (limits.preemption_notice)
    action: Required[str]  # what the provider will do: terminate, stop, hibernate, preempt
    deadline: float | None  # unix s by which it happens, when the provider says


class NoticeUnavailableEvent(Event, total=False):
    provider: Required[str]
    error: Required[str]  # why the metadata service could not be asked (said once)


class BudgetEvent(Event, total=False):
    attempt: Required[int]
    budget_usd: Required[float]
    spent_usd: Required[float]
    fraction: float  # budget_warning: the share of the budget crossed (notify.budget_fractions)


class FaultInjectedEvent(Event, total=False):
    action: Required[str]  # kill, term, nan, exit, ...
    attempt: int
    step: int
    after_s: float
    by: str
    seen_step: int
    code: int


class IdleEvent(Event, total=False):
    attempt: int
    since: float
    seconds: float
    activity: float  # percent
    threshold: float
    source: str


class IdleStopEvent(IdleEvent, total=False):
    reason: Required[str]


class ProgressWarningEvent(Event, total=False):
    attempt: Required[int]
    message: Required[str]
    reason: str  # restarted | unordered | dropped (supervisor/counter.py); absent: other
    dropped: int  # step lines dropped by the attempt's end (reason dropped)
    unknown_after: int  # progress unknown after this step (reasons unordered, dropped)


class SupervisorLostEvent(Event, total=False):
    attempt: Required[int]
    by: Required[str]  # watchdog | workload
    supervisor_pid: Required[int]
    grace_s: float


# ---- the workload (workload/*.py, integrations/*.py) ---------------------------------------


class WorkloadStartEvent(Event, total=False):
    attempt: Required[int]
    pid: Required[int]
    resume_from: Any
    world_size: int


class StepEvent(Event, total=False):
    """One step; the logged values (loss, lr, ...) ride along as extra fields."""

    step: Required[int]
    attempt: int
    total_steps: int
    step_time: float  # seconds
    data_wait: float  # seconds of the step spent waiting for data
    source: str  # log | tensorboard, for a black box


class HeartbeatEvent(Event, total=False):
    attempt: Required[int]
    phase: Required[str]
    phase_s: Required[float]
    step: int | None


class StopRequestedEvent(Event, total=False):
    attempt: Required[int]
    signal: Required[str]


class StoppedEvent(Event, total=False):
    attempt: Required[int]
    step: Required[int | None]
    checkpoint: Any
    reason: str


class DivergedEvent(Event, total=False):
    step: Required[int]
    loss: Required[float | str]  # non-finite as a string: JSON has no NaN
    reason: Required[str]
    attempt: int
    source: str


class RestoredEvent(Event, total=False):
    attempt: Required[int]
    step: Required[int | None]
    path: Required[str]
    seconds: Required[float]
    notes: Any
    source: str
    restored_to: Any
    step_estimate: str  # a watched checkpoint whose step is not proven: why
    # run.restore: "memory" (the memory tier), "disk" (the run's store) or "mirror" (a
    # step a resume fetched back from the mirror); "sharded", "watched" for the others
    memory: str  # why no memory copy was loaded where the tier had one (bad, rolled back)


class MetricEvent(Event, total=False):
    name: Required[str]
    value: Required[Any]
    attempt: int
    step: int
    per_attempt: str  # why it is a figure of this attempt only (workload/aggregates.py)
    instead: str  # what to judge the run by


class OutputEvent(Event, total=False):
    name: Required[str]
    path: Required[str]
    attempt: int
    hash: str
    size: int
    matched: Any
    pattern: str
    run_id: str
    source: str
    step: int


class OutputMissingEvent(Event, total=False):
    attempt: Required[int]
    name: Required[str]
    pattern: Required[str]
    reason: Required[str]
    matched: Any


class DrillEvent(Event, total=False):
    drill: Required[str]
    ok: Required[bool]
    step: int | None
    evidence: Any
    source: str
    spec_hash: str
    reference_run: str


class DrillStartEvent(Event, total=False):
    drill: Required[str]
    by: Required[str]
    cpu: bool
    source: str
    step: int | None


class WorkloadEndEvent(Event, total=False):
    attempt: Required[int]
    status: Required[str]  # ok | error: Type: message
    rank: int


class ResumeNoteEvent(Event, total=False):
    attempt: Required[int]
    note: Required[str]


class StaleCheckpointRemovedEvent(Event, total=False):
    attempt: Required[int]
    path: Required[str]
    resumed_step: int | None


@dataclass(frozen=True, slots=True)
class EventKind:
    """One kind of event: its payload type, what it means and who writes it."""

    name: str
    payload: Any  # the TypedDict class
    meaning: str
    writer: str  # the module (under acceptrun/) that writes it

    @property
    def required(self) -> frozenset[str]:
        """Fields every writer of this kind writes (besides ``t`` and ``kind``)."""
        keys: frozenset[str] = self.payload.__required_keys__
        return keys - {"t", "kind"}

    @property
    def optional(self) -> frozenset[str]:
        """Fields some writers write; others (a step's logged values) may ride along."""
        keys: frozenset[str] = self.payload.__optional_keys__
        return keys


def _kinds(*kinds: EventKind) -> dict[str, EventKind]:
    return {k.name: k for k in kinds}


_E = EventKind
EVENT_KINDS: dict[str, EventKind] = _kinds(
    # launch and close
    _E("run_start", RunStartEvent, "the run record was created by `acceptrun run`", "run/launch"),
    _E("audit", AuditEvent, "a lifecycle action: run, stop, kill, resume, drill; who, when", "record/workspace"),
    _E("usage", UsageEvent, "which client entry points the script calls", "run/launch"),
    _E("spec_warning", SpecWarningEvent, "a spec finding that is a warning, not an error", "run/launch"),
    _E("stopped_before_launch", StoppedBeforeLaunchEvent, "a stop signal arrived during preflight", "run/launch"),
    _E("preflight_failed", PreflightFailedEvent, "preflight failed: no attempt ran", "run/launch"),
    _E("mirror_fetch", MirrorFetchEvent, "a resume fetched a checkpoint back from the mirror", "run/lifecycle"),
    _E("mirror_quarantine", MirrorQuarantineEvent, "a mirrored step did not verify: a resume passed over it", "run/lifecycle"),
    _E("cleanup", CleanupEvent, "one cleanup command or remove pattern at the close", "run/close"),
    _E("best_effort_failed", BestEffortFailedEvent, "an optional part (ledger, report, summary, notify, a restart's re-verification) failed; recorded, not fatal", "run/close, verdict/core, notify/notifier, supervisor/restarts"),
    _E("ledger_failed", ErrorEvent, "ledger.json could not be built (older records; now best_effort_failed)", "run/close"),
    _E("report_failed", ErrorEvent, "report.html could not be written (older records; now best_effort_failed)", "run/close"),
    _E("inference_summary_failed", ErrorEvent, "the batch inference summary failed (older records; now best_effort_failed)", "run/close"),
    _E("verdict", VerdictEvent, "the verdict was decided and written", "run/close"),
    _E("log_repaired", LogRepairedEvent, "an append found a torn last line (a full disk, a kill) and terminated it first; a resume cut a torn step record", "_util/durable, run/lifecycle"),
    _E("reproduces", ReproducesEvent, "this run reproduces another: commit, diff, spec", "run/reproduce"),
    # attempts
    _E("attempt_start", AttemptStartEvent, "the supervisor started an attempt", "supervisor/core"),
    _E("attempt_exit", AttemptExitEvent, "an attempt ended (the fields of its exit.json)", "supervisor/core"),
    _E("decision", DecisionEvent, "what the supervisor decided after an attempt, and why", "supervisor/core"),
    _E("restart", RestartEvent, "an attempt is about to restart after a failure", "supervisor/core"),
    _E("give_up", GiveUpEvent, "no more restarts", "supervisor/core, supervisor/restarts"),
    _E("reverify", ReverifyEvent, "before a restart: the data and packages preflight verified, checked again", "capture/reverify"),
    _E("rollback", RollbackEvent, "the newest checkpoint was quarantined before a restart", "supervisor/restarts"),
    _E("hang_detected", HangDetectedEvent, "no progress (or only data waits) for the hang window", "supervisor/core"),
    _E("stacks", StacksEvent, "the stacks of a hung attempt were written", "supervisor/hang"),
    _E("stop_sent", SignalSentEvent, "the supervisor (or its watchdog) asked the workload to stop (SIGTERM)", "supervisor/core, supervisor/_watchdog"),
    _E("kill_sent", SignalSentEvent, "the supervisor (or its watchdog) killed the workload (SIGKILL)", "supervisor/core, supervisor/_watchdog"),
    _E("strays_killed", SignalSentEvent, "processes of the attempt outside its group were killed at its end", "supervisor/core"),
    _E("standby_start", StandbyEvent, "the next attempt was started to wait in run.restore() (limits.warm_restart)", "supervisor/standby"),
    _E("standby_skipped", StandbyEvent, "no standby beside the attempt: too little memory (the figures)", "supervisor/standby"),
    _E("standby_lost", StandbyEvent, "the standby exited before its turn: the restart is cold", "supervisor/standby"),
    _E("standby_gpu", StandbyEvent, "a standby held a CUDA context before its go (the script's code before run.restore())", "workload/standby"),
    _E("containment_unavailable", ContainmentUnavailableEvent, "neither a cgroup nor the child subreaper holds the attempt's processes", "supervisor/core"),
    _E("preemption_notice", PreemptionNoticeEvent, "the cloud said it takes the machine back: save and stop now", "supervisor/notice"),
    _E("preemption_notice_unavailable", NoticeUnavailableEvent, "the cloud's metadata service did not answer the notice's look (said once)", "supervisor/notice"),
    _E("budget_warning", BudgetEvent, "the spend passed the budget's warning share", "supervisor/budget"),
    _E("budget_stop", BudgetEvent, "the spend reached the budget: stopping", "supervisor/budget"),
    _E("fault_injected", FaultInjectedEvent, "a drill fault fired (--inject)", "supervisor/faults, workload/inject"),
    _E("idle", IdleEvent, "the workload sat idle for the idle window", "telemetry/idle"),
    _E("idle_stop", IdleStopEvent, "the supervisor stops an idle workload", "supervisor/stops"),
    _E("step_counter_restarted", StepCounterRestartedEvent, "a resumed script counts its steps from the start again: they are offset", "supervisor/axis"),
    _E("progress_warning", ProgressWarningEvent, "a black box's step log could not be read", "supervisor/progress"),
    _E("supervisor_lost", SupervisorLostEvent, "the supervisor died; the attempt was ended", "supervisor/_watchdog, workload/liveness"),
    # the workload
    _E("workload_start", WorkloadStartEvent, "init() attached to the record", "workload/run"),
    _E("step", StepEvent, "a step ended, with the values logged for it (in the step log, attempts/<n>/steps/, since record format 2)", "workload/loop, supervisor/progress"),
    _E("heartbeat", HeartbeatEvent, "the workload is alive: its phase and step", "workload/watch"),
    _E("stop_requested", StopRequestedEvent, "SIGTERM reached the loop", "workload/signals"),
    _E("stopped", StoppedEvent, "a graceful stop at a step boundary (then exit 143)", "workload/signals"),
    _E("diverged", DivergedEvent, "a non-finite loss or one above limits.max_loss", "workload/watch, supervisor/progress"),
    _E("restored", RestoredEvent, "a checkpoint was loaded", "workload/checkpointing, supervisor/external"),
    _E("metric", MetricEvent, "a final or evaluation metric", "workload/run"),
    _E("output", OutputEvent, "a registered output file, with its hash and size", "workload/run, supervisor/outputs"),
    _E("output_missing", OutputMissingEvent, "a declared output matched no file", "supervisor/outputs"),
    _E("drill_start", DrillStartEvent, "a restore drill started", "run/drills/restore"),
    _E("drill", DrillEvent, "the result of a drill", "workload/checkpointing, run/drills"),
    _E("workload_end", WorkloadEndEvent, "the workload process is ending", "workload/run"),
    _E("resume_note", ResumeNoteEvent, "a framework resume note (Lightning)", "integrations/lightning"),
    _E("stale_checkpoint_removed", StaleCheckpointRemovedEvent, "a checkpoint newer than the resume point was removed", "integrations/transformers"),
    # checkpoints and the mirror
    _E("checkpoint_stage", CheckpointStageEvent, "a checkpoint was staged: the loop's stall", "checkpoint/saver, checkpoint/sharded"),
    _E("checkpoint_commit", CheckpointCommitEvent, "a checkpoint was committed and verified", "checkpoint/store"),
    _E("checkpoint_failed", CheckpointFailedEvent, "a checkpoint save failed", "checkpoint/saver, checkpoint/sharded, supervisor/external"),
    _E("memory_tier", MemoryTierEvent, "the run's memory tier directory was made (docs/checkpoints.md)", "checkpoint/memtier"),
    _E("memory_saves", MemorySavesEvent, "an attempt's memory tier saves: count, stall, bytes; or the failure that turned it off", "workload/checkpointing"),
    _E("checkpoint_delete", CheckpointDeleteEvent, "a checkpoint was deleted (retention, gc)", "checkpoint/store, run/retention"),
    _E("checkpoint_quarantine", CheckpointQuarantineEvent, "a checkpoint failed verification and was moved aside", "checkpoint/store"),
    _E("checkpoint_staging_removed", CheckpointStagingRemovedEvent, "a dead writer's staging directory was removed", "checkpoint/store"),
    _E("checkpoint_captured", CheckpointCapturedEvent, "a watched checkpoint was captured", "supervisor/external"),
    _E("checkpoint_redated", CheckpointRedatedEvent, "a watched checkpoint's estimated step became known", "supervisor/external"),
    _E("checkpoint_capture_skipped", CheckpointNotCapturedEvent, "a watched checkpoint was not captured (yet)", "supervisor/external"),
    _E("checkpoint_not_settling", CheckpointNotSettlingEvent, "a watched file is rewritten too often to settle", "supervisor/external"),
    _E("checkpoint_capture_dropped", CheckpointNotCapturedEvent, "a watched checkpoint was given up on", "supervisor/external"),
    _E("checkpoint_not_captured", CheckpointNotCapturedEvent, "watched checkpoints cannot be captured", "supervisor/external"),
    _E("checkpoint_watch_error", ErrorEvent, "the checkpoint watcher failed", "supervisor/external"),
    _E("mirror_ok", MirrorOkEvent, "a checkpoint reached the mirror", "checkpoint/mirror"),
    _E("mirror_failed", MirrorFailedEvent, "a mirror upload failed", "checkpoint/mirror"),
    _E("mirror_delete", MirrorDeleteEvent, "a checkpoint was deleted from the mirror", "checkpoint/mirror"),
    _E("mirror_behind", MirrorBehindEvent, "the mirror is behind at the end", "checkpoint/saver, supervisor/external"),
    # notifications
    _E("notify", NotifyEvent, "a message to a [notify] target: delivered, failed, dropped or not delivered; time to detect", "notify/notifier"),
    # telemetry, tune, inference, serving
    _E("prometheus", PrometheusEvent, "the Prometheus endpoint is serving", "telemetry/sampler"),
    _E("prometheus_failed", PrometheusFailedEvent, "the Prometheus endpoint could not start", "telemetry/sampler"),
    _E("trial", TrialEvent, "one tune trial measured", "cli/tune"),
    _E("shard_commit", ShardCommitEvent, "a batch inference shard was committed", "workload/batch"),
    _E("shard_redo", ShardRedoEvent, "a batch inference shard is done again", "workload/batch"),
    _E("serving_ready", ServingReadyEvent, "the server answered its readiness probe", "serving/driver"),
    _E("serving_not_ready", ServingReadyEvent, "the server never became ready", "serving/driver"),
    _E("serving_load_start", ServingLoadStartEvent, "the serving load test started", "serving/driver"),
    _E("serving_done", ServingDoneEvent, "the serving load test ended", "serving/driver"),
    _E("serving_error", ServingErrorEvent, "the serving load test failed", "serving/driver"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EventCheck:
    """What :func:`validate_event` found: the kind, whether it is known, and any problems."""

    kind: str
    known: bool
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_event(event: object) -> EventCheck:
    """Check one event against the registry; never raises on a bad event.

    An unknown kind is not a problem (``known=False``); a known kind that lacks a required
    field, or a line without ``kind``/``t``, is reported in ``problems``.
    """
    if not isinstance(event, Mapping):
        return EventCheck("", False, (f"event is a {type(event).__name__}, not an object",))
    kind = event.get("kind")
    t = event.get("t")
    problems: list[str] = []
    if not isinstance(kind, str) or not kind:
        problems.append(f"event at t={t} has no kind")
        return EventCheck("", False, tuple(problems))
    if not isinstance(t, int | float) or isinstance(t, bool):
        problems.append(f"{kind} event has no time t (got {t!r})")
    spec = EVENT_KINDS.get(kind)
    if spec is None:
        return EventCheck(kind, False, tuple(problems))
    missing = sorted(spec.required - event.keys())
    problems.extend(f"{kind} event at t={t} lacks required field {name}" for name in missing)
    return EventCheck(kind, True, tuple(problems))


def event_table() -> str:
    """The Markdown table of event kinds for docs/architecture.md."""
    lines = [
        "| kind | meaning | required fields | written by |",
        "|---|---|---|---|",
    ]
    for k in EVENT_KINDS.values():
        required = ", ".join(sorted(k.required)) or "–"
        lines.append(f"| `{k.name}` | {k.meaning} | {required} | {k.writer} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(event_table(), end="")
