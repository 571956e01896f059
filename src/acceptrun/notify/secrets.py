"""The secret fields of a run's spec (a webhook URL), kept apart from its record.

A run record is evidence that people share, so its frozen spec.toml leaves out the fields
declared ``secret=True`` (:data:`acceptrun.spec.model.SECRET_FIELDS`). Their values are
kept in the workspace, outside every run directory, in ``secrets/<run_id>.json``: mode
0600 in a 0700 directory, the only file acceptrun writes them to (the way the Kubernetes
export writes ``[env]`` secrets apart). The notifier of the run, of a resume, and
``acceptrun watch`` read them back through :func:`notify_spec_of`; ``acceptrun bundle``
learns them (:func:`kept_secret_values`), so a value the workload printed is redacted
in the archive too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from acceptrun._util.durable import loads_json, read_bytes_bounded, write_atomic
from acceptrun._util.redact import learn
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import NotifySpec, RunSpec

__all__ = ["keep_secrets", "kept_secret_values", "notify_spec_of", "secrets_path"]


def secrets_path(record: RunRecord) -> Path:
    """``<workspace>/secrets/<run_id>.json``: beside the runs, in none of them."""
    return record.path.parent.parent / "secrets" / f"{record.run_id}.json"


def keep_secrets(record: RunRecord, spec: RunSpec) -> None:
    """Write the spec's secret values for ``record`` (nothing when it sets none)."""
    values = spec.secret_values()
    if not values:
        return
    path = secrets_path(record)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.parent.chmod(0o700)
    write_atomic(path, json.dumps(values, sort_keys=True) + "\n", mode=0o600, raw=True)


def _kept(record: RunRecord) -> dict[str, str]:
    try:
        data = loads_json(read_bytes_bounded(secrets_path(record)))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str)}


def kept_secret_values(record: RunRecord) -> list[str]:
    """The values of ``record``'s secret spec fields, kept apart from it (none: [])."""
    return [v for v in _kept(record).values() if v]


def notify_spec_of(record: RunRecord, spec: RunSpec) -> NotifySpec:
    """``spec.notify`` with the secret values kept for ``record`` put back where unset."""
    notify = spec.notify
    changes: dict[str, Any] = {}
    for dotted, value in _kept(record).items():
        section, _, name = dotted.partition(".")
        if section == "notify" and hasattr(notify, name) and not getattr(notify, name):
            changes[name] = value
    learn(changes.values())  # hidden wherever they could recur, in this process too
    return dataclasses.replace(notify, **changes) if changes else notify
