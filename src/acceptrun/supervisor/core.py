"""The local supervisor: attempts, failure classes, restarts, stops, hangs, wall time.

For each attempt it picks the newest checkpoint that verifies, starts the workload as a
:class:`ChildProcess` with the contract's environment variables, and watches it
(:class:`~acceptrun.supervisor.watch.AttemptWatch`). Each poll asks the attempt's stop
causes (:mod:`acceptrun.supervisor.stops`): a serving run's finished load, stop requests
(SIGTERM, SIGINT, SIGUSR1, SIGHUP to the supervisor, or ``acceptrun stop|kill``), the
budget, the wall-time limit, idleness, time-based injected faults, and no progress for
``limits.hang_window`` (a hang or a data stall). When it ends, :func:`~acceptrun.supervisor.classify.classify` names the failure
class from the exit status, the stderr tail and the events; ``attempts/<n>/exit.json``
holds the class, its evidence, the decision taken and the work lost.

Policy: transient classes restart from the newest verified checkpoint with exponential
backoff up to ``limits.max_restarts`` (OOMs once); user errors never restart; a
divergence stops the run, or with ``limits.on_divergence = "rollback"`` quarantines the
newest checkpoint and restarts from the one before (supervisor/restarts.py).

The attempt loop is this module's; its collaborators are rooms of their own: the restart
policy (restarts.py), the budget (budget.py), injected faults (faults.py), a hung
workload's stacks (hang.py), a watched checkpoint's capture and dating (external.py,
dating.py), a serving run's side task (sidetask.py) and the stop causes (stops.py).

A stop request becomes SIGTERM to the command's process ("checkpoint now, then exit";
the whole group for a string command); after ``limits.grace_period`` the group is
SIGKILLed. A second Ctrl-C kills at
once. A hung workload cannot checkpoint: its stacks are collected (SIGUSR2 to the
client's faulthandler, or py-spy) and the group is SIGKILLed (hang.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.redact import redact_argv
from acceptrun.checkpoint.owner import mirror_root, open_run_store, owner_of, store_root
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.errors import RecordError, UserError
from acceptrun.record.workspace import RunRecord, now_iso, user_at_host
from acceptrun.spec.model import RunSpec, format_duration
from acceptrun.supervisor import stops
from acceptrun.supervisor.axis import StepAxis
from acceptrun.supervisor.budget import BudgetWatch
from acceptrun.supervisor.classify import (
    AttemptFacts,
    classify,
    client_fault,
    oom_kill_count,
    stderr_tail,
)
from acceptrun.supervisor.containment import PROCESSES_FILE, contain
from acceptrun.supervisor.external import CheckpointWatcher, restore_for_attempt, with_resume_args
from acceptrun.supervisor.faults import (
    black_box_step_faults,
    close_rendezvous,
    fire_step_faults,
    fire_time_fault,
    rendezvous_fault,
    time_faults,
)
from acceptrun.supervisor.hang import stop_hung
from acceptrun.supervisor.lease import Watchdog
from acceptrun.supervisor.notice import notice_watch
from acceptrun.supervisor.outcome import (
    AttemptResult,
    SupervisorResult,
    attempt_result,
    attempt_work,
)
from acceptrun.supervisor.process import UNBUFFERED, ChildProcess, contract_env, python_output
from acceptrun.supervisor.progress import ProgressReader
from acceptrun.supervisor.restarts import RestartPolicy, Reverify
from acceptrun.supervisor.sidetask import SideTask, StartSideTask
from acceptrun.supervisor.standby import Standby, StandbyKeeper
from acceptrun.supervisor.stops import PollState, Stop, StopCause
from acceptrun.supervisor.watch import RECENT_STEPS, AttemptWatch
from acceptrun.workload.contract import (
    CONTROL_FILE,
)
from acceptrun.workload.usage import detect_usage

__all__ = ["AttemptResult", "Supervisor", "SupervisorResult"]

POLL_S = (
    0.25  # seconds between checks (stop requests, limits, hangs); a child's exit wakes it at once
)
TRACK_S = 1.0  # seconds between listings of the attempt's processes (processes.json)
MAX_BACKOFF_S = 300.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
STOP_CAUSES = ("user", "notice", "budget", "wall_time", "idle")  # stops it asked for


@dataclass(slots=True)
class _Attempt:
    """One running attempt: its process, the helpers that watch it, and its stop so far."""

    number: int
    adir: Path
    env: dict[str, str]
    child: ChildProcess
    watch: AttemptWatch
    resume_step: int | None
    oom_before: int | None
    progress: ProgressReader | None  # a black box's step lines or TensorBoard files
    step_faults: list[Any]  # kill/term@step=N the supervisor fires for a black box
    watchdog: Watchdog
    watcher: CheckpointWatcher | None
    side: SideTask | None  # a serving run's load test (serving/driver.py), its thread
    poll: PollState = field(init=False)
    stop_sent_at: float | None = None  # monotonic s of the SIGTERM; inf once killed
    diverged_kill: bool = False  # a black box SIGKILLed for a diverged loss

    def __post_init__(self) -> None:
        self.poll = PollState(attempt=self.number, elapsed=0.0)


class Supervisor:
    """Runs a spec's command as attempts 1..N under the spec's limits."""

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        *,
        echo: bool = True,
        say: Callable[[str], None] = lambda _msg: None,
        base_env: Mapping[str, str] | None = None,
        first_attempt: int = 1,
        price: Any = None,
        billing_start: float | None = None,
        prometheus_port: int | None = None,
        side_task: StartSideTask | None = None,
        reverify: Reverify | None = None,  # before attempt 2+: the data and packages unchanged?
    ) -> None:
        self.record = record
        self.side_task = side_task  # started beside each attempt (supervisor/sidetask.py)
        self.spec = spec
        self.echo = echo
        self.say = say
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.first_attempt = first_attempt  # > 1 when `acceptrun resume` continues a run
        # The budget: a cost.catalog.Price and when billing started (unix s, the launch).
        self.budget = BudgetWatch(
            record, spec, price=price,
            billing_start=time.time() if billing_start is None else billing_start,
            lookahead_s=spec.limits.grace_period + POLL_S, say=say,
        )  # fmt: skip
        self._stop_reason: str | None = None
        self.restarts = RestartPolicy(
            record, spec, lambda n: self._store(lambda k, f: self._event(k, n, f)), reverify
        )
        self._kill_now = False
        self._wake = threading.Event()
        # Samplers, the idle detector (a stop cause), Prometheus (acceptrun.telemetry).
        from acceptrun.telemetry.sampler import RunTelemetry

        self.telemetry = RunTelemetry(
            record, spec, say=say, prometheus_port=prometheus_port, spend=self.budget.spend
        )
        # How the command uses acceptrun (acceptrun.workload.usage): a black box's steps come from
        # its logs or TensorBoard files (supervisor/progress.py), when the spec says how.
        self.usage = detect_usage(spec)
        self.notice = notice_watch(record, spec)  # the cloud's preemption notice, or None
        self.standby = StandbyKeeper(  # the next attempt, waiting in run.restore() (standby.py)
            record, spec, client=self.usage.client, echo=echo, side_task=side_task is not None,
            launch=lambda n: (self._command(env := self._env(n)), env),
        )  # fmt: skip

    # ---- signals ------------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the workload to stop gracefully (safe to call from a signal handler)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        elif reason.startswith("signal SIGINT"):
            self._kill_now = True  # a second Ctrl-C: the user means it
        self._wake.set()

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        # `acceptrun stop|kill RUN` writes control.json, then signals: it says who asked.
        control = None
        try:
            control = self.record.read_json(CONTROL_FILE)
        except Exception:  # a damaged control file must not crash the signal handler
            control = None
        if isinstance(control, dict) and control.get("action") in ("stop", "kill"):
            self.request_stop(f"acceptrun {control['action']} by {control.get('by', '?')}")
            if control["action"] == "kill":
                self._kill_now = True
            self._wake.set()
            return
        self.request_stop(f"signal {signal.Signals(signum).name} to the supervisor")

    # ---- the attempts loop --------------------------------------------------------------------

    def run(self) -> SupervisorResult:
        """Run attempts until one ends the run (or a limit or a stop request does)."""
        result = SupervisorResult()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            # A signal the caller ignores stays ignored: `nohup acceptrun run` (SIGHUP) and
            # `acceptrun run &` from a script (SIGINT) must not stop the run.
            previous = {
                s: signal.signal(s, self._on_signal)
                for s in STOP_SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN
            }
        # A stop or kill request was for an earlier supervisor of this run, not this one.
        self.record.file(CONTROL_FILE).unlink(missing_ok=True)
        start = time.monotonic()
        self.telemetry.open()  # the Prometheus endpoint, when asked for
        if self.notice is not None:
            self.notice.start()  # the cloud's preemption notice (supervisor/notice.py)
        try:
            self._attempts(result, start)
        finally:
            self.standby.discard()  # the run ends: a standby leaves nothing behind
            self.telemetry.close()
            if self.notice is not None:
                self.notice.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        return result

    def _attempts(self, result: SupervisorResult, start: float) -> None:
        """Attempt after attempt, until :meth:`_why_stop` names a reason to stop."""
        limits = self.spec.limits
        attempt = self.first_attempt - 1
        while True:
            attempt += 1
            deadline = None if limits.wall_time is None else start + limits.wall_time
            if attempt > self.first_attempt and self._over_budget(attempt):
                result.stop_reason = f"not restarted: {self._stop_reason}"
                self.record.event(
                    "give_up", sync=True, attempt=attempt - 1, reason=result.stop_reason
                )
                return
            res = self._run_attempt(attempt, deadline)
            result.attempts.append(res)
            result.stop_reason = self._why_stop(attempt, res, result.attempts, deadline)
            if result.stop_reason is not None:
                return

    def _why_stop(
        self,
        attempt: int,
        res: AttemptResult,
        attempts: list[AttemptResult],
        deadline: float | None,
    ) -> str | None:
        """After an attempt: why supervision ends, or None once the restart backoff passed."""
        limits = self.spec.limits
        if res.outcome in (
            "success", "stopped", "wall_time", "budget", "idle", "not_started",
            "not_ready", "load_failed",  # serving runs (acceptrun.serving)
        ):  # fmt: skip
            return res.reason
        if self._stop_reason is not None:
            # The stop came as the attempt ended on its own: honour it, no restart.
            return f"stopped on request ({self._stop_reason})"
        why_not = self.restarts.why_not(res, attempts)
        restarts = attempt - self.first_attempt  # this supervisor's, not a resumed run's
        if why_not is None and restarts >= limits.max_restarts:
            why_not = (
                f"gave up after {attempt} attempt(s): limits.max_restarts = {limits.max_restarts}"
            )
        if why_not is not None:
            self._decide(res, "stop", why_not)
            self.record.event("give_up", sync=True, attempt=attempt, reason=why_not)
            return why_not
        delay = self.restarts.backoff(res, restarts, MAX_BACKOFF_S)  # none after a hang
        if deadline is not None and time.monotonic() + delay >= deadline:
            return "wall time would pass during the restart backoff"
        why = f"{res.failure_class} is retried from the newest verified checkpoint"
        self._decide(res, "restart", f"{why}, in {format_duration(delay)}")
        self.say(
            f"attempt {attempt} {res.reason} ({res.failure_class}); restarting in {format_duration(delay)}"
        )
        self.record.event(
            "restart", sync=True, attempt=attempt + 1, after=res.outcome, backoff_s=delay
        )
        # _wake is only ever set together with _stop_reason: never clear it, or a
        # stop that arrived since the attempt ended would be lost for the backoff.
        if self._wake.wait(delay):
            return f"stopped during restart backoff ({self._stop_reason})"
        return None

    def _decide(self, res: AttemptResult, action: str, why: str) -> None:
        res.decision = f"{action}: {why}"
        self.record.write_json(f"attempts/{res.attempt}/exit.json", res.to_dict())
        self.record.event("decision", sync=True, attempt=res.attempt, action=action, why=why)

    @property
    def checkpoint_dir(self) -> Path:
        """The run's own store: ``checkpoint.dir/<run id>/`` or the record's (checkpoint/owner)."""
        return store_root(self.record, self.spec)

    def _store(self, on_event: Any = None) -> CheckpointStore:
        """The run's store, its owner checked (another run's raises StoreOwnedError)."""
        return open_run_store(
            self.record, self.spec, retention=False, on_event=on_event, claim=True
        )

    def _resume_point(self, attempt: int) -> tuple[str, int | None]:
        """The newest checkpoint that verifies (bad ones are quarantined), or none.

        Verification re-reads every file: the cost of one read of the checkpoint per
        restart, paid before the workload starts rather than by a failed restore.
        """
        store = self._store(lambda kind, fields: self._event(kind, attempt, fields))
        store.remove_stale_staging()
        info = store.latest_verified()
        return ("", None) if info is None else (str(info.path), info.step)

    def _start_watcher(
        self,
        watcher: CheckpointWatcher | None,
        pid: int,
        watch: AttemptWatch,
        progress: ProgressReader | None,
    ) -> CheckpointWatcher | None:
        """Start polling (its own thread) once the workload runs."""
        if watcher is not None:
            watcher.pid = pid
            watcher.dating.events = watch.step_window  # the recent steps it dates by
            watcher.dating.progress = progress  # the steps as read, each with its time
            watcher.start()
        return watcher

    def _new_watcher(
        self, attempt: int, resume_step: int | None, axis: StepAxis | None = None
    ) -> CheckpointWatcher | None:
        """Capture the script's own checkpoints (checkpoint.watch): made, and what is there
        noted as old, before the workload starts."""
        ck = self.spec.checkpoint
        if not ck.watch:
            return None
        mirror = None
        if ck.mirror:
            from acceptrun.checkpoint.mirror import Mirror

            mirror = Mirror(
                str(mirror_root(self.record, self.spec)),
                owner=owner_of(self.record),
                state_path=self.record.file("mirror.json"),
                on_event=lambda kind, fields: self._event(kind, attempt, fields),
            )
        prov = self.record.read_json("provenance.json") or {}
        watcher = CheckpointWatcher(
            self.spec, self.checkpoint_dir, attempt=attempt, pid=0,
            events=list,  # the attempt's events, once it runs (_start_watcher)
            on_event=lambda kind, fields: self._event(kind, attempt, fields),
            resume_step=resume_step, mirror=mirror, axis=axis,
            meta={
                "run_id": self.record.run_id,
                "spec_hash": self.record.state.get("spec_hash") or self.spec.hash,
                "provenance_hash": prov.get("hashes", {}).get("all"),
            },
            exclude=[self.checkpoint_dir, self.record.path],
        )  # fmt: skip
        watcher.note_existing()
        return watcher

    def _start_side_task(self, attempt: int, child: ChildProcess, adir: Path) -> SideTask | None:
        """The side task beside the attempt (a serving run's load), started; None without one."""
        if self.side_task is None:
            return None
        task = self.side_task(
            attempt, launched_at=child.started_at, pid=child.pid,
            logs=(adir / "stdout.log", adir / "stderr.log"),
        )  # fmt: skip
        task.start()
        return task

    def _event(self, kind: str, attempt: int, fields: dict[str, Any]) -> None:
        self.record.event(kind, sync=True, attempt=attempt, **fields)

    def _unbuffered_by(self) -> str:
        """Who decided the job's PYTHONUNBUFFERED, as contract_env did (supervisor/process.py)."""
        return python_output(dict(self.base_env), self.spec.env, self.spec.python_unbuffered)

    def _env(self, attempt: int, resume_from: str = "") -> dict[str, str]:
        return contract_env(
            self.base_env, self.spec, self.record, attempt=attempt, resume_from=resume_from,
            checkpoint_dir=self.checkpoint_dir,
        )  # fmt: skip

    def _command(self, env: dict[str, str]) -> list[str]:
        """The argv: the command, or torchrun around it (processes > 1; workload/distributed.py:
        a SpecError for a command torchrun cannot start, its shutdown timeout and forwarded
        signals added to ``env``); an injected rdzv fault's rendezvous (supervisor/faults.py)."""
        from acceptrun.workload.distributed import launch_command

        return rendezvous_fault(self.record, self.spec, env, launch_command(self.spec, env))

    def _run_attempt(self, attempt: int, deadline: float | None) -> AttemptResult:
        """Start attempt ``attempt``, watch it until it exits, and record how it ended."""
        started = self._launch(attempt)
        if isinstance(started, AttemptResult):
            return started  # not started
        returncode = self._supervise(started, self._stop_causes(started, deadline))
        return self._conclude(started, returncode)

    def _launch(self, attempt: int) -> _Attempt | AttemptResult:
        """Start the attempt's process; an AttemptResult ``not_started`` when it cannot start."""
        adir = self.record.attempt_dir(attempt)
        adir.mkdir(parents=True, exist_ok=True)
        if (refused := self.restarts.refused(attempt)) is not None:
            return refused  # what preflight verified changed: recorded, the run stops
        resume_from, resume_step = self._resume_point(attempt)
        # Started while the attempt before ran (supervisor/standby.py), or None.
        standby = self.standby.take(attempt) if attempt > self.first_attempt else None
        env = self._env(attempt, resume_from) if standby is None else standby.child.env
        try:
            command = self._command(env) if standby is None else standby.child.argv
            restored = restore_for_attempt(
                self.record, self.spec, self._store(), attempt, resume_step
            )
            if restored is not None:
                command = with_resume_args(command, self.spec, restored)
        except (UserError, RecordError, OSError) as exc:  # UserError: SpecError, refused restore
            # processes > 1 with a command torchrun cannot run, or a watched checkpoint
            # that could not be put back where the script expects it
            return self._not_started(attempt, adir, str(exc))
        child = standby.child if standby is not None else ChildProcess(
            command, cwd=self.spec.workdir_path, env=env,
            stdout_path=adir / "stdout.log", stderr_path=adir / "stderr.log",
            echo=self.echo, containment=contain(attempt),  # a cgroup, or the subreaper
        )  # fmt: skip
        self._mark_running(attempt, env)
        offset = self.record.events_path.stat().st_size if self.record.events_path.exists() else 0
        oom_before = oom_kill_count()
        # One step axis for the attempt's progress and its watched files (supervisor/axis.py).
        axis = StepAxis(
            attempt, resume_step, lambda kind, fields: self._event(kind, attempt, fields)
        )
        # Before the start: it marks what is in the logs already as old.
        progress = self._progress_reader(attempt, adir, axis, child)
        step_faults = black_box_step_faults(env, attempt) if progress is not None else []
        watcher = self._new_watcher(attempt, resume_step, axis)  # notes old files before the start
        try:
            child.start() if standby is None else child.adopt()  # adopt: its output released
        except OSError as exc:
            if child.containment is not None:
                child.containment.close()
            reason = f"could not start {self.spec.command[0]!r}: {exc.strerror or exc}"
            return self._not_started(attempt, adir, reason)
        watchdog = self._start_watchdog(attempt, child, env, adir)  # first: see there
        self._announce(attempt, child, resume_step, restored, standby)
        if standby is not None:  # its turn: the checkpoint to restore (workload/standby.py)
            self.standby.go(standby, attempt, resume_from)
        watch = AttemptWatch(
            self.record.events_path,
            attempt,
            (adir / "stdout.log", adir / "stderr.log"),
            child.pid,
            offset=offset,
            steps_only=progress is not None,  # progress = step lines, not any output
            # the checkpoint watcher dates a file by the steps read before it: keep some
            keep_recent=RECENT_STEPS if watcher is not None else 0,
        )
        self.telemetry.begin(attempt, child.pid, watch, self.checkpoint_dir)  # sampler thread
        if progress is not None:
            # Its own thread: the poll loop below (stop requests, wall time, the grace
            # period) never waits on what the workload prints (supervisor/progress.py).
            progress.start()
        return _Attempt(
            number=attempt, adir=adir, env=env, child=child, watch=watch,
            resume_step=resume_step, oom_before=oom_before, progress=progress,
            step_faults=step_faults, watchdog=watchdog,
            watcher=self._start_watcher(watcher, child.pid, watch, progress),  # its thread
            side=self._start_side_task(attempt, child, adir),  # a serving run's load, its thread
        )  # fmt: skip

    def _mark_running(self, attempt: int, env: Mapping[str, str]) -> None:
        """run.json: the attempt runs, under this supervisor, with its output's buffering."""
        self.record.update_state(
            status="running",
            attempts=attempt,
            supervisor=user_at_host(),
            supervisor_pid=os.getpid(),
            # How the job's Python output was buffered, and who decided (`show`: output).
            python_unbuffered={"value": env.get(UNBUFFERED), "by": self._unbuffered_by()},
        )

    def _start_watchdog(
        self, attempt: int, child: ChildProcess, env: dict[str, str], adir: Path
    ) -> Watchdog:
        """If this process dies, the watchdog stops the attempt's tree (supervisor/lease.py).

        It starts first, before anything that could take a while: until it runs, a death
        of this process leaves what the attempt started without a guard.
        """
        held = child.containment
        watchdog = Watchdog(
            leader=child.pid, env=env, grace_s=self.spec.limits.grace_period,
            group_term=bool(self.spec.shell), events_path=self.record.events_path, attempt=attempt,
            cgroup=None if held is None else held.cgroup, processes=adir / PROCESSES_FILE,
        )  # fmt: skip
        watchdog.start()
        if held is not None and watchdog.pid is not None:
            held.exclude.add(watchdog.pid)  # a child of the supervisor, not of the attempt
        self._track(attempt, child, force=True)  # the watchdog reads it when it sweeps
        return watchdog

    def _track(self, attempt: int, child: ChildProcess, *, force: bool = False) -> None:
        """List the attempt's processes in ``attempts/<n>/processes.json`` when they change.

        After the supervisor's death its orphans belong to init: the watchdog and
        ``acceptrun resume`` find a process that left the group and cleared its
        environment by this list (pid and start time) or the cgroup it names.
        """
        held = child.containment
        if held is None:
            return
        if held.refresh() or force:
            self.record.write_json(f"attempts/{attempt}/{PROCESSES_FILE}", held.to_record())

    def _not_started(self, attempt: int, adir: Path, reason: str) -> AttemptResult:
        stamp = now_iso()
        res = AttemptResult(attempt, "not_started", None, None, stamp, stamp, 0.0, reason)
        self._record_exit(adir, res)
        return res

    def _announce(
        self,
        attempt: int,
        child: ChildProcess,
        resume_step: int | None,
        restored: str | None,
        standby: Standby | None = None,
    ) -> None:
        self.record.event(
            "attempt_start", sync=True, attempt=attempt, pid=child.pid,
            command=redact_argv(child.argv),  # no --token X in the record
            resume_step=resume_step, restored=restored,
            containment=None if child.containment is None else child.containment.describe(),
            start_mode="cold" if standby is None else "warm",  # standby.py
            **({"cold_why": self.standby.why_cold} if standby is None else
               {"standby_ready_s": standby.ready_s}),
        )  # fmt: skip
        held = child.containment
        if held is not None and held.mechanism == "none":
            # Silence would be the worst outcome: say that escapes are possible, and why.
            warning = (
                "no cgroup and no child subreaper: a process of the attempt that calls "
                f"setsid and clears its environment can outlive it ({held.why})"
            )
            self.record.event("containment_unavailable", sync=True, attempt=attempt, why=warning)
            self.say(f"warning: {warning}")
        resumed = "" if resume_step is None else f", resuming after step {resume_step}"
        resumed += "" if restored is None else f" from {restored}"
        self.say(f"attempt {attempt} started (pid {child.pid}{resumed})")

    def _stop_causes(self, a: _Attempt, deadline: float | None) -> list[StopCause]:
        """The reasons to end this attempt, in the order each poll asks them (supervisor/stops.py)."""
        causes: list[StopCause] = []
        if (side := a.side) is not None:
            causes.append(stops.ServingDone(side.finished, lambda: side.stop_reason))
        causes.append(stops.UserStop(lambda: self._stop_reason))
        if (watch := self.notice) is not None:
            causes.append(stops.Notice(lambda: watch.notice))
        causes.append(stops.Budget(self._over_budget))
        causes.append(stops.WallTime(deadline, self.spec.limits.wall_time))
        if self.telemetry.idle is not None:  # the attempt's, made by telemetry.begin()
            causes.append(stops.Idle(self.telemetry.idle))
        if faults := time_faults(a.env, a.number):
            fire = lambda f: fire_time_fault(self.record, a.number, f, self._signals(a))  # noqa: E731
            causes.append(stops.TimedFaults(faults, fire))
        if self.spec.limits.hang_window is not None:
            causes.append(
                stops.Hang(a.watch, self.spec.limits.hang_window, self.spec.limits.grace_period)
            )
        return causes

    def _supervise(self, a: _Attempt, causes: list[StopCause]) -> int:
        """Poll the attempt until it exits: its progress, then each stop cause; its status."""
        returncode: int | None = None
        tracked = time.monotonic()
        while returncode is None:
            returncode = a.child.wait(POLL_S)
            if time.monotonic() - tracked >= TRACK_S:
                tracked = time.monotonic()
                self._track(a.number, a.child)
            self._poll_black_box(a)
            a.watch.poll()
            self.standby.consider(a.number, a.child, stepped=a.watch.last_step is not None)
            if returncode is not None:
                break
            if a.diverged_kill:
                continue  # killed: wait for the exit only
            now = time.monotonic()
            a.poll.elapsed = a.child.duration
            for cause in causes:
                if a.poll.stop is None or cause.after_stop:
                    stop = cause.check(now, a.poll)
                    if stop is not None and a.poll.stop is None:
                        self._take_stop(a, stop)
            if a.poll.stop is not None and a.stop_sent_at is None:
                self._send_stop(a, now)
            if a.stop_sent_at is not None and (
                self._kill_now or now - a.stop_sent_at >= self.spec.limits.grace_period
            ):
                self._kill_after_grace(a, now)
        return returncode

    def _poll_black_box(self, a: _Attempt) -> None:
        """A black box's logged steps (read on the reader's thread): a diverged loss kills
        it, due step faults fire."""
        if a.progress is None:
            return
        if (div := a.progress.diverged) is not None and not a.diverged_kill:
            a.diverged_kill = self._kill_diverged(a.child, a.number, div)
        if a.step_faults and not a.diverged_kill:
            fired = fire_step_faults(
                self.record, a.number, a.step_faults, a.progress.last_step,
                a.watch.last_checkpoint, self._signals(a),
            )  # fmt: skip
            if fired is not None and a.poll.injected is None:
                a.poll.injected = fired  # the supervisor sent it: exit.json says so

    def _take_stop(self, a: _Attempt, stop: Stop) -> None:
        """The attempt ends for ``stop``: its reason, its event; a hang is killed at once."""
        a.poll.stop = stop
        if stop.reason is not None:
            self._stop_reason = stop.reason
        if stop.event is not None:
            kind, fields = stop.event
            self.record.event(kind, sync=True, **fields)
        if not stop.graceful:
            self._stop_hung(a, stop.cause, stop.evidence or "")
            a.stop_sent_at = float("inf")  # killed: wait for the exit only

    def _send_stop(self, a: _Attempt, now: float) -> None:
        """A graceful stop: SIGTERM ("checkpoint now, then exit"); the grace period starts."""
        a.stop_sent_at = now
        self.record.event(
            "stop_sent", sync=True, attempt=a.number, signal="SIGTERM", reason=self._stop_reason
        )
        grace = format_duration(self.spec.limits.grace_period)
        self.say(f"{self._stop_reason}: asking the workload to stop (grace {grace})")
        self._signal_stop(a.child, signal.SIGTERM)

    def _kill_after_grace(self, a: _Attempt, now: float) -> None:
        """The grace period is over (or a second Ctrl-C came): SIGKILL the attempt's group."""
        assert a.stop_sent_at is not None
        self.record.event(
            "kill_sent",
            sync=True,
            attempt=a.number,
            signal="SIGKILL",
            after_s=round(now - a.stop_sent_at, 3),
            pids=a.child.processes(),
        )
        a.child.signal_group(signal.SIGKILL)  # the rest of the attempt: ChildProcess.finish
        self._kill_now = False
        a.stop_sent_at = float("inf")

    def _conclude(self, a: _Attempt, returncode: int) -> AttemptResult:
        """The attempt exited: settle its threads, classify it, record exit.json."""
        self._settle_exit(a, returncode)
        oom_after = oom_kill_count()
        stop, injected = a.poll.stop, a.poll.injected
        cause = None if stop is None else stop.cause
        kept = a.watch.kept_events()  # no steps but the last (supervisor/watch.py)
        shown = injected or client_fault(kept)  # the workload's own, fired as asked
        res = attempt_result(a.number, a.child, returncode, stop, injected=shown)
        facts = AttemptFacts(
            returncode=returncode if returncode >= 0 else None,
            signal=res.signal,
            stop_cause=None if cause == "serving" else cause,
            stderr_tail=stderr_tail(a.adir / "stderr.log", env=a.env),
            events=kept,
            oom_kills=None
            if a.oom_before is None or oom_after is None
            else oom_after - a.oom_before,
            # NVML Xid events the telemetry sampler saw during the attempt
            xid_errors=[str(e.get("detail")) for e in a.watch.events if e.get("kind") == "xid"],
            injected=injected,
        )
        res.failure = classify(facts)
        if stop is not None and stop.evidence is not None:  # what the watch saw comes first
            res.failure = dataclasses.replace(
                res.failure, evidence=[stop.evidence, *res.failure.evidence]
            )
        if a.side is not None:
            a.side.settle(res, returncode)  # served: success; never ready: not_ready
        res.work = attempt_work(
            self.spec, self.checkpoint_dir, a.watch, a.child, a.resume_step, res, stop,
            unknown_after=None if a.progress is None else a.progress.unknown_after,
        )  # fmt: skip
        if self.spec.outputs:
            from acceptrun.supervisor.outputs import check_declared_outputs

            check_declared_outputs(
                self.record,
                self.spec,
                a.number,
                step=a.watch.last_step,
                since=self.budget.billing_start,
            )
        self._record_exit(a.adir, res)
        return res

    def _settle_exit(self, a: _Attempt, returncode: int) -> None:
        """Stop the attempt's helpers and read what it wrote last."""
        a.watchdog.stop()
        close_rendezvous(a.env)  # an injected rdzv fault's listener, if this attempt had one
        killed = a.child.finish()
        if killed:
            held = a.child.containment
            self.record.event(
                "strays_killed", sync=True, attempt=a.number, signal="SIGKILL", pids=killed,
                containment=None if held is None else held.mechanism,
                reason="still running when the attempt ended (outside its process group)",
            )  # fmt: skip
        if a.side is not None:  # the server is gone: end the load, keep what it measured
            a.side.server_exited()
            a.side.join(self.spec.serving.request_timeout + 30.0)
        self.telemetry.end()
        if a.progress is not None and a.progress.stop():  # a thread that did not end: no read
            a.progress.poll(final=True)  # the lines written just before the exit
        a.watch.poll()
        if a.watcher is not None:
            # The final pass trusts a file written just before the exit only when the
            # workload exited by itself: a process killed mid-save leaves it torn.
            cause = None if a.poll.stop is None else a.poll.stop.cause
            clean = returncode == 0 or (returncode > 0 and cause in STOP_CAUSES)
            why = f"attempt {a.number} ended (status {returncode}) before the file settled"
            a.watcher.stop(final=clean, why_not=why)
            a.watch.poll()  # its checkpoint_commit events, for the lost-work accounting

    def _progress_reader(
        self, attempt: int, adir: Path, axis: StepAxis | None, child: ChildProcess
    ) -> ProgressReader | None:
        """A reader of the attempt's step lines or TensorBoard files; None for a client script."""
        prog = self.spec.progress
        if self.usage.client or (prog.pattern is None and prog.tensorboard is None):
            return None
        reader = ProgressReader(
            self.record, self.spec, attempt, adir / "stdout.log", adir / "stderr.log",
            say=self.say, axis=axis, arrivals=child.arrivals,
        )  # fmt: skip
        return reader if reader.active else None

    def _kill_diverged(self, child: ChildProcess, attempt: int, diverged: dict[str, Any]) -> bool:
        """SIGKILL a black box whose logged loss diverged; asked to stop, it could checkpoint it."""
        self.say(f"attempt {attempt}: {diverged.get('reason')}; killing it (diverged)")
        self.record.event(
            "kill_sent", sync=True, attempt=attempt, signal="SIGKILL", reason="diverged"
        )
        child.signal_group(signal.SIGKILL)
        return True

    def _over_budget(self, attempt: int) -> str | None:
        """The budget's reason to stop now (supervisor/budget.py), kept as the stop's."""
        why = self.budget.exhausted(attempt)
        if why is not None:
            self._stop_reason = why
        return why

    def _signals(self, a: _Attempt) -> Callable[[int], None]:
        """Sends a signal to the attempt as an outside event would (an injected fault)."""
        return lambda sig: self._signal_stop(a.child, sig)

    def _signal_stop(self, child: ChildProcess, sig: int) -> None:
        """SIGTERM (or an injected fault) to the process that owns the graceful stop.

        That is the command's own process (a torchrun agent forwards it to its ranks):
        data-loader workers that got it too would die and crash the training loop before
        it can checkpoint. A string command runs under /bin/sh, which would not pass it
        on, so there the whole group gets it.
        """
        if sig == signal.SIGKILL or self.spec.shell:
            child.signal_group(sig)
        else:
            child.signal_leader(sig)

    def _stop_hung(self, a: _Attempt, kind: str, evidence: str) -> None:
        """A workload that makes no progress: its stacks, then SIGKILL (supervisor/hang.py)."""
        self.record.event(
            "hang_detected", sync=True, attempt=a.number, stall=kind, evidence=evidence
        )
        self.say(
            f"attempt {a.number}: {kind.replace('_', ' ')} ({evidence}); collecting stacks, "
            "then killing it"
        )
        stop_hung(self.record, a.child, a.adir, a.number)

    def _record_exit(self, adir: Any, res: AttemptResult) -> None:
        self.record.write_json(f"attempts/{res.attempt}/exit.json", res.to_dict())
        self.record.event("attempt_exit", sync=True, **res.to_dict())
