"""Put a spec in the local queue: the checks ``acceptrun run`` makes first, then a row.

A job that would fail those checks (a spec that does not validate, a command not on
PATH, missing data or manifest, an unknown price or a budget below one billing
increment) is refused now with a :class:`~acceptrun.errors.UserError`, not hours later
on a worker. The job keeps a frozen copy of the resolved spec: editing the file after
``acceptrun submit`` does not change what the job runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from acceptrun.queue.db import Job, QueueDB
from acceptrun.record.workspace import Workspace
from acceptrun.spec.model import RunSpec, load_spec

__all__ = ["check_submittable", "job_size", "queue_db", "queue_dir", "submit_spec"]


def queue_dir(workspace: Workspace) -> Path:
    """``<workspace>/queue/``: the database, the frozen specs and the jobs' logs."""
    return workspace.root / "queue"


def queue_db(workspace: Workspace) -> QueueDB:
    """The workspace's queue database (created on first use)."""
    return QueueDB(queue_dir(workspace) / "queue.sqlite")


def job_size(spec: Any) -> tuple[str, int]:
    """``("gpu", resources.gpus)``; a CPU job: ``("cpu", slots)``, one slot per process
    (``resources.processes``) or per core (``resources.cpus``), whichever is more."""
    res = spec.resources
    if res.gpus > 0:
        return "gpu", int(res.gpus)
    return "cpu", max(int(res.processes), int(res.cpus or 1))


def check_submittable(spec_path: str | Path, workspace: Workspace) -> RunSpec:
    """Load ``spec_path`` and make the checks a launch makes before creating a record."""
    from acceptrun.capture.preflight import check_static
    from acceptrun.cost.catalog import check_budget, load_catalog, price_for

    spec = load_spec(spec_path)
    check_static(spec)
    check_budget(price_for(spec.cost, load_catalog(workspace.root)), spec.limits.budget_usd)
    return spec


def submit_spec(
    spec_path: str | Path, workspace: Workspace, *, priority: int = 0, db: QueueDB | None = None
) -> Job:
    """Check and queue a spec; returns the new job.

    >>> submit_spec("bert.toml", find_workspace(create=True), priority=5).id
    12
    """
    spec = check_submittable(spec_path, workspace)
    kind, slots = job_size(spec)
    rng = spec.limits.expected_runtime
    own = db is None
    db = db or queue_db(workspace)
    try:
        job_id = db.submit(
            name=spec.name, spec_path=str(Path(spec_path).resolve()), spec_text=spec.to_toml(),
            spec_hash=spec.hash, priority=priority, kind=kind, slots=slots,
            expected_s=float(rng[1]) if rng else None,
        )  # fmt: skip
        job = db.job(job_id)
    finally:
        if own:
            db.close()
    assert job is not None
    return job
