"""``acceptrun run``: spec -> record -> preflight -> supervisor -> close.

Data flows one way (docs/architecture.md): the spec is validated and frozen into a new
run record, preflight checks run inside it, the supervisor runs the attempts, and the
close step decides the verdict from the record alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from acceptrun._util.console import get_logger
from acceptrun.capture.preflight import check_static, run_preflight
from acceptrun.capture.reverify import reverifier_for
from acceptrun.checkpoint.owner import LAYOUT_KEY, PER_RUN, check_fresh, create_run_store
from acceptrun.cost.catalog import check_budget, load_catalog, price_for
from acceptrun.errors import UserError
from acceptrun.notify.notifier import start_notifier
from acceptrun.notify.secrets import keep_secrets
from acceptrun.record.lease import start_lease
from acceptrun.record.workspace import (
    RunRecord,
    Workspace,
    find_workspace,
    now_iso,
    user_at_host,
)
from acceptrun.run.close import close_run
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.supervisor import Supervisor, SupervisorResult
from acceptrun.supervisor.sidetask import StartSideTask
from acceptrun.verdict.core import Verdict
from acceptrun.workload.contract import ENV_INJECT
from acceptrun.workload.inject import parse_faults
from acceptrun.workload.usage import detect_usage, raise_errors, spec_findings

__all__ = ["LaunchResult", "launch", "side_task"]

_log = get_logger(__name__)  # the run's progress; the supervisor's lines come through it too


@dataclass(slots=True)
class LaunchResult:
    record: RunRecord
    spec: RunSpec
    verdict: Verdict
    preflight_ok: bool
    supervision: SupervisorResult | None
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        """0 accepted, 1 rejected, 2 stopped by a preflight check, 130 stopped before launch."""
        if self.interrupted:
            return 130
        if not self.preflight_ok:
            return 2
        return 0 if self.verdict.accepted else 1


def side_task(record: RunRecord, spec: RunSpec) -> StartSideTask | None:
    """A serving run's load test beside each attempt (serving/driver.py); None for other runs."""
    if not spec.serving.enabled:
        return None
    from acceptrun.serving.driver import ServingDriver  # a serving run's alone

    return functools.partial(ServingDriver, record, spec)


class _StoppedBeforeLaunch(Exception):
    """A stop signal arrived during preflight (which can hash terabytes of data)."""


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """During preflight, SIGTERM/SIGINT/SIGHUP abort it; the record is then closed as stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: types.FrameType | None) -> None:
        raise _StoppedBeforeLaunch(signal.Signals(signum).name)

    previous = {}
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:  # nohup stays nohup
            previous[s] = signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def launch(
    spec_path: str | Path,
    *,
    workspace: str | Path | None = None,
    echo: bool = True,
    inject: Sequence[str] = (),
    run_id: str | None = None,
    prometheus_port: int | None = None,
    on_record: Callable[[RunRecord], None] | None = None,
    existing: str | None = None,
) -> LaunchResult:
    """Run a spec end to end and return its verdict.

    ``inject`` holds faults to inject (``kill@step=40``, see :mod:`acceptrun.workload.inject`);
    they are recorded in run.json under ``"injected"`` and reach the workload as
    ``$ACCEPTRUN_INJECT``. ``run_id`` names the new record (the local queue picks it
    before the launch); it must not exist yet. Bad input (the spec, a fault, a missing
    command, data path or manifest, a taken run id) raises a
    :class:`~acceptrun.errors.UserError` before any record is created. ``on_record`` is
    called with the new record as soon as it exists (before preflight), so a caller can
    mark it even if the run is then killed. ``existing`` overrides ``checkpoint.existing``
    (what preflight does with watched files already there). Progress is logged to the ``acceptrun``
    logger (the CLI prints it as ``acceptrun: ...``).
    """
    spec = load_spec(spec_path)
    check_static(spec)
    # Keys that cannot take effect (acceptrun.workload.usage): errors refuse, warnings record.
    usage = detect_usage(spec)
    findings = spec_findings(spec, usage)
    raise_errors(spec, findings)
    if prometheus_port is not None and not 0 <= prometheus_port <= 65535:
        raise UserError(
            f"--prometheus-port {prometheus_port} is not a TCP port; use 0 to 65535 (0: a free one)"
        )
    faults, base_env = _faults(inject)
    ws = find_workspace(workspace, create=True, anchor=Path(spec_path).resolve().parent)
    _check_run_id(ws, spec, run_id)
    # Unknown provider/instance, or a budget below one billing increment: bad input.
    price = price_for(spec.cost, load_catalog(ws.root))
    check_budget(price, spec.limits.budget_usd)
    billing_start = time.time()  # the launch: what an on-demand bill counts from
    record = _create_record(ws, spec, spec_path, faults, run_id)
    # Follows events.jsonl from here on and tells the [notify] targets (notify/notifier.py).
    notifier = start_notifier(record, spec)
    told = None if notifier is None else notifier.close
    try:
        _log.info(f"run {record.run_id}")
        _log.info(f"record {record.path}")
        if on_record is not None:
            on_record(record)
        record.event("run_start", sync=True, spec_hash=spec.hash)
        record.audit("run", spec=str(Path(spec_path).resolve()))
        record.event("usage", sync=True, **usage.to_dict())
        for finding in findings:  # warnings only: errors were refused above
            _log.info(str(finding))
            record.event("spec_warning", sync=True, **finding.to_dict())
        refused = _preflight(record, ws, spec, existing, told)
        if refused is not None:
            return refused
        record.update_state(started_at=now_iso())
        result = Supervisor(
            record,
            spec,
            echo=echo,
            say=_log.info,
            base_env=base_env,
            price=price,
            billing_start=billing_start,
            prometheus_port=prometheus_port,  # --prometheus-port; None: the spec's
            side_task=side_task(record, spec),
            reverify=reverifier_for(record, spec, base_env),  # before each restart
        ).run()
        verdict = close_run(record, ws, spec, after_verdict=told)
        return LaunchResult(record, spec, verdict, True, result)
    finally:
        if notifier is not None:
            notifier.close()  # nothing left when the close did it; else what is left, recorded


def _preflight(
    record: RunRecord,
    ws: Workspace,
    spec: RunSpec,
    existing: str | None,
    told: Callable[[], object] | None,
) -> LaunchResult | None:
    """Preflight inside the record; the closed run when it refused or a signal stopped it."""
    try:
        with _stop_signals_raise():
            preflight = run_preflight(record, spec, existing=existing)
    except _StoppedBeforeLaunch as exc:
        _log.info(f"{exc} during preflight: the run was not launched")
        record.event("stopped_before_launch", sync=True, signal=str(exc))
        verdict = close_run(record, ws, spec, status="stopped", after_verdict=told)
        return LaunchResult(record, spec, verdict, False, None, interrupted=True)
    if not preflight.ok:
        record.event("preflight_failed", sync=True, checks=[c.name for c in preflight.failures])
        verdict = close_run(record, ws, spec, status="failed_preflight", after_verdict=told)
        return LaunchResult(record, spec, verdict, False, None)
    return None


def _faults(inject: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The injected faults (acceptrun.workload.inject) and the workload's environment."""
    faults = [str(f) for f in parse_faults(inject)]
    # The faults of this run only: one inherited from an outer run must not leak in.
    base_env = {k: v for k, v in os.environ.items() if k != ENV_INJECT}
    if faults:
        base_env[ENV_INJECT] = ",".join(faults)
    return faults, base_env


def _check_run_id(ws: Workspace, spec: RunSpec, run_id: str | None) -> None:
    """A ``--run-id`` that is a free run id, and whose checkpoint store is not there yet."""
    if run_id is None:
        return
    if (
        # At most 200 characters: a directory name (255 bytes at most) with room for
        # the ".creating-" prefix of its creation.
        not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", run_id)
        or (ws.runs_dir / run_id).exists()
    ):
        raise UserError(
            f"--run-id {run_id[:80]!r} is taken or not a run id (up to 200 letters, digits, "
            "'.', '_', '-'); "
            "leave it out and acceptrun picks a new one"
        )
    if spec.checkpoint.dir and "://" not in spec.checkpoint.dir:
        # The one way a new run's store can exist already: a reused run id. Said before
        # a record is made (create_run_store checks again, for a race).
        check_fresh(Path(spec.resolve_path(spec.checkpoint.dir)) / run_id, run_id)


def _create_record(
    ws: Workspace, spec: RunSpec, spec_path: str | Path, faults: list[str], run_id: str | None
) -> RunRecord:
    """The run's record, its checkpoint store, its lease and its secrets, before preflight."""
    record = ws.create_run(
        spec.name,
        spec_text=spec.to_toml(secrets=False),
        state={
            "mode": "supervised",
            "status": "preflight",
            "spec_source": str(Path(spec_path).resolve()),
            "spec_hash": spec.hash,
            "injected": faults,
            # Known from the start, so `acceptrun stop` works during preflight too.
            "supervisor": user_at_host(),
            "supervisor_pid": os.getpid(),
            # checkpoint.dir holds one store per run: <dir>/<run id>/ (checkpoint/owner.py)
            LAYOUT_KEY: PER_RUN,
        },
        run_id=run_id,
    )
    if "://" not in (spec.checkpoint.dir or ""):
        create_run_store(record, spec)  # its OWNER.json: this run's, empty
    start_lease(record)  # supervisor.json, renewed until the close (record/lease.py)
    keep_secrets(record, spec)  # [notify] URLs: beside the record, never in it (notify/secrets.py)
    return record
