"""Lifecycle actions on an existing run: stop, kill, resume, logs, and their audit trail.

``acceptrun stop|kill RUN`` signals only a process it can show is the run's supervisor:
the pid from run.json must still exist, be an ``acceptrun`` command, and be older than
run.json's last write (a pid reused after the supervisor died is younger). The request
goes to ``control.json`` and into events.jsonl as an ``audit`` event *before* SIGTERM
reaches the supervisor, whose handler reads control.json to tell a stop (SIGTERM to the
workload, checkpoint, grace period, SIGKILL) from a kill (SIGKILL at once, no restart).

``acceptrun resume RUN`` continues the same record with attempt N+1 from the newest
checkpoint that verifies in the run's own store (checkpoint/owner.py), fetched from a
mirror first when there is none locally (a record copied to another machine): the newest
mirrored step that verifies, each one passed over recorded as a ``mirror_quarantine``
event; ``--step N`` fetches step N instead. It closes the run again with a new verdict.

``acceptrun logs RUN [-f]`` prints the attempts' logs; following them switches to each
new attempt and ends once the run is closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from acceptrun._util.confined import open_regular
from acceptrun._util.console import get_logger
from acceptrun._util.durable import write_json_atomic
from acceptrun._util.keyblock import KeyBlocks, split_lines
from acceptrun.capture.preflight import check_static
from acceptrun.capture.reverify import reverifier_for
from acceptrun.checkpoint.mirror_remote import fetch, remote_steps
from acceptrun.checkpoint.owner import mirror_root, open_run_store, owner_of
from acceptrun.errors import AcceptrunError, RecordError, UnsafeFileError, UserError
from acceptrun.notify.notifier import start_notifier
from acceptrun.record.lease import start_lease
from acceptrun.record.liveness import supervisor_state
from acceptrun.record.status import RUN_CLOSED, RUN_SUPERVISED
from acceptrun.record.workspace import RunRecord, Workspace, now_iso, user_at_host
from acceptrun.run.close import close_run
from acceptrun.run.launch import side_task
from acceptrun.spec.model import RunSpec, format_duration, load_spec
from acceptrun.supervisor import Supervisor
from acceptrun.supervisor.lease import take_over
from acceptrun.verdict.core import Check, Verdict
from acceptrun.workload.contract import ENV_INJECT

__all__ = [
    "ResumeResult",
    "SupervisorState",
    "inspect_supervisor",
    "load_verdict",
    "request_stop",
    "resume_run",
    "show_logs",
    "stop_promise",
    "wait_closed",
]

_log = get_logger(__name__)  # resume's progress and what `logs` has to say besides the logs

ACTIVE = RUN_SUPERVISED  # a supervisor may be working on the run
ENDED = RUN_CLOSED  # close_run has written the verdict
PID_AGE_SLACK_S = 2.0  # psutil's create_time rests on the boot time, known to the second
POLL_S = 0.25  # seconds between looks at run.json and the logs while waiting or following
_CHUNK = 1 << 20  # bytes read from a log at a time: logs can be gigabytes
_MAX_LINE = 1 << 16  # bytes of a line without a newline (a progress bar) kept back at most


# ---- the supervisor of a run ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SupervisorState:
    """What run.json says about a run's supervisor, checked against this machine."""

    pid: int | None
    who: str  # user@host from run.json ("" when not recorded yet)
    host: str
    local: bool  # recorded on this host, or no host recorded
    alive: bool  # pid is this run's acceptrun supervisor, still running
    detail: str  # when not alive: why, for messages


def inspect_supervisor(record: RunRecord, state: dict[str, Any]) -> SupervisorState:
    """Whether the run's recorded supervisor is alive here; never signals anything."""
    who = str(state.get("supervisor") or "")
    host = who.rpartition("@")[2]
    local = not host or host == socket.gethostname()
    raw = state.get("supervisor_pid")
    pid = raw if type(raw) is int and raw > 0 else None
    if pid is None or not local:
        return SupervisorState(pid, who, host, local, False, "its supervisor pid is not known")
    alive, detail = _is_supervisor(pid, record.file("run.json"))
    return SupervisorState(pid, who, host, local, alive, detail)


def _is_supervisor(pid: int, run_json: Path) -> tuple[bool, str]:
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            zombie = proc.status() == psutil.STATUS_ZOMBIE
            cmdline = [] if zombie else proc.cmdline()
            created = proc.create_time()
    except psutil.NoSuchProcess:
        return False, f"its supervisor (pid {pid}) is gone"
    except psutil.AccessDenied:
        return False, f"pid {pid} belongs to another user: run this command as that user"
    if zombie:
        return False, f"its supervisor (pid {pid}) has exited"
    # `acceptrun ...`, `python /venv/bin/acceptrun ...` or `python -m acceptrun ...`.
    if not any(Path(arg).name == "acceptrun" for arg in cmdline):
        shown = " ".join(cmdline)[:80]
        return False, f"pid {pid} is now another program ({shown}), not acceptrun"
    try:
        written = run_json.stat().st_mtime
    except OSError:
        written = time.time()
    if created > written + PID_AGE_SLACK_S:
        return False, f"pid {pid} is a newer acceptrun process, not this run's supervisor"
    return True, ""


def _orphaned(record: RunRecord, state: dict[str, Any]) -> bool:
    """An active run whose supervisor here is gone: a wait for its end would never end.

    Lenient on purpose (only a missing or zombie pid counts): a wrong "alive" costs a
    Ctrl-C, a wrong "gone" would end a wait early.
    """
    pid = state.get("supervisor_pid")
    if state.get("status") not in ACTIVE or type(pid) is not int:
        return False
    if not inspect_supervisor(record, state).local:
        return False
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def _describe(state: dict[str, Any]) -> str:
    status = str(state.get("status"))
    if status == "finished":
        ended = f" at {state['ended_at']}" if state.get("ended_at") else ""
        return f"it finished{ended}, {str(state.get('verdict') or 'no verdict').upper()}"
    return {
        "failed_preflight": "it failed preflight and never launched",
        "stopped": "it was stopped before launch",
        "closing": "its last attempt has ended and its verdict is being written",
        "created": "it was created but never started",
    }.get(status, f"its status is {status!r}")


# ---- stop and kill --------------------------------------------------------------------------


def request_stop(record: RunRecord, action: str, *, reason: str | None = None) -> int:
    """Ask the run's supervisor to ``"stop"`` or ``"kill"`` the workload; returns its pid.

    Raises :class:`UserError` when the run is not running on this machine. The audit
    event and control.json are written before the supervisor is signalled.

    >>> request_stop(ws.get_run("latest"), "stop", reason="wrong learning rate")
    """
    if action not in ("stop", "kill"):
        raise ValueError(f"action must be 'stop' or 'kill', got {action!r}")
    run_id, state = record.run_id, record.state
    status = str(state.get("status"))
    if status not in ACTIVE:
        raise UserError(f"run {run_id} is not running: {_describe(state)}; nothing to {action}")
    sup = inspect_supervisor(record, state)
    if not sup.local:
        raise UserError(
            f"run {run_id} is supervised on host {sup.host} ({sup.who}), not on this one "
            f"({socket.gethostname()}); run `acceptrun {action} {run_id}` on {sup.host}"
        )
    if sup.pid is None:
        raise UserError(
            f"run {run_id} is in {status} and has not recorded its supervisor's pid yet; "
            "try again in a few seconds, or press Ctrl-C where `acceptrun run` runs"
        )
    if not sup.alive:
        raise UserError(
            f"run {run_id} is not running: run.json says {status!r}, but {sup.detail}; "
            f"nothing was signalled. To continue the run: `acceptrun resume {run_id}`"
        )
    record.audit(action, reason=reason, supervisor_pid=sup.pid)
    control = {"action": action, "by": user_at_host(), "at": now_iso(), "reason": reason}
    write_json_atomic(record.file("control.json"), control)
    try:
        os.kill(sup.pid, signal.SIGTERM)  # the supervisor's handler reads control.json
    except ProcessLookupError:
        raise UserError(
            f"the supervisor of run {run_id} (pid {sup.pid}) exited just now; "
            f"see `acceptrun show {run_id}`"
        ) from None
    return sup.pid


def stop_promise(record: RunRecord, action: str) -> str:
    """What a stop or kill of this run will do, said plainly (a black box gets no checkpoint).

    Only a script that uses the client API checkpoints at its next step boundary on
    SIGTERM; an unmodified script does whatever it does with SIGTERM, and only files in
    ``checkpoint.watch`` are captured.
    """
    if action == "kill":
        return "the workload is SIGKILLed now: no checkpoint, no restart"
    try:
        spec = load_spec(record.spec_path)
        grace = format_duration(spec.limits.grace_period)
        watched = bool(spec.checkpoint.watch)
    except AcceptrunError:
        grace, watched = "the grace period", False
    usage = next(iter(record.events("usage")), None)
    kind = None if usage is None else usage.get("usage")
    if kind in (None, "client"):
        return (
            "the workload checkpoints at its next step boundary and exits "
            f"(SIGKILL after the grace period, {grace})"
        )
    if watched:
        return (
            f"SIGTERM to the workload ({kind}: acceptrun cannot make it checkpoint; a "
            "checkpoint it writes into checkpoint.watch before it exits is captured), "
            f"then SIGKILL after the grace period ({grace})"
        )
    return (
        f"SIGTERM to the workload ({kind}: no checkpoint is taken, the work since its last own "
        f"save is lost unless it handles SIGTERM itself), then SIGKILL after the grace period ({grace})"
    )


def wait_closed(
    record: RunRecord, timeout_s: float, *, poll_s: float = POLL_S
) -> dict[str, Any] | None:
    """run.json once the run is closed (or its supervisor died unclosed); None on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = record.state
        if state.get("status") in ENDED:
            return state
        if _orphaned(record, state):
            return record.state  # re-read: it may have closed as it exited
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def load_verdict(record: RunRecord) -> Verdict | None:
    """The verdict in verdict.json, as the object ``format_verdict`` prints."""
    data = record.read_json("verdict.json")
    if not isinstance(data, dict):
        return None
    try:
        checks = [Check(**c) for c in data["checks"]]
        return Verdict(str(data["run_id"]), checks, str(data["decided_at"]))
    except (KeyError, TypeError) as exc:
        raise RecordError(f"{record.file('verdict.json')} is damaged: {exc}") from exc


# ---- resume ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ResumeResult:
    record: RunRecord
    spec: RunSpec
    verdict: Verdict
    from_step: int | None

    @property
    def exit_code(self) -> int:
        """0 accepted, 1 rejected, as for ``acceptrun run``."""
        return 0 if self.verdict.accepted else 1


def resume_run(
    record: RunRecord,
    *,
    mirror: str | None = None,
    from_mirror: bool = False,
    force: bool = False,
    from_scratch: bool = False,
    reason: str | None = None,
    echo: bool = True,
    step: int | None = None,
) -> ResumeResult:
    """Run attempt N+1 of a run from its newest verified checkpoint, then close it again.

    ``mirror`` is a mirror root (``s3://bucket/ckpt/<run_id>``, or its parent); with
    ``from_mirror`` the root comes from the frozen spec's ``checkpoint.mirror``. Either is
    used only when no local checkpoint verifies, and then gives its newest step that
    verifies. ``step`` fetches that mirrored step and resumes from it, local ones or not;
    one that is not in the mirror (or does not verify) raises before anything is written.
    Bad input raises :class:`UserError`.
    """
    spec = load_spec(record.spec_path)
    url = _resume_mirror(record, spec, mirror, from_mirror, step)
    with _resume_lock(record), contextlib.ExitStack() as stack:
        _check_resumable(record, force=force)
        # This resume's conditions only: what came before was told by the run before it
        # (or, for its supervisor's death, by `acceptrun watch`).
        notifier = start_notifier(record, spec, from_end=True)
        told = None if notifier is None else notifier.close
        if notifier is not None:
            stack.callback(notifier.close)  # once the close has run it: nothing left to do
        check_static(spec)  # this machine must have the workdir, the command and the data
        interrupted, first, never_launched = _take_over_run(record, spec)
        # A resume is not a fault drill: faults in this shell's environment stay out, as
        # they do for `acceptrun run`.
        env = {k: v for k, v in os.environ.items() if k != ENV_INJECT}
        supervisor = Supervisor(
            record, spec, echo=echo, say=_log.info, base_env=env, first_attempt=first,
            side_task=side_task(record, spec),
            reverify=reverifier_for(record, spec, env),  # the data and packages preflight saw
        )  # fmt: skip
        ckpt_dir = supervisor.checkpoint_dir
        from_step = _resume_point(record, spec, ckpt_dir, url, step, first, from_scratch)
        # A batch inference run resumes from its committed shards, not from a checkpoint.
        if from_step is None and not (from_scratch or spec.inference.enabled or never_launched):
            raise UserError(
                f"run {record.run_id} has no checkpoint that verifies in {ckpt_dir}: resuming "
                "would start it again from step 0. Pass --from-scratch to do that, or fetch one "
                "with --mirror URL (or --from-mirror for the spec's checkpoint.mirror)"
            )
        record.audit(
            "resume", reason=reason, attempt=first, from_step=from_step, mirror=url,
            record_path=str(record.path), interrupted=interrupted,
        )  # fmt: skip
        _log.info(f"resuming run {record.run_id}: attempt {first}, from step {from_step}")
        # Claim the run before the supervisor's first (slow) verification: `acceptrun stop`
        # can reach it from now on, and `ls` shows it running; close_run writes the verdict.
        record.update_state(
            status="running", verdict=None, ended_at=None, resumed_at=now_iso(),
            supervisor=user_at_host(), supervisor_pid=os.getpid(),
        )  # fmt: skip
        start_lease(record)  # this process supervises it now; close_run ends the lease
        if never_launched and not _preflight_again(record, spec):
            verdict = close_run(record, Workspace(record.path.parent.parent), spec,
                                status="failed_preflight", after_verdict=told)  # fmt: skip
            return ResumeResult(record, spec, verdict, from_step)
        supervisor.run()
        verdict = close_run(record, Workspace(record.path.parent.parent), spec, after_verdict=told)
        return ResumeResult(record, spec, verdict, from_step)


def _take_over_run(record: RunRecord, spec: RunSpec) -> tuple[dict[str, Any] | None, int, bool]:
    """Take the run over from a dead supervisor; (what it interrupted, the next attempt's
    number, whether the run died in preflight before any work).
    """
    # A dead supervisor's run: its attempt's leftovers given the grace period, then
    # killed; its exit.json written.
    interrupted = take_over(  # supervisor/lease.py
        record,
        grace_s=spec.limits.grace_period,
        devices=max(spec.resources.gpus, 1) * max(spec.resources.nodes, 1),
        nodes=max(spec.resources.nodes, 1),
    )
    _cut_torn_steps(record)
    state = record.state
    done = [int(p.name) for p in (record.path / "attempts").glob("*") if p.name.isdigit()]
    first = max([int(state.get("attempts") or 0), *done]) + 1
    # died in preflight: no work yet (a standalone script has no attempt folders, and ran)
    never_launched = interrupted is not None and not done and state.get("mode") != "standalone"
    return interrupted, first, never_launched


def _resume_mirror(
    record: RunRecord, spec: RunSpec, mirror: str | None, from_mirror: bool, step: int | None
) -> str | None:
    """The mirror a resume may fetch from; with ``step``, the run's root, holding that step."""
    url = _mirror_url(record, spec, mirror, from_mirror)
    if step is not None:
        if url is None:
            raise UserError(
                f"--step {step} picks a mirrored step: add --from-mirror (the spec's "
                "checkpoint.mirror) or --mirror URL"
            )
        url = _run_root(record, url)
        _require_step(url, step)  # before the lock, the take-over or any verification
    return url


def _resume_point(
    record: RunRecord,
    spec: RunSpec,
    ckpt_dir: Path,
    url: str | None,
    step: int | None,
    first: int,
    from_scratch: bool,
) -> int | None:
    """The step attempt ``first`` resumes from: the newest local one that verifies, else
    one fetched from the mirror ``url`` (``step``, or its newest); None when there is none.
    """

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        record.event(kind, sync=True, attempt=first, **fields)  # quarantines

    # The run's own store: one another run owns raises StoreOwnedError, naming it.
    store = open_run_store(record, spec, retention=False, on_event=on_event, claim=True)
    # Verifying here costs one extra read of the newest checkpoint (the supervisor
    # checks it again); without it, corrupt checkpoints would silently mean a restart
    # from step 0.
    local = None if step is not None else store.latest_verified()
    if step is not None and url is not None:
        _log.info(f"fetching step {step} from {url}")
        return _fetch(record, url, ckpt_dir, step=step, attempt=first)
    if local is None and url is not None:
        _log.info(f"no local checkpoint verifies in {ckpt_dir}; fetching the newest from {url}")
        return _fetch_newest(record, url, ckpt_dir, attempt=first, scratch=from_scratch)
    if local is not None and url is not None:
        _log.info(f"step {local.step} verifies locally; the mirror is not needed")
    return None if local is None else local.step


def _cut_torn_steps(record: RunRecord) -> None:
    """Cut the partial last record a killed attempt left in its step log, and say so.

    Readers count whole records only, so nothing but the torn step is lost either way;
    the cut leaves each segment a whole number of records, and the ``log_repaired``
    event keeps the evidence of how many bytes went (record/steplog.py).
    """
    from acceptrun.record.steplog import repair_torn

    for path, torn in repair_torn(record.path):
        record.event("log_repaired", sync=True, torn_bytes=torn, path=str(path))
        _log.info(f"cut a torn step record of {torn} bytes from {path}")


def _preflight_again(record: RunRecord, spec: RunSpec) -> bool:
    """A run whose supervisor died in preflight runs its preflight again before launch."""
    from acceptrun.capture.preflight import run_preflight

    preflight = run_preflight(record, spec)
    if not preflight.ok:
        record.event("preflight_failed", sync=True, checks=[c.name for c in preflight.failures])
    record.update_state(started_at=now_iso())
    return bool(preflight.ok)


@contextlib.contextmanager
def _resume_lock(record: RunRecord) -> Iterator[None]:
    """One resume of a record at a time (two would both start attempt N+1). An flock,
    which the kernel drops when its holder dies: a crashed resume leaves no stale lock."""
    with open(record.file(".resume.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"run {record.run_id} is being resumed by another process right now; "
                f"follow it with `acceptrun logs -f {record.run_id}`"
            ) from None
        yield


def _check_resumable(record: RunRecord, *, force: bool) -> None:
    run_id, state = record.run_id, record.state
    status = str(state.get("status"))
    if status in (*ACTIVE, "closing"):
        keeper = supervisor_state(record, state)
        if keeper.gone and keeper.keeper == "standalone":
            return  # a plain `python train.py` that died without closing its record
        sup = inspect_supervisor(record, state)
        if sup.alive:
            raise UserError(
                f"run {run_id} is running (supervisor pid {sup.pid}); stop it first with "
                f"`acceptrun stop {run_id}`, or follow it with `acceptrun logs -f {run_id}`"
            )
        if not sup.local and not force:
            raise UserError(
                f"run.json says run {run_id} is {status} under a supervisor on host "
                f"{sup.host} ({sup.who}). If that machine is gone and this record was copied "
                f"from it, pass --force; otherwise stop it there with `acceptrun stop {run_id}`"
            )
        if sup.pid is None and not force:
            raise UserError(
                f"run {run_id} is in {status} and its supervisor's pid is not recorded; if "
                "its `acceptrun run` has exited, pass --force"
            )
    elif status == "failed_preflight":
        raise UserError(
            f"run {run_id} failed preflight and never launched: nothing to resume; fix what "
            f"`acceptrun show {run_id}` reports and start a new run with `acceptrun run SPEC`"
        )
    elif status == "finished" and state.get("verdict") == "accepted" and not force:
        raise UserError(
            f"run {run_id} finished ACCEPTED: nothing to resume; pass --force to run "
            "another attempt anyway"
        )


def _mirror_url(
    record: RunRecord, spec: RunSpec, mirror: str | None, from_mirror: bool
) -> str | None:
    if mirror:
        return mirror
    if not from_mirror:
        return None
    root = mirror_root(record, spec)  # the root the client mirrors this run to
    if root is None:
        raise UserError(
            f"the spec of run {record.run_id} has no checkpoint.mirror; "
            "name the mirror with --mirror URL"
        )
    return root


def _run_root(record: RunRecord, url: str) -> str:
    """``url`` itself, or ``url/<run id>`` when only that holds steps (a spec-level mirror,
    which holds one root per run id)."""
    try:
        if remote_steps(url):
            return url
        nested = f"{url.rstrip('/')}/{record.run_id}"
        return nested if remote_steps(nested) else url
    except Exception as exc:  # each fsspec backend raises its own errors (OSError, botocore)
        raise UserError(f"cannot list the checkpoints in the mirror at {url}: {exc}") from exc


def _require_step(url: str, step: int) -> None:
    """Raise UserError, writing nothing, when ``step`` is not committed in the mirror."""
    try:
        steps = remote_steps(url)
    except Exception as exc:
        raise UserError(f"cannot list the checkpoints in the mirror at {url}: {exc}") from exc
    if step not in steps:
        raise UserError(
            f"--step {step}: step {step} is not in the mirror at {url}; its committed steps: "
            f"{', '.join(map(str, steps)) or 'none'}. Nothing was fetched or written"
        )


def _fetch_newest(
    record: RunRecord, url: str, dest: Path, *, attempt: int, scratch: bool
) -> int | None:
    """The newest mirrored step that verifies, fetched; None (from step 0) when none does and
    ``scratch`` allows it (a SkyPilot or Kubernetes restart passes --from-scratch)."""
    try:
        return _fetch(record, url, dest, attempt=attempt)
    except RecordError as exc:
        if not scratch:
            raise
        _log.info(f"{exc}; --from-scratch: starting again from step 0")
        return None


def _fetch(
    record: RunRecord, url: str, dest: Path, *, attempt: int, step: int | None = None
) -> int:
    """Fetch a step of the run's mirror into ``dest`` (its newest that verifies, or ``step``).

    Each mirrored step that does not verify is recorded as a ``mirror_quarantine`` event
    (which step, why) and passed over; ``mirror_fetch`` names the one fetched.
    """
    url = _run_root(record, url)

    def rejected(bad: int, why: str) -> None:
        _log.info(f"mirrored step {bad} does not verify, passed over: {why}")
        record.event("mirror_quarantine", sync=True, attempt=attempt, step=bad, url=url, reason=why)

    try:
        path = fetch(url, dest, step=step, owner=owner_of(record), on_reject=rejected)
    except (UserError, RecordError):
        raise
    except Exception as exc:  # each fsspec backend raises its own errors (OSError, botocore)
        raise UserError(f"cannot fetch a checkpoint from the mirror at {url}: {exc}") from exc
    fetched = int(path.name.removeprefix("step-"))
    record.event("mirror_fetch", sync=True, attempt=attempt, url=url, step=fetched, path=str(path))
    return fetched


# ---- logs -----------------------------------------------------------------------------------


class _Tail:
    """The not yet printed part of one log file, as whole lines."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path = path
        self.root = root  # the record: no link below it is followed
        self.offset = 0
        self.partial = b""
        self.refused = False

    def lines(self, *, whole: bool) -> Iterator[bytes]:
        """New lines; with ``whole`` (the file is complete) also an unterminated last one.

        A log that is a link, a FIFO or a device is said once and never read.
        """
        try:
            f = open_regular(self.path, root=self.root)
        except FileNotFoundError:
            return
        except UnsafeFileError as exc:
            if not self.refused:
                self.refused = True
                _log.warning(str(exc))
            return
        with f:
            f.seek(self.offset)
            while chunk := f.read(_CHUNK):
                self.offset += len(chunk)
                *done, self.partial = (self.partial + chunk).split(b"\n")
                yield from done
                if len(self.partial) > _MAX_LINE:
                    yield self.partial
                    self.partial = b""
        if whole and self.partial:
            yield self.partial
            self.partial = b""


def _attempt_numbers(record: RunRecord) -> list[int]:
    root = record.path / "attempts"
    return sorted(int(p.name) for p in root.glob("*") if p.name.isdigit()) if root.is_dir() else []


def show_logs(
    record: RunRecord,
    *,
    attempt: int | None = None,
    stderr_only: bool = False,
    follow: bool = False,
    out: IO[str] | None = None,
    poll_s: float = POLL_S,
    raw: bool = False,
) -> None:
    """Print the attempts' stdout and stderr; with ``follow``, until the run is closed.

    Lines carry ``[attempt N]`` when several attempts are shown (always when following,
    since a restart can add one). An attempt's stdout comes before its stderr: the two
    files do not record how their lines interleaved. The CLI's stream redacts the lines
    and escapes their control characters; ``raw`` writes the bytes as the workload
    wrote them to the binary stream under ``out`` (``acceptrun logs --raw``).
    """
    out = out or sys.stdout
    sink: IO[str] | _RawLines = out
    if raw:
        from acceptrun._util.console import raw_binary

        sink = _RawLines(raw_binary(out))
    streams = ("stderr",) if stderr_only else ("stdout", "stderr")
    if attempt is not None and not follow and attempt not in _attempt_numbers(record):
        have = ", ".join(map(str, _attempt_numbers(record))) or "none yet"
        raise UserError(f"run {record.run_id} has no attempt {attempt}; its attempts: {have}")
    tails: dict[tuple[int, str], _Tail] = {}
    # A key block of a prefixed log: its lines are held and redacted here, per log, before
    # the prefix (the CLI's stream knows a body line only without one).
    blocks: dict[tuple[int, str], KeyBlocks] = {}
    while True:
        # run.json first: once it says closed, the logs read after it are complete.
        state = record.state
        closed = state.get("status") in ENDED
        orphaned = _orphaned(record, state)
        numbers = [n for n in _attempt_numbers(record) if attempt in (None, n)]
        prefixed = attempt is None and (follow or len(numbers) > 1)
        for n in numbers:
            # exit.json is written after the output pipes are drained: the log is whole.
            whole = closed or not follow or record.attempt_dir(n).joinpath("exit.json").exists()
            for stream in streams:
                tail = tails.setdefault(
                    (n, stream), _Tail(record.attempt_dir(n) / f"{stream}.log", record.path)
                )
                held = blocks.setdefault((n, stream), KeyBlocks())
                for line in tail.lines(whole=whole):
                    _emit(sink, n, line, prefixed, held)
        sink.flush()
        if not follow or closed or orphaned:
            break
        time.sleep(poll_s)
    for (n, _stream), held in blocks.items():  # a block the log ended inside
        _prefixed(sink, n, held.close())
    sink.flush()
    if not numbers:
        _log.info(f"run {record.run_id} has no attempt yet ({_describe(state)})")
    if follow and orphaned:
        _log.info(
            f"the supervisor of run {record.run_id} is gone without closing it; "
            f"continue it with `acceptrun resume {record.run_id}`"
        )


class _RawLines:
    """The lines of ``show_logs(raw=True)``: bytes as read, to a binary stream."""

    def __init__(self, binary: IO[bytes]) -> None:
        self.binary = binary

    def line(self, attempt: int, line: bytes, prefixed: bool) -> None:
        self.binary.write(f"[attempt {attempt}] ".encode() * prefixed + line + b"\n")

    def flush(self) -> None:
        self.binary.flush()


def _emit(
    out: IO[str] | _RawLines, attempt: int, line: bytes, prefixed: bool, blocks: KeyBlocks
) -> None:
    if isinstance(out, _RawLines):
        out.line(attempt, line, prefixed)
        return
    text = line.decode("utf-8", errors="replace")
    if prefixed:
        _prefixed(out, attempt, blocks.line(text + "\n"))
    else:
        out.write(f"{text}\n")  # the CLI's stream holds a key block itself


def _prefixed(out: IO[str] | _RawLines, attempt: int, text: str) -> None:
    """Each line of ``text`` (already redacted) after ``[attempt N]``."""
    if isinstance(out, _RawLines):
        return  # raw: nothing is held
    for line in split_lines(text):
        out.write(f"[attempt {attempt}] {line}")
