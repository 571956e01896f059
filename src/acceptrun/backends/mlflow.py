"""Export a run record to MLflow: params, per-step metrics, the summary, tags, artifacts.

One acceptrun run becomes one MLflow run (named by the run id; a second export makes a
second MLflow run). What goes across:

- params: the frozen spec, flattened (``limits.max_restarts``), and key provenance
  (``provenance.commit``, ``provenance.gpu``, ``provenance.torch``, ``provenance.cuda``);
- metrics: every numeric value of every step event at its step and time (``loss``,
  ``step_time``, ``data_wait``, ``samples``...), final metrics (``run.metric``), and the
  summary under ``summary/`` (throughput, MFU, step-time percentiles, the breakdown);
- tags: ``acceptrun.run_id``, ``acceptrun.verdict``, ``acceptrun.status``,
  ``acceptrun.record``;
- artifacts: spec.toml, verdict.json, provenance.json, run.json.

Metrics go in batches of MLflow's maximum (1,000 values per call), so 10,000 steps
export in seconds. The default tracking store is ``sqlite:///<workspace>/mlflow.db``
with artifacts in ``<workspace>/mlartifacts/``; a ``sqlite:`` URI keeps its artifacts
beside the database file, never in the current directory.

>>> export_run(Path(".acceptrun/runs/20261130-015953-sumx-0b29"))
'3f9c...'
"""

from __future__ import annotations

import itertools
import math
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import tomli_w

from acceptrun._util.redact import redact_obj, redact_spec, redact_text
from acceptrun.errors import UserError
from acceptrun.record.status import ATTEMPT_STOPPED_ON_PURPOSE, RUN_LIVE
from acceptrun.record.steplog import StepLog
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord, iso_seconds
from acceptrun.spec.model import load_spec

__all__ = ["ARTIFACTS", "default_tracking_uri", "export_run"]

METRICS_PER_BATCH = 1000  # MLflow's limit on metrics per log_batch call
PARAMS_PER_BATCH = 100  # MLflow's limit on params per log_batch call
PARAM_MAX_CHARS = 6000  # MLflow's limit on a param value
ARTIFACTS = ("spec.toml", "verdict.json", "provenance.json", "run.json")
NOT_METRICS = frozenset({"t", "kind", "attempt", "step", "total_steps"})
LIVE_STATES = RUN_LIVE
STOPPED_OUTCOMES = ATTEMPT_STOPPED_ON_PURPOSE  # attempt outcomes that were asked for


def default_tracking_uri(run_dir: Path) -> str:
    """``sqlite:///<workspace>/mlflow.db`` for the workspace holding ``run_dir``."""
    return f"sqlite:///{Path(run_dir).resolve().parent.parent / 'mlflow.db'}"


def _artifact_root(tracking_uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite store; the server decides else."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme != "sqlite":
        return None
    db = Path(unquote(tracking_uri.split(":///", 1)[1])) if ":///" in tracking_uri else None
    if db is None or str(db) in ("", ":memory:"):
        return None
    return (db.parent / "mlartifacts").resolve().as_uri()


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, str(value)[:PARAM_MAX_CHARS]


def _toml_ready(value: Any) -> Any:
    """A dict TOML can hold: no None (TOML has no null), nested dicts and lists kept."""
    if isinstance(value, dict):
        return {k: _toml_ready(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_toml_ready(v) for v in value if v is not None]
    return value


def _key(name: str) -> str:
    """A valid MLflow key: letters, digits, ``_ - . / `` and space; others become ``_``.

    Path segments that would resolve elsewhere (``..``, ``.``, empty: ``../x``, ``/x``,
    ``a//b``) become ``_`` too: MLflow refuses them, and a metric name from a script
    must not fail the export.
    """
    key = re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)
    return "/".join("_" if part in ("", ".", "..") else part for part in key.split("/"))


def _provenance_params(prov: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    git, torch, gpus = prov.get("git") or {}, prov.get("torch") or {}, prov.get("gpus") or {}
    python = prov.get("python") or {}
    if isinstance(git, dict) and git.get("commit"):
        out["provenance.commit"] = str(git["commit"])
        out["provenance.dirty"] = str(git.get("dirty"))
    if isinstance(torch, dict) and torch.get("version"):
        out["provenance.torch"] = str(torch["version"])
        out["provenance.cuda"] = str(torch.get("cuda"))
    if isinstance(gpus, dict) and isinstance(gpus.get("devices"), list) and gpus["devices"]:
        names = [str(d.get("name")) for d in gpus["devices"] if isinstance(d, dict)]
        out["provenance.gpu"] = f"{len(names)} x {names[0]}" if names else "none"
        out["provenance.driver"] = str(gpus.get("driver"))
    elif isinstance(gpus, dict):
        out["provenance.gpu"] = "none"
    if isinstance(python, dict) and python.get("version"):
        out["provenance.python"] = str(python["version"])
    return out


def _ms(t: Any) -> int:
    return int(float(t) * 1000)


def _count_step_values(log: StepLog) -> tuple[int, int]:
    """How many step values the export sends, and the step the run ended at (one pass)."""
    points, last_step = 0, 0
    for c in log.chunks():
        if not len(c):
            continue
        points += sum(int(c.present[n].sum()) for n in c.values if n not in NOT_METRICS)
        last_step = int(c.step[-1])
    return points, last_step


def _step_metrics(log: StepLog, metric: Any) -> Iterator[Any]:
    """Every logged value of every step, at its step and time, chunk by chunk."""
    for c in log.chunks():
        if not len(c):
            continue
        ts = (c.t * 1000).astype(np.int64)  # as _ms: int(t * 1000) truncates toward zero
        for name, col in c.values.items():
            if name in NOT_METRICS:
                continue
            key = _key(name)
            idx = np.flatnonzero(c.present[name])
            rows = zip(col[idx].tolist(), ts[idx].tolist(), c.step[idx].tolist(), strict=True)
            for v, t, step in rows:
                yield metric(key, float(v), t, step)


def _final_metric_points(events: list[dict[str, Any]], log: StepLog) -> list[Any]:
    """``run.metric`` values; one without a step is put at the last step logged before it."""
    from mlflow.entities import Metric

    found = [
        ev for ev in events
        if isinstance(ev.get("value"), int | float) and not isinstance(ev.get("value"), bool)
    ]  # fmt: skip
    steps_at = [int(ev["step"]) if isinstance(ev.get("step"), int) else None for ev in found]
    loose = [i for i, s in enumerate(steps_at) if s is None]
    if loose:
        ts = np.array([float(found[i]["t"]) for i in loose])
        before = np.zeros(len(loose), dtype=np.int64)  # no step yet: step 0
        for c in log.chunks():
            if not len(c):
                continue
            order = np.argsort(c.t, kind="stable")
            pos = np.searchsorted(c.t[order], ts, side="right") - 1
            hit = pos >= 0
            before[hit] = c.step[order][pos[hit]]  # chunks come in write order
        for i, s in zip(loose, before.tolist(), strict=True):
            steps_at[i] = s
    return [
        Metric(_key(str(ev.get("name"))), float(ev["value"]), _ms(ev["t"]), int(step or 0))
        for ev, step in zip(found, steps_at, strict=True)
    ]


def _iso_ms(iso: Any) -> int | None:
    seconds = iso_seconds(iso)
    return None if seconds is None else int(seconds * 1000)


def _summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for unit, value in (summary.get("throughput") or {}).items():
        out[f"summary/throughput_{unit.replace('/', '_per_')}"] = value
    for name in ("mfu", "wall_s", "first_step_s", "data_wait_share", "idle_share"):
        if summary.get(name) is not None:
            out[f"summary/{name}"] = summary[name]
    for part, seconds in (summary.get("breakdown") or {}).items():
        out[f"summary/breakdown_{part}_s"] = seconds
    for name, value in (summary.get("step_time") or {}).items():
        if name != "n":
            out[f"summary/step_time_{name}_s"] = value
    if summary.get("drift"):
        out["summary/step_time_drift"] = summary["drift"]["change"]
    return {k: float(v) for k, v in out.items() if isinstance(v, int | float)}


class _Progress:
    """A Rich bar on a terminal, a line per 10% otherwise (stderr); nothing when off."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.total, self.done, self._next = total, 0, 0.1
        self._bar: Any = None
        self.enabled = enabled and total > 0
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            from acceptrun._util.console import styled

            # The bar draws on the terminal (styled: not escaped); its text is ours.
            self._bar = Progress(transient=True, console=Console(file=styled(sys.stderr)))
            self._bar.start()
            self._task = self._bar.add_task("exporting metrics", total=total)

    def advance(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        elif self.done / self.total >= self._next or self.done == self.total:
            print(f"exported {self.done}/{self.total} metric values", file=sys.stderr, flush=True)
            self._next = math.floor(self.done / self.total * 10 + 1) / 10

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def export_run(
    run_dir: Path,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    *,
    progress: bool = False,
) -> str:
    """Export one run record to MLflow and return the MLflow run id.

    ``tracking_uri`` defaults to :func:`default_tracking_uri`; ``experiment`` to the
    run's name. ``progress=True`` reports the metric upload on stderr.
    """
    from mlflow.entities import RunStatus

    record = RunRecord(run_dir)
    state = record.state  # RecordError when this is not a run record
    uri = tracking_uri or default_tracking_uri(record.path)
    client, exp_id = _experiment(uri, experiment or str(state.get("name") or "acceptrun"))
    verdict = state.get("verdict")
    status = str(state.get("status") or "unknown")
    tags = {
        "acceptrun.run_id": record.run_id,
        "acceptrun.verdict": str(verdict) if verdict is not None else "undecided",
        "acceptrun.status": status,
        "acceptrun.record": str(record.path.resolve()),
    }
    tags = redact_obj(tags)  # the record's path may hold a URL with credentials, too
    run = client.create_run(
        exp_id, start_time=_iso_ms(state.get("created_at")), tags=tags, run_name=record.run_id
    )
    run_id = run.info.run_id
    spec = _log_params(client, run_id, record)
    view = RecordView(record)  # events.jsonl, read once
    last_outcome = view.last_outcome()
    _log_metrics(client, run_id, record, view, progress)
    _log_artifacts(client, run_id, record, spec)

    if status not in LIVE_STATES:
        outcome = "FINISHED" if verdict == "accepted" else "FAILED"
        if status == "stopped" or last_outcome in STOPPED_OUTCOMES:
            outcome = "KILLED"  # stopped on request or at a limit, not a failure of its own
        client.set_terminated(
            run_id, RunStatus.to_string(RunStatus.from_string(outcome)),
            end_time=_iso_ms(state.get("ended_at")),
        )  # fmt: skip
    return str(run_id)


def _experiment(uri: str, name: str) -> tuple[Any, str]:
    """The MLflow client on ``uri`` and the id of experiment ``name`` (created if new)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(name)
        exp_id = (
            found.experiment_id
            if found is not None
            else client.create_experiment(name, artifact_location=_artifact_root(uri))
        )
    except MlflowException as exc:
        raise UserError(
            f"MLflow tracking URI {uri!r} cannot be used ({exc.message.splitlines()[0]}); "
            f"give a database such as --tracking-uri sqlite:///{Path.cwd() / 'mlflow.db'} "
            "or a tracking server URL"
        ) from exc
    return client, exp_id


def _log_params(client: Any, run_id: str, record: RunRecord) -> dict[str, Any]:
    """Log the frozen spec, flattened and redacted, and key provenance as params; return
    that redacted spec (the spec.toml artifact is written from it)."""
    from mlflow.entities import Param

    spec: dict[str, Any] = {}
    if record.spec_path.exists():
        spec = load_spec(record.spec_path).to_dict()  # a damaged spec: a SpecError naming it
    # Nothing secret leaves the machine: the command's --token X, secret env values, URL
    # credentials (acceptrun._util.redact); the spec.toml artifact is the same redacted dict.
    spec = redact_spec(spec)
    params = dict(_flatten(spec))
    prov = record.read_json("provenance.json")
    if isinstance(prov, dict):
        params.update(_provenance_params(prov))
    items = [Param(_key(k), v) for k, v in params.items()]
    for i in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + PARAMS_PER_BATCH])
    return spec


def _log_metrics(
    client: Any, run_id: str, record: RunRecord, view: RecordView, progress: bool
) -> None:
    """Log every step value, the final metrics and the summary, in batches; then the
    summary's hints as a tag."""
    from mlflow.entities import Metric, RunTag

    from acceptrun.telemetry.summary import summarize

    log = view.step_log
    # Steps are streamed from the step log a chunk at a time, 1,000 values to a call:
    # a long run's export holds one batch, never a Metric per value of every step.
    points, last_step = _count_step_values(log)
    finals = _final_metric_points(view.events("metric"), log)
    now = int(time.time() * 1000)
    summary = summarize(record.path).to_dict()
    tail = [Metric(k, v, now, last_step) for k, v in _summary_metrics(summary).items()]
    bar = _Progress(progress, points + len(finals) + len(tail))
    batch: list[Any] = []
    try:
        for metric in itertools.chain(_step_metrics(log, Metric), finals, tail):
            batch.append(metric)
            if len(batch) == METRICS_PER_BATCH:
                client.log_batch(run_id, metrics=batch)
                bar.advance(len(batch))
                batch = []
        if batch:
            client.log_batch(run_id, metrics=batch)
            bar.advance(len(batch))
    finally:
        bar.close()
    if summary.get("hints"):
        client.log_batch(
            run_id, tags=[RunTag("acceptrun.hints", redact_text("\n".join(summary["hints"])))]
        )


def _log_artifacts(client: Any, run_id: str, record: RunRecord, spec: dict[str, Any]) -> None:
    """Log the record's :data:`ARTIFACTS`; spec.toml as the redacted ``spec``."""
    with tempfile.TemporaryDirectory(prefix="acceptrun-mlflow-") as tmp:
        for name in ARTIFACTS:
            if not record.exists(name):
                continue
            path = record.file(name)
            if name == "spec.toml" and spec:
                path = Path(tmp) / name
                path.write_text(tomli_w.dumps(_toml_ready(spec)), encoding="utf-8")
            client.log_artifact(run_id, str(path))
