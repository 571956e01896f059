"""Workspace-wide checkpoint garbage collection: ``acceptrun gc``.

Dry run by default: :func:`plan_gc` looks at every run and says which checkpoints would
go and how many bytes (and USD per month of storage) that frees; nothing on disk changes.
:func:`apply_plan` then deletes exactly what a plan lists, recording one
``checkpoint_delete`` event (reason ``"gc"``) per checkpoint in the run's events.jsonl.

What goes, per run:

- the spec's retention (``checkpoint.keep_last``, ``keep_every``, ``keep_best``): what
  :meth:`CheckpointStore.apply_retention` would delete, computed without deleting;
- with ``older_than``, runs that ended before then lose every checkpoint, except the
  newest one that verifies of an ACCEPTED run (the accepted artifact's lineage); runs
  not accepted keep what retention keeps only with ``keep_rejected``;
- with ``include_quarantine``, quarantined checkpoints too (otherwise kept: evidence).

Never touched: outputs, logs, events, run.json, a run whose supervisor is alive (or may
be, on another host), and the newest checkpoint that verifies of an ACCEPTED run.

>>> plans = plan_gc(workspace, GcOptions(older_than=parse_age("30d")))
>>> print(format_gc(plans, applied=False))
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from acceptrun._util.console import format_table
from acceptrun._util.durable import fsync_dir, write_atomic
from acceptrun.checkpoint.owner import StoreOwnedError, open_run_store
from acceptrun.checkpoint.store import LATEST, QUARANTINE, CheckpointStore
from acceptrun.cost.billing import format_bytes, format_usd, monthly_storage_cost
from acceptrun.cost.catalog import load_catalog, price_for
from acceptrun.errors import AcceptrunError, UserError
from acceptrun.record.status import RUN_LIVE
from acceptrun.record.workspace import RunRecord, Workspace, iso_seconds
from acceptrun.spec.model import RunSpec, load_spec, parse_duration
from acceptrun.spec.problem import Problem

__all__ = [
    "GcOptions",
    "RunPlan",
    "apply_plan",
    "format_gc",
    "parse_age",
    "plan_gc",
]

# Statuses in which a supervisor may still be writing checkpoints.
ACTIVE = RUN_LIVE


@dataclass(frozen=True, kw_only=True)
class GcOptions:
    """What ``acceptrun gc`` may delete."""

    older_than: float | None = None
    """Seconds: runs that ended longer ago lose their checkpoints (None: retention only)."""
    keep_rejected: bool = False
    """Old runs that were not ACCEPTED keep what retention keeps instead of losing all."""
    include_quarantine: bool = False
    """Also delete quarantined checkpoints (by default they are kept as evidence)."""
    now: float | None = None
    """Unix seconds that ``older_than`` counts back from (None: the current time)."""


@dataclass(frozen=True, slots=True)
class Doomed:
    """One directory a plan deletes: a committed checkpoint or a quarantined one."""

    path: Path
    step: int | None
    nbytes: int  # every file in the directory, manifest included (lstat sizes)
    quarantined: bool


@dataclass(slots=True)
class RunPlan:
    """What gc does to one run; ``freed`` and ``errors`` are filled by :func:`apply_plan`."""

    run_id: str
    status: str
    verdict: str | None
    total: int = 0  # committed checkpoints, plus quarantined ones when they are candidates
    kept: int = 0
    rule: str = ""  # why the committed checkpoints go, for the events
    root: Path | None = None  # the checkpoint store's root
    delete: list[Doomed] = field(default_factory=list)
    skipped: str = ""  # why the run was left alone ("" when it was not)
    note: str = ""
    price_per_gib_month: float | None = None  # USD; None or 0 when not known
    freed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes this plan would free."""
        return sum(d.nbytes for d in self.delete)


def parse_age(text: str) -> float:
    """``"30d"`` -> seconds; a bad value raises :class:`UserError` naming it."""
    try:
        return parse_duration(text, "--older-than")
    except Problem as exc:
        raise UserError(f"{exc}; for example --older-than 30d") from None


# ---- planning -------------------------------------------------------------------------------


def plan_gc(workspace: Workspace, options: GcOptions) -> list[RunPlan]:
    """One plan per run, oldest first; reads the records and changes nothing on disk.

    Costs a re-hash of the newest checkpoint of each ACCEPTED run that would lose one
    (to find the newest that verifies); everything else reads manifests and sizes only.
    """
    now = time.time() if options.now is None else options.now
    price_of = _pricer(workspace)
    roots: dict[Path, str] = {}  # checkpoint root -> the run that claimed it first
    plans = []
    for run_id in workspace.run_ids():
        record = RunRecord(workspace.runs_dir / run_id)
        plans.append(_plan_run(record, options, now, roots, price_of))
    return plans


def _plan_run(
    record: RunRecord,
    options: GcOptions,
    now: float,
    roots: dict[Path, str],
    price_of: Callable[[RunSpec], float | None],
) -> RunPlan:
    try:
        state = record.state
    except (AcceptrunError, ValueError) as exc:
        return RunPlan(record.run_id, "?", None, skipped=f"run.json does not load ({exc})")
    status = str(state.get("status", "unknown"))
    verdict = state.get("verdict")
    plan = RunPlan(record.run_id, status, verdict if isinstance(verdict, str) else None)
    if status in ACTIVE and (busy := _supervisor_busy(state)):
        plan.skipped = busy
        return plan
    try:
        spec = load_spec(record.spec_path)
    except AcceptrunError as exc:
        plan.skipped = f"spec.toml does not load ({str(exc).splitlines()[0]})"
        return plan
    if spec.checkpoint.dir and "://" in spec.checkpoint.dir:
        plan.skipped = f"checkpoint.dir {spec.checkpoint.dir} is remote; gc handles local ones"
        return plan
    try:  # the run's own store; one another run owns is never pruned for this one
        store = open_run_store(record, spec)
    except StoreOwnedError as exc:
        plan.skipped = str(exc)
        return plan
    root = store.root.resolve()
    if root in roots:
        plan.skipped = f"its checkpoint dir {root} belongs to run {roots[root]}"
        return plan
    roots[root] = record.run_id
    plan.root = store.root
    try:
        plan.price_per_gib_month = price_of(spec)
    except AcceptrunError as exc:  # a bad [cost] section costs the column, not the gc
        plan.note = f"no storage price ({exc})"

    infos = store.list()
    keep = store.retained_steps(infos)  # the store's own rule, nothing deleted
    plan.rule = "retention"
    accepted = plan.verdict == "accepted"
    if _ended_before(state, status, options, now):
        plan.rule = f"ended more than {options.older_than:.0f} s ago"
        if accepted:
            good = store.latest_verified(quarantine=False)
            if good is not None:
                keep = {good.step}
            else:
                plan.rule = "retention"
                plan.note = "no checkpoint verifies; only retention applied"
        elif options.keep_rejected:
            plan.rule = "retention"
        else:
            keep = set()
    elif accepted and any(i.step not in keep for i in infos):
        # Never the only good checkpoint of an accepted run, whatever retention says.
        good = store.latest_verified(quarantine=False)
        if good is not None:
            keep.add(good.step)
    plan.delete = [
        Doomed(i.path, i.step, _dir_bytes(i.path), False) for i in infos if i.step not in keep
    ]
    plan.total, plan.kept = len(infos), len(infos) - len(plan.delete)
    qdir = store.root / QUARANTINE
    if options.include_quarantine and qdir.is_dir():
        quarantined = sorted(p for p in qdir.iterdir() if p.is_dir() and not p.is_symlink())
        plan.delete += [Doomed(p, _step_prefix(p.name), _dir_bytes(p), True) for p in quarantined]
        plan.total += len(quarantined)
    return plan


def _supervisor_busy(state: dict[str, Any]) -> str:
    """Why an active run must be left alone, or "" when its supervisor is gone.

    Any live process with the recorded pid counts (a reused pid costs a skipped run, a
    wrong "gone" would delete under a running job); a supervisor on another host cannot
    be checked from here, so it counts as alive.
    """
    raw = state.get("supervisor_pid")
    pid = raw if type(raw) is int and raw > 0 else None
    host = str(state.get("supervisor") or "").rpartition("@")[2]
    if host and host != socket.gethostname():
        return f"running on {host}; its supervisor cannot be checked from here"
    if pid is None:
        return ""
    try:
        alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    except psutil.AccessDenied:
        alive = True
    return f"running (supervisor pid {pid} is alive)" if alive else ""


def _ended_before(state: dict[str, Any], status: str, options: GcOptions, now: float) -> bool:
    if options.older_than is None or status in ACTIVE:
        return False
    ended = iso_seconds(state.get("ended_at"))
    if ended is None:
        return False  # no end time recorded: never old enough
    return ended < now - options.older_than


def _latest_name(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _step_prefix(name: str) -> int | None:
    """``step-120`` or a quarantined ``step-120-20261129T...`` -> 120."""
    head, _, rest = name.partition("-")
    number = rest.split("-", 1)[0]
    return int(number) if head == "step" and number.isdigit() else None


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


# ---- applying -------------------------------------------------------------------------------


def apply_plan(record: RunRecord, plan: RunPlan) -> None:
    """Delete what ``plan`` lists, one ``checkpoint_delete`` event (reason "gc") each.

    Each directory is renamed to ``.deleting-...`` in the store root first (what the
    store's retention does), so a kill mid-delete never leaves a ``step-<N>`` whose
    manifest survives its files, and the store's stale-leftover sweep finishes the job.
    A failed delete is recorded with its error and skipped.
    """
    deleted: set[str] = set()
    for doomed in plan.delete:
        root = doomed.path.parent.parent if doomed.quarantined else doomed.path.parent
        tag = f"step-{doomed.step}" if doomed.step is not None else "q"
        tomb = root / f".deleting-{tag}-{os.getpid()}-{secrets.token_hex(4)}"
        fields: dict[str, Any] = {
            "step": doomed.step, "path": str(doomed.path), "reason": "gc",
            "rule": "quarantined" if doomed.quarantined else plan.rule, "bytes": doomed.nbytes,
        }  # fmt: skip
        try:
            os.rename(doomed.path, tomb)
            fsync_dir(root)
            shutil.rmtree(tomb)
        except OSError as exc:
            fields["error"] = str(exc)
            plan.errors.append(f"{doomed.path}: {exc}")
        else:
            plan.freed += doomed.nbytes
            if not doomed.quarantined:
                deleted.add(doomed.path.name)
        record.event("checkpoint_delete", sync=True, **fields)
    if deleted and plan.root is not None:
        _repoint_latest(plan.root, deleted)


def _repoint_latest(root: Path, deleted: set[str]) -> None:
    """Point LATEST at the newest checkpoint left when gc deleted its target, or remove it."""
    if _latest_name(root) not in deleted:
        return
    left = CheckpointStore(root).list()
    if left:
        write_atomic(root / LATEST, f"{left[-1].path.name}\n")
    else:
        (root / LATEST).unlink(missing_ok=True)
        fsync_dir(root)


# ---- cost and the table ---------------------------------------------------------------------


def _pricer(workspace: Workspace) -> Callable[[RunSpec], float | None]:
    """A run's storage price in USD per GiB-month from the price catalog; None when unknown."""
    catalog = load_catalog(workspace.root)

    def price_of(spec: RunSpec) -> float | None:
        price = price_for(spec.cost, catalog)
        return price.storage_per_gib_month if price and price.storage_per_gib_month else None

    return price_of


def _monthly_usd(nbytes: int, price_per_gib_month: float | None) -> float | None:
    if not price_per_gib_month:
        return None
    return monthly_storage_cost(nbytes, price_per_gib_month)


def format_gc(plans: Iterable[RunPlan], *, applied: bool) -> str:
    """The table: one row per run that changes (or was skipped), then the total."""
    plans = list(plans)
    changing = [p for p in plans if p.delete or p.skipped]
    head = "acceptrun gc: freed" if applied else "acceptrun gc (dry run): would free"
    rows: list[tuple[str, ...]] = []
    total_bytes, total_usd, priced = 0, 0.0, False
    for p in changing:
        state = f"{p.status}/{p.verdict or '-'}"
        if p.skipped:
            rows.append((p.run_id, state, "-", "skipped", "-"))
            continue
        nbytes = p.freed if applied else p.nbytes
        usd = _monthly_usd(nbytes, p.price_per_gib_month)
        total_bytes += nbytes
        if usd is not None:
            total_usd, priced = total_usd + usd, True
        cost = format_usd(usd) if usd is not None else "-"
        rows.append((p.run_id, state, f"{p.kept}/{p.total}", format_bytes(nbytes), cost))
    cost = format_usd(total_usd) if priced else "-"
    rows.append(("TOTAL", "", "", format_bytes(total_bytes), cost))
    headers = ("RUN", "STATUS/VERDICT", "CHECKPOINTS", "BYTES FREED", "USD/MONTH SAVED")
    numbers = {"CHECKPOINTS", "BYTES FREED", "USD/MONTH SAVED"}
    lines = [
        f"{head} {format_bytes(total_bytes)} in {len(plans)} runs checked",
        format_table(headers, rows, right=numbers),
    ]
    for p in plans:
        if p.skipped:
            lines.append(f"skipped {p.run_id}: {p.skipped}")
        if p.note:
            lines.append(f"note {p.run_id}: {p.note}")
        lines.extend(f"could not delete {e}" for e in p.errors)
    if not applied and total_bytes:
        lines.append("nothing was deleted; run `acceptrun gc --apply` with the same options")
    return "\n".join(lines)
