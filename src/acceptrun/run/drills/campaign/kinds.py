"""The fault kinds of a resilience campaign: how each is injected and what is true of it.

Each :class:`FaultKind` holds the ground truth the campaign scores acceptrun against: the
fault (what, injected where and when), the failure class acceptrun must name, whose
failure that class is (:data:`acceptrun.record.status.RESPONSIBILITY`: the party acceptrun
would blame had it happened for real, not ``drill``), and the action it must take
(``restart``, ``rollback`` or ``stop``). ``requires`` says why a kind cannot be tried on
this spec or machine; such a kind counts as not tried, never as passed.

Every injected kind is a fault the workload's client does to itself
(:mod:`acceptrun.workload.inject`), inside the run's own processes, record and store (and
``rendezvous_refused``'s ``rdzv``, which the supervisor fires as the restart starts:
supervisor/faults.py); on
a black box (no client API), only the kinds marked ``black_box``: the supervisor's kill and
SIGTERM at a step read from the output, and the supervisor's own faults (campaign/outside.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from acceptrun.spec.model import RunSpec
from acceptrun.workload.contract import ENV_HEARTBEAT_S, HEARTBEAT_S
from acceptrun.workload.inject import MIRROR_OUTAGE_S, SLOW_SAVE_S, STRAGGLE_S, STRAGGLE_STEPS

__all__ = [
    "FAMILIES",
    "KINDS",
    "NOT_BLACK_BOX",
    "Expect",
    "FaultKind",
    "Reference",
    "kind_named",
]

FAMILIES = ("process", "numerics", "storage", "environment", "distributed")
NOT_BLACK_BOX = (
    "not applicable to a black box: the fault is done by the client API inside the loop "
    "(acceptrun.init()), which the script does not use"
)


@dataclass(frozen=True, slots=True)
class Reference:
    """What the uninterrupted run showed: the steps and checkpoints a fault is placed among."""

    steps: list[int]
    checkpoints: list[int]


@dataclass(frozen=True, slots=True)
class Expect:
    """What acceptrun must say about a kind: the ground truth it is scored against."""

    klass: str
    """The failure class of the attempt the fault ended (exit.json ``class``)."""
    whose: str
    """Whose failure the class says it was (provider, workload, unknown)."""
    action: str
    """restart, rollback or stop."""
    quarantine: bool = False
    """A damaged checkpoint must be quarantined before the restart."""
    slow_save_s: float | None = None
    """A checkpoint write after the fault must be recorded as taking at least this long."""
    mirror_outage: bool = False
    """The mirror's failed uploads must be on record, then the newest checkpoint mirrored."""
    refused: bool = False
    """Named by a later attempt (a restart that refuses to start, a rendezvous refused):
    scored on the run's last failed attempt (the first is the fault's own kill)."""


Requirement = Callable[[RunSpec, Reference], str | None]


@dataclass(frozen=True, slots=True)
class FaultKind:
    """One kind of failure the campaign injects, with its ground truth."""

    name: str
    family: str
    what: str
    """The fault, in words (what, where)."""
    how: str
    """How it is injected here."""
    fault: str | None
    """The ``--inject`` form with ``{step}``; None: the campaign cannot inject it here."""
    expect: Callable[[RunSpec], Expect]
    requires: list[Requirement] = field(default_factory=list)
    after_checkpoint: bool = True
    """Placed after the attempt's first checkpoint, so a restart has one to resume from."""
    nth_checkpoint: int = 1
    """By default the fault lands after this checkpoint of the reference (2: one to spare)."""
    outside: bool = False
    """Fired by the campaign from outside the run (campaign/outside.py), not by the client."""
    black_box: bool = False
    """Also tried on a black box (no client API): fired by the supervisor or the campaign."""
    scratch: bool = False
    """Run on the campaign's copy of the spec with a scratch part (campaign/scratch.py)."""

    def why_not_tried(self, spec: RunSpec, ref: Reference, client: bool = True) -> str | None:
        """Why this kind cannot be tried on ``spec`` here, or None when it can.

        ``client`` False: the spec's script is a black box (no client API).
        """
        if not client:
            if not self.black_box:
                return NOT_BLACK_BOX
            if self.fault is not None and (why := _progress(spec, ref)) is not None:
                return why
        for check in self.requires:
            if (why := check(spec, ref)) is not None:
                return why
        return None

    def injection(self, step: int) -> str:
        """The fault text for a step (``kill@step=12:after=checkpoint``)."""
        assert self.fault is not None, f"{self.name} is not injectable"
        after = ":after=checkpoint" if self.after_checkpoint else ""
        return self.fault.format(step=step) + after


# ---- requirements -----------------------------------------------------------------------------


def _restarts(spec: RunSpec, ref: Reference) -> str | None:
    if spec.limits.max_restarts < 1:
        return "limits.max_restarts = 0: a restart cannot be drilled; set it to 1 or more"
    return None


def _progress(spec: RunSpec, ref: Reference) -> str | None:
    if spec.progress.pattern is None and spec.progress.tensorboard is None:
        return (
            "the black box's steps are not read ([progress] pattern or tensorboard is not "
            "set): the supervisor cannot fire a fault at a step; set [progress] pattern"
        )
    return None


def _hang_window(spec: RunSpec, ref: Reference) -> str | None:
    if spec.limits.hang_window is None:
        return 'limits.hang_window is not set, so no hang is ever detected; set it (e.g. "20m")'
    return None


def _heartbeat_s(spec: RunSpec) -> float:
    text = spec.env.get(ENV_HEARTBEAT_S) or os.environ.get(ENV_HEARTBEAT_S)
    try:
        return float(text) if text else HEARTBEAT_S
    except ValueError:
        return HEARTBEAT_S


def _stall_window(spec: RunSpec, ref: Reference) -> str | None:
    if (why := _hang_window(spec, ref)) is not None:
        return why
    beat = _heartbeat_s(spec)
    window = float(spec.limits.hang_window or 0)
    if window < 2 * beat:
        return (
            f"limits.hang_window = {window:g}s is under two heartbeats ({beat:g}s each): the "
            "supervisor cannot see the loop's data-wait phase in time to tell a stalled "
            f"loader from a hang; raise it to {2 * beat:g}s or more (or set {ENV_HEARTBEAT_S} "
            "in [env])"
        )
    return None


def _max_loss(spec: RunSpec, ref: Reference) -> str | None:
    if spec.limits.max_loss is None:
        return (
            "limits.max_loss is not set: a finite loss spike or a corrupted parameter is "
            "only seen through a loss above it; set it (e.g. 10 times the first loss)"
        )
    return None


def _local_mirror(spec: RunSpec, ref: Reference) -> str | None:
    mirror = spec.checkpoint.mirror
    if not mirror:
        return '[checkpoint] mirror is not set: there is no mirror to lose; set it (e.g. "mirror")'
    if "://" in mirror.removeprefix("file://"):
        return (
            f"checkpoint.mirror = {mirror!r} is remote: the campaign cuts off a local mirror "
            "only; drill a remote one with a local path of the same spec"
        )
    return None


def _multi_process(spec: RunSpec, ref: Reference) -> str | None:
    if spec.resources.processes * spec.resources.nodes < 2:
        return "the spec runs one process: there is no rank to kill, hang or slow"
    return None


def _two_restarts(spec: RunSpec, ref: Reference) -> str | None:
    if spec.limits.max_restarts < 2:
        return (
            f"limits.max_restarts = {spec.limits.max_restarts}: the fault's kill and the "
            "refused rendezvous each take a restart; set it to 2 or more"
        )
    return None


def _own_torchrun(spec: RunSpec, ref: Reference) -> str | None:
    from acceptrun.workload.distributed import builds_torchrun

    if (why := builds_torchrun(spec)) is not None:
        return f"acceptrun does not build this spec's one-node torchrun command: {why}"
    return None


def _data_copy(spec: RunSpec, ref: Reference) -> str | None:
    from acceptrun.run.drills.campaign.scratch import data_copy_problem

    return data_copy_problem(spec)


def _python_workload(spec: RunSpec, ref: Reference) -> str | None:
    from acceptrun.capture.preflight import interpreter_source

    python, how = interpreter_source(spec)
    if python is None:
        return (
            f"{how}: provenance lists no packages of the job's interpreter, so a package "
            "changed under it cannot be named"
        )
    return None


# ---- expectations -----------------------------------------------------------------------------


def _fixed(
    klass: str, whose: str, action: str, quarantine: bool = False
) -> Callable[[RunSpec], Expect]:
    return lambda spec: Expect(klass, whose, action, quarantine)


def _refused(spec: RunSpec) -> Expect:
    return Expect("setup_changed", "workload", "stop", refused=True)


def _divergence(spec: RunSpec) -> Expect:
    action = "rollback" if spec.limits.on_divergence == "rollback" else "stop"
    return Expect("diverged", "workload", action)


KINDS: tuple[FaultKind, ...] = (
    FaultKind("sigkill", "process", "SIGKILL to the workload, no warning",
              "the client sends SIGKILL to itself when the step ends (a black box: the "
              "supervisor, once it has read the step)", "kill@step={step}",
              _fixed("killed", "unknown", "restart"), [_restarts], black_box=True),
    FaultKind("sigterm", "process", "SIGTERM to the workload, a preemption with its grace",
              "the client sends SIGTERM to itself; it checkpoints the step and exits 143 "
              "(a black box: the supervisor sends it once it has read the step)",
              "term@step={step}", _fixed("preempted", "provider", "restart"), [_restarts],
              after_checkpoint=False, black_box=True),
    FaultKind("exit_code", "process", "the workload exits with status 3",
              "os._exit(3) when the step ends", "exit=3@step={step}",
              _fixed("failed", "unknown", "restart"), [_restarts]),
    FaultKind("exception", "process", "an uncaught RuntimeError out of the training loop",
              "raised by the client when the step ends", "raise@step={step}",
              _fixed("failed", "unknown", "restart"), [_restarts]),
    FaultKind("host_oom", "process", "the workload runs out of host memory",
              "RLIMIT_AS lowered a little above use, then filled: a real MemoryError",
              "oom@step={step}", _fixed("host_oom", "workload", "restart"), [_restarts]),
    FaultKind("hang", "process", "the training loop stops; the heartbeat goes on",
              "the client sleeps forever inside the step", "hang@step={step}",
              _fixed("hang", "workload", "restart"), [_restarts, _hang_window]),
    FaultKind("supervisor_killed", "process", "SIGKILL to the supervisor (acceptrun run)",
              "the campaign runs `acceptrun run` as a process, kills it after a checkpoint, "
              "then runs `acceptrun resume`", None,
              _fixed("interrupted", "unknown", "restart"), outside=True, black_box=True),
    FaultKind("supervisor_stopped", "process",
              "SIGSTOP to the supervisor for longer than the hang window, then SIGCONT",
              "the campaign runs `acceptrun run` as a process and stops it after a checkpoint",
              None, _fixed("success", "none", "none"), outside=True, black_box=True),
    FaultKind("nan", "numerics", "the loss of one step is NaN",
              "the client replaces the step's logged loss by NaN", "nan@step={step}",
              _divergence),
    FaultKind("loss_spike", "numerics", "the loss of one step jumps a million-fold",
              "the client multiplies the step's logged loss by 1e6", "spike@step={step}",
              _divergence, [_max_loss]),
    FaultKind("param_bitflip", "numerics",
              "one bit flips in a parameter (silent corruption of the model in memory)",
              "the top exponent bit of the first value of the first array or tensor given "
              "to run.restore() is inverted", "bitflip@step={step}", _divergence, [_max_loss]),
    FaultKind("disk_full", "storage", "the disk fills up under the run",
              "RLIMIT_FSIZE lowered to 1 byte with SIGXFSZ ignored: every write past it "
              "fails with EFBIG (no tmpfs or quota without root)", "diskfull@step={step}",
              _fixed("disk_full", "workload", "stop")),
    FaultKind("ckpt_truncated", "storage",
              "the newest checkpoint's largest file is cut in half, then the workload dies",
              "truncated by the client, then SIGKILL", "cktrunc@step={step}",
              _fixed("killed", "unknown", "restart", quarantine=True), [_restarts],
              nth_checkpoint=2),
    FaultKind("ckpt_bitflip", "storage",
              "one byte of the newest checkpoint is inverted, then the workload dies",
              "inverted by the client, then SIGKILL", "ckflip@step={step}",
              _fixed("killed", "unknown", "restart", quarantine=True), [_restarts],
              nth_checkpoint=2),
    FaultKind("loader_stalled", "storage", "the data loader stops delivering",
              "the client waits forever inside run.data_wait()", "stall@step={step}",
              _fixed("data_stall", "unknown", "restart"), [_restarts, _stall_window]),
    FaultKind("ckpt_dir_slow", "storage",
              f"one checkpoint write takes {SLOW_SAVE_S:g} s longer (a slow directory)",
              f"simulated inside the process: the client's next checkpoint write sleeps "
              f"{SLOW_SAVE_S:g} s after the store began it (slowing a real file system, FUSE, "
              "dm-delay or a cgroup io.max limit, needs root)", "slowckpt@step={step}",
              lambda spec: Expect("success", "none", "none", slow_save_s=SLOW_SAVE_S)),
    FaultKind("mirror_unreachable", "storage",
              f"the checkpoint mirror is unreachable for {MIRROR_OUTAGE_S:g} s, then back",
              "the client moves the run's own mirror root aside and puts a plain file in its "
              "place, then a timer puts it back", "mirrorgone@step={step}",
              lambda spec: Expect("success", "none", "none", mirror_outage=True),
              [_local_mirror]),
    FaultKind("data_changed", "storage", "a file of [data] changes between attempts",
              "one byte of the first data file inverted by the client, then SIGKILL; in the "
              "campaign's copy of the data, never the data itself", "datachange@step={step}",
              _refused, [_restarts, _data_copy], scratch=True),
    FaultKind("package_changed", "environment", "a package's version changes between attempts",
              "the client raises the version of a scratch package (metadata only, put on the "
              "job's PYTHONPATH by the campaign's copy of [env]), then SIGKILL",
              "pkgchange@step={step}", _refused, [_restarts, _python_workload], scratch=True),
    FaultKind("rank_killed", "distributed", "one rank (rank 0) of a torchrun group is killed",
              "the client of rank 0 sends SIGKILL to itself (a step fault fires in one rank, "
              "ACCEPTRUN_INJECT_RANK)", "kill@step={step}",
              _fixed("distributed", "unknown", "restart"), [_multi_process, _restarts]),
    FaultKind("rank_hung", "distributed",
              "one rank hangs; the others wait for it inside the next collective",
              "the client of rank 0 sleeps forever inside the step", "hang@step={step}",
              _fixed("hang", "workload", "restart"), [_multi_process, _restarts, _hang_window]),
    FaultKind("straggler", "distributed",
              f"one rank (rank 0) is slowed: {STRAGGLE_STEPS} of its steps take "
              f"{STRAGGLE_S:g} s longer; the others wait for it in each collective",
              "the client of rank 0 sleeps at the end of each of those steps "
              "(ACCEPTRUN_INJECT_RANK)", "slow@step={step}",
              _fixed("success", "none", "none"), [_multi_process]),
    FaultKind("rendezvous_refused", "distributed",
              "the restart's rendezvous is refused: its c10d store accepts and closes every "
              "connection (a store host down or a port taken by something else)",
              "rank 0's client sends SIGKILL to itself after a checkpoint; the supervisor "
              "starts the next attempt's torchrun at a loopback c10d endpoint held by a "
              "listener of its own that accepts and closes each connection, with a store read "
              "timeout of a few seconds", "rdzv@attempt=2,kill@step={step}",
              lambda spec: Expect("distributed", "unknown", "restart", refused=True),
              [_multi_process, _own_torchrun, _two_restarts]),
)  # fmt: skip


def kind_named(name: str) -> FaultKind:
    """The kind called ``name``; a ValueError naming the known ones otherwise."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"unknown fault kind {name!r}; known: {', '.join(k.name for k in KINDS)}")
