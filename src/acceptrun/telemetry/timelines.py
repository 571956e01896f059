"""A run's chart series: steps (downsampled past ``CHART_POINTS``), samples and marks.

:func:`timelines` reads the record (telemetry/inputs.py); the stored summary
(telemetry/summary.py :func:`~acceptrun.telemetry.summary.pending_summary`) keeps what
:func:`chart_series` returns beside the figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from acceptrun._util.units import finite_number as num
from acceptrun.record.steplog import StepChunk, StepLog
from acceptrun.telemetry.inputs import RunFiles, json_step_count, read_run
from acceptrun.telemetry.steps import col

__all__ = ["CHART_POINTS", "chart_series", "timelines"]

CHART_POINTS = 2000  # per chart series at most: min and max of 1000 buckets of steps


def timelines(run_dir: Path) -> dict[str, Any]:
    """Series for charts: steps, host and GPU samples, and marks (restarts, checkpoints...).

    Each step carries ``throughput`` in the spec's ``acceptance.throughput_unit`` when
    the step logged that quantity, else in steps/s. A run of more than ``CHART_POINTS``
    steps is downsampled (see :func:`_step_series`) and says so in ``steps_downsampled``.
    """
    return chart_series(read_run(Path(run_dir)))


def chart_series(rec: RunFiles) -> dict[str, Any]:
    unit = rec.spec.acceptance.throughput_unit
    key = {"samples/s": "samples", "tokens/s": "tokens"}.get(unit)
    marks: list[dict[str, Any]] = []
    for ev in rec.events:
        kind = ev.get("kind")
        if kind in ("restart", "attempt_start", "attempt_exit", "idle"):
            marks.append({"t": ev["t"], "kind": kind, "label": _mark_label(ev)})
        elif kind == "checkpoint_commit":
            marks.append({"t": ev["t"], "kind": "checkpoint", "label": f"step {ev.get('step')}"})
    n = rec.log.count() + json_step_count(rec.events)
    steps, bucket = _step_series(rec.log, key, n)
    out: dict[str, Any] = {
        "steps": steps,
        "host": [s for s in rec.samples if s.get("kind") == "host"],
        "gpu": [s for s in rec.samples if s.get("kind") == "gpu"],
        "marks": marks,
    }
    if bucket > 1:
        out["steps_downsampled"] = {"of": n, "bucket": bucket}
    return out


_SERIES = ("step_time", "loss", "throughput")


def _rows(c: StepChunk, cols: dict[str, Any], idx: Any) -> list[dict[str, Any]]:
    t, step = c.t[idx].tolist(), c.step[idx].tolist()
    vals = {k: [None if v != v else v for v in cols[k][idx].tolist()] for k in _SERIES}
    return [
        {"t": t[i], "step": step[i], "attempt": c.attempt,
         **{k: vals[k][i] for k in _SERIES}}
        for i in range(len(t))
    ]  # fmt: skip


def _step_series(log: StepLog, key: str | None, n: int) -> tuple[list[dict[str, Any]], int]:
    """The chart rows of the steps, and the bucket (records per bucket; 1: every step).

    With more than ``CHART_POINTS`` steps, the steps are cut into buckets of ``B``
    consecutive records (B the least power of two leaving at most CHART_POINTS / 2
    buckets), and each bucket keeps, for each series, the step of its minimum and of its
    maximum (the first one on a tie), plus each attempt's first and last step: a spike or a
    stall stays visible, and the result depends on the steps only.
    """
    bucket = 1
    if n > CHART_POINTS:
        while -(-n // bucket) * 2 > CHART_POINTS:
            bucket *= 2
    rows: list[dict[str, Any]] = []
    best: dict[tuple[str, int, int], tuple[float, int]] = {}  # (series, kind, bucket) -> pick
    picked: dict[int, dict[str, Any]] = {}
    ends: dict[int, tuple[int, int]] = {}  # attempt -> (first, last) record index
    g = 0
    for c in log.chunks():
        m = len(c)
        if not m:
            continue
        st = col(c, "step_time")
        st = np.where(np.isfinite(st), st, np.nan)
        loss = col(c, "loss")
        loss = np.where(np.isfinite(loss), loss, np.nan)
        amount = col(c, key) if key else np.full(m, np.nan)
        per = np.where(np.isfinite(amount), amount, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(np.isfinite(st) & (st != 0), per / np.where(st != 0, st, 1.0), np.nan)
        cols = {"step_time": st, "loss": loss, "throughput": rate}
        if bucket == 1:
            rows.extend(_rows(c, cols, np.arange(m)))
            g += m
            continue
        gi = g + np.arange(m)
        b = gi // bucket
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, m]))
        want: set[int] = set()
        for name in _SERIES:
            v = cols[name]
            if not np.isfinite(v).any():
                continue
            for kind, reduce in ((0, np.fmin), (1, np.fmax)):
                agg = reduce.reduceat(v, starts)
                idx = np.flatnonzero(v == agg[seg])
                _u, first = np.unique(seg[idx], return_index=True)
                for i in idx[first].tolist():
                    k = (name, kind, int(b[i]))
                    value, at = float(v[i]), g + i
                    old = best.get(k)
                    if old is None or (value < old[0] if kind == 0 else value > old[0]):
                        best[k] = (value, at)
                        want.add(i)
        first_last = ends.get(c.attempt)
        ends[c.attempt] = (g if first_last is None else first_last[0], g + m - 1)
        want |= {0, m - 1}
        idx = np.array(sorted(want), dtype=np.int64)
        for i, row in zip(idx.tolist(), _rows(c, cols, idx), strict=True):
            picked[g + i] = row
        g += m
    if bucket == 1:
        return rows, 1
    keep = {at for _value, at in best.values()}
    keep |= {i for pair in ends.values() for i in pair}
    return [picked[i] for i in sorted(keep) if i in picked], bucket


def _mark_label(ev: dict[str, Any]) -> str:
    kind, n = ev.get("kind"), ev.get("attempt")
    if kind == "restart":
        return f"restart as attempt {n} after {ev.get('after')} (backoff {ev.get('backoff_s')} s)"
    if kind == "attempt_start":
        resume = ev.get("resume_step")
        return f"attempt {n} started" + (
            "" if resume is None else f", resuming after step {resume}"
        )
    if kind == "attempt_exit":
        return f"attempt {n}: {ev.get('class') or ev.get('outcome')} ({ev.get('reason')})"
    seconds = num(ev.get("seconds"))
    return f"idle {seconds or 0:.0f} s ({ev.get('source')} below {ev.get('threshold')})"
