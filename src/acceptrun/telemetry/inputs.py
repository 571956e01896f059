"""What the telemetry summary reads from a run record, read once and never raising.

:func:`read_run` loads ``events.jsonl``, ``telemetry.jsonl``, ``spec.toml``,
``provenance.json`` and the step log (record/steplog.py); a missing, partial or torn file
reads as empty (a damaged spec as the defaults). The summary (telemetry/summary.py), its
step pass (telemetry/steps.py) and the chart series (telemetry/timelines.py) read from
the :class:`RunFiles` it returns, never from the files themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json, read_jsonl
from acceptrun._util.units import finite_number as num
from acceptrun.record.steplog import StepLog
from acceptrun.spec.model import RunSpec, load_spec

__all__ = ["RunFiles", "black_box", "json_step_count", "read_run"]


@dataclass
class RunFiles:
    events: list[dict[str, Any]]  # events.jsonl (with the steps of a format-1 record)
    samples: list[dict[str, Any]]
    spec: RunSpec  # the frozen spec; a default one when it is missing or damaged
    provenance: dict[str, Any]
    log: StepLog


def read_run(run_dir: Path) -> RunFiles:
    """Everything summarize reads; a missing or damaged file reads as empty."""
    events = _timed(read_jsonl(run_dir / "events.jsonl"))
    samples = _timed(read_jsonl(run_dir / "telemetry.jsonl"))
    spec = RunSpec(name="-", command=["-"])  # every section at its defaults
    with contextlib.suppress(Exception):  # a damaged spec: defaults, never an exception
        spec = load_spec(run_dir / "spec.toml")
    provenance: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        found = read_json(run_dir / "provenance.json", root=run_dir)
        provenance = found if isinstance(found, dict) else {}
    return RunFiles(events, samples, spec, provenance, StepLog(run_dir, events=events))


def _timed(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lines with a numeric ``t``, in file order (a line without one is ignored)."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        out = [ev for ev in lines if num(ev.get("t")) is not None]
    return out


def json_step_count(events: list[dict[str, Any]]) -> int:
    return sum(
        1
        for ev in events
        if ev.get("kind") == "step"
        and isinstance(ev.get("step"), int)
        and not isinstance(ev.get("step"), bool)
    )


def black_box(events: list[dict[str, Any]]) -> bool:
    """True when the launch recorded a command that does not use the client API."""
    usage = next((ev for ev in events if ev.get("kind") == "usage"), None)
    return usage is not None and usage.get("usage") != "client"
