"""Closing a run: clean-up steps, the verdict, the final state, the index.

Called once the last attempt has ended (supervised runs) or when a standalone script
exits. Everything here reads the record and writes whole files, so closing again (for
example after a crash of the supervisor) gives the same result.

Close decides once and writes what it decided, which every view of the closed run then
reads (docs/architecture.md, "What a run writes at close"): ledger.json (built once),
portability.json (the checkout as it was), summary.json (computed once, and judged by
the verdict), verdict.json, the final run.json with its liveness at close, report.html
and the run's row in the index.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from acceptrun._util.console import get_logger
from acceptrun._util.paths import check_removable, lexical_problem
from acceptrun.checkpoint.memtier import remove_memory_dir
from acceptrun.record.lease import end_lease
from acceptrun.record.models import stamp
from acceptrun.record.view import read_attempts, run_timeline, work_lost
from acceptrun.record.workspace import RunRecord, Workspace, now_iso
from acceptrun.spec.model import RunSpec
from acceptrun.verdict.core import Verdict
from acceptrun.verdict.decide import compute_verdict

if TYPE_CHECKING:
    from acceptrun.telemetry.summary import PendingSummary

__all__ = ["close_run", "close_standalone", "run_cleanup"]

CLEANUP_TIMEOUT_S = 600.0
# The event an optional part of closing leaves when it fails (the verdict writes it too).
BEST_EFFORT_FAILED = "best_effort_failed"

log = get_logger(__name__)
T = TypeVar("T")


def run_cleanup(record: RunRecord, spec: RunSpec) -> list[dict[str, Any]]:
    """Run ``[cleanup]``: shell commands in the workdir, then removals.

    Failures are recorded (``cleanup`` events with ``ok: false``) and logged as warnings.
    """
    results: list[dict[str, Any]] = []
    for command in spec.cleanup.commands:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", command], cwd=spec.workdir_path, capture_output=True,
                text=True, timeout=CLEANUP_TIMEOUT_S, check=False,
            )  # fmt: skip
            ok, detail = proc.returncode == 0, (proc.stderr or proc.stdout).strip()[-500:]
        except subprocess.TimeoutExpired:
            ok, detail = False, f"timed out after {CLEANUP_TIMEOUT_S:.0f} s"
        results.append(
            {
                "command": command,
                "ok": ok,
                "seconds": round(time.perf_counter() - t0, 3),
                "detail": detail,
            }
        )
    for pattern in spec.cleanup.remove:
        results.append(_remove(record, spec, pattern))
    for r in results:
        record.event("cleanup", sync=True, **r)
        if not r["ok"]:
            log.warning(
                "cleanup: %s failed: %s", r.get("command") or r.get("remove"), r.get("detail")
            )
    return results


def _protected(record: RunRecord, spec: RunSpec) -> list[Path]:
    """What a ``[cleanup] remove`` never touches: the workspace, stores, mirror, data."""
    kept = [record.path.parent.parent, record.path, record.checkpoints_dir]
    for value in (
        spec.checkpoint.dir, spec.checkpoint.mirror, spec.data.path, spec.data.manifest,
        spec.inference.input, spec.inference.output if spec.inference.enabled else None,
    ):  # fmt: skip
        if value and "://" not in value:
            kept.append(Path(spec.resolve_path(value)))
    return kept


def _remove(record: RunRecord, spec: RunSpec, pattern: str) -> dict[str, Any]:
    """One ``[cleanup] remove`` entry: its matches removed, or why one was refused.

    Every match passes :func:`check_removable` first (inside the workdir, never the
    workspace, a record, a store or the data; a symlink goes as a link). A refused match
    makes the entry ``ok: false`` with the reason, so the verdict's cleanup line fails
    instead of reporting a removal that did not happen or should not have.
    """
    base = spec.workdir_path
    why = lexical_problem(pattern)  # the spec refuses these; a record written before did not
    if why is not None:
        return {"remove": pattern, "ok": False, "removed": [], "detail": f"refused: {why}"}
    protected = _protected(record, spec)
    removed: list[str] = []
    refused: list[str] = []
    for m in sorted(glob.glob(str(base / pattern))):
        path = Path(m)
        reason = check_removable(path, workdir=base, protected=protected)
        if reason is not None:
            refused.append(reason)
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            refused.append(f"{m}: {exc}")
            continue
        removed.append(m)
    out: dict[str, Any] = {"remove": pattern, "ok": not refused, "removed": removed}
    if refused:
        out["refused"] = refused
        out["detail"] = "; ".join(refused)
    return out


def close_run(
    record: RunRecord,
    workspace: Workspace,
    spec: RunSpec | None = None,
    *,
    status: str = "finished",
    after_verdict: Callable[[], object] | None = None,
) -> Verdict:
    """Clean up, decide, and write verdict.json and the final run.json.

    ``after_verdict`` runs once the verdict is recorded and before the report is written
    (the run's notifier: its last deliveries, verdict included, reach the report).
    """
    spec = spec or record.spec
    record.update_state(status="closing")
    if status == "finished":
        run_cleanup(record, spec)
    remove_memory_dir(record.path, record.run_id)  # the memory tier's host memory, freed
    verdict = _finalize(record, workspace, spec, status, after_verdict)
    end_lease(record)  # closed: its supervisor lets go of the run (record/lease.py)
    return verdict


def close_standalone(record: RunRecord, *, status: str) -> Verdict:
    """Close a run started by a plain ``python train.py`` (called at its exit)."""
    workspace = Workspace(record.path.parent.parent)
    return _finalize(record, workspace, record.spec, "finished")


def _best_effort(record: RunRecord, component: str, action: Callable[[], T]) -> T | None:
    """Run an optional part of closing (ledger, batch summary, report); never lose the close.

    Returns what the part returned, or None when it failed: a ``best_effort_failed``
    event (component, error, traceback) and a one-line warning; the verdict reads "not
    recorded" where it needed that part, and ``acceptrun report RUN`` or ``acceptrun
    cost`` can build it again later.
    """
    try:
        return action()
    except Exception as exc:  # recorded and logged below, never swallowed
        error = f"{type(exc).__name__}: {exc}"
        try:
            record.event(BEST_EFFORT_FAILED, sync=True, component=component, error=error,
                         traceback=traceback.format_exc())  # fmt: skip
            where = f"the traceback is in {record.path / 'events.jsonl'}"
        except OSError as write_exc:  # a read-only or full record: say that as well
            where = f"recording it in events.jsonl failed too ({write_exc})"
        first = error.splitlines()[0] if error.strip() else type(exc).__name__
        log.warning("run %s: %s failed at close: %s; %s", record.run_id, component, first, where)
        return None


def _ledger(record: RunRecord) -> None:
    """Write ledger.json; the verdict's cost lines say "not recorded" when it fails."""
    from acceptrun.cost.ledger import build_ledger

    _best_effort(record, "ledger", lambda: build_ledger(record))


def _closed_ledger(record: RunRecord, accepted: bool) -> None:
    """ledger.json as built for the verdict, with the run's final status and verdict.

    Not built again: its figures end at the last attempt's exit (or the refusal before
    launch), never at the verdict (cost/ledger.py). Its inputs are stamped anew, since
    close wrote run.json and events.jsonl after the build, so readers take it as current.
    """

    def write() -> None:
        from acceptrun.cost.ledger import LEDGER_FILE, ledger_inputs

        ledger = record.read_json(LEDGER_FILE)
        if isinstance(ledger, dict):  # else the build failed: recorded, `acceptrun cost` retries
            status = record.state.get("status")
            closed = {"status": status, "accepted": accepted, "inputs": ledger_inputs(record)}
            record.write_json(LEDGER_FILE, {**ledger, **closed})

    _best_effort(record, "ledger", write)


def _portability(record: RunRecord) -> None:
    """Write portability.json (git against the checkout as it is now, once): the verdict's
    exit check and every view read it; when it fails the exit check says why."""

    def write() -> None:
        from acceptrun.verdict.portability import write_portability

        write_portability(record)

    _best_effort(record, "portability", write)


def _liveness_at_close(record: RunRecord) -> dict[str, Any]:
    """Who kept the run as it closed: what record/liveness answers for a closed run."""
    return {
        "state": "ended",
        "keeper": "standalone" if record.state.get("mode") == "standalone" else "supervisor",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "last_sign_of_life": round(time.time(), 3),
    }


def _finalize(
    record: RunRecord,
    workspace: Workspace,
    spec: RunSpec,
    status: str,
    after_verdict: Callable[[], object] | None = None,
) -> Verdict:
    _ledger(record)  # the verdict's cost lines read it
    _batch_manifest(record, spec)  # a batch inference run's coverage and cost per item
    _portability(record)  # the verdict's exit check reads it
    pending = _summary(record)  # computed once: the verdict judges it, the views read it
    verdict = compute_verdict(record, spec, summary=pending.summary if pending else None)
    record.write_json("verdict.json", {**stamp(), **verdict.to_dict()})
    tl = run_timeline(record)
    duration = None
    if tl["launch"] is not None and tl["end"] is not None:
        duration = round(tl["end"] - tl["launch"], 3)
    record.update_state(
        status=status,
        work=work_lost(read_attempts(record)),
        verdict="accepted" if verdict.accepted else "rejected",
        ended_at=now_iso(),
        duration_s=duration,
        steps=tl["steps"],
        liveness=_liveness_at_close(record),
    )
    record.event("verdict", sync=True, verdict="accepted" if verdict.accepted else "rejected")
    if after_verdict is not None:
        _best_effort(record, "notify", after_verdict)
    _closed_ledger(record, verdict.accepted)  # the last of close's own events is written
    if pending is not None:  # after the last of close's own events: show and report read it
        _best_effort(record, "summary", pending.write)
    _report(record)
    workspace.index_run(record)
    return verdict


def _batch_manifest(record: RunRecord, spec: RunSpec) -> None:
    """inference.json for a batch run; when it fails the coverage check reads the shards."""
    if not spec.inference.enabled:
        return

    def write() -> None:
        from acceptrun.inference.summary import write_batch_manifest

        write_batch_manifest(record, spec)

    _best_effort(record, "inference_summary", write)


def _summary(record: RunRecord) -> PendingSummary | None:
    """The telemetry summary for the verdict and summary.json, computed once; when it
    fails the verdict computes it (and says why it cannot), and readers compute it."""

    def compute() -> PendingSummary:
        from acceptrun.telemetry.summary import pending_summary

        return pending_summary(record.path)

    return _best_effort(record, "summary", compute)


def _report(record: RunRecord) -> None:
    """Write report.html; when it fails `acceptrun report RUN` tries again later."""

    def write() -> None:
        from acceptrun.report.html import write_report

        write_report(record)

    _best_effort(record, "report", write)
