"""Typed models of the record's JSON files: run.json, exit.json, verdict.json, ledger.json.

Each file carries :func:`stamp`: ``"format": FORMAT`` and the ``acceptrun_version`` that
wrote it. Reading:

- no ``format``: a record written before formats existed; read as format 1;
- ``format`` up to :data:`FORMAT`: read;
- a newer ``format``: :class:`~acceptrun.errors.RecordError` naming the file, its format,
  the acceptrun that wrote it and the fix (install that version or newer), never a silent
  misreading.

The models keep the whole parsed object in ``raw``: a field a newer writer added within
the same format is never lost by a reader that passes the data on.

>>> RunState.from_json({"run_id": "r", "status": "finished"}, "run.json").status
'finished'
>>> RunState.from_json({"format": 99, "acceptrun_version": "9.0"}, "runs/r/run.json")
Traceback (most recent call last):
...
acceptrun.errors.RecordError: runs/r/run.json has format 99, written by acceptrun 9.0; this acceptrun ... reads formats up to 2: install acceptrun 9.0 or newer (python -m pip install 'acceptrun>=9.0', or the wheel `acceptrun export wheel` writes where the record was made) to read this record
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._version import RELEASE, __version__
from acceptrun.errors import RecordError
from acceptrun.record.status import RunStatus

__all__ = [
    "FORMAT",
    "LedgerFile",
    "RunState",
    "VerdictFile",
    "record_format",
    "stamp",
]

# The record format this code writes and the newest it reads. 1: every step a JSON line
# of events.jsonl. 2: steps in the step log, attempts/<n>/steps/ (record/steplog.py);
# events.jsonl keeps the other events. Readers read both.
FORMAT = 2


def stamp() -> dict[str, Any]:
    """What every record file a writer makes begins with: its format and its writer."""
    return {"format": FORMAT, "acceptrun_version": __version__}


def record_format(data: Any, path: str | Path) -> int:
    """The format of a record file's parsed JSON (1 when absent); a newer one raises."""
    if not isinstance(data, dict):
        raise RecordError(
            f"{path} holds a JSON {type(data).__name__}, not an object; the record is "
            "damaged. Restore it from a copy, or run `acceptrun index rebuild` to skip it."
        )
    fmt = data.get("format", 1)
    if type(fmt) is not int or fmt < 1:
        raise RecordError(
            f"{path} has format {fmt!r}, which is not a format number (1, 2, ...); "
            "the record is damaged. Restore it from a copy."
        )
    if fmt > FORMAT:
        by = data.get("acceptrun_version")
        if isinstance(by, str) and RELEASE.match(by):
            raise RecordError(
                f"{path} has format {fmt}, written by acceptrun {by}; this acceptrun "
                f"{__version__} reads formats up to {FORMAT}: install acceptrun {by} or newer "
                f"(python -m pip install 'acceptrun>={by}', or the wheel `acceptrun export "
                "wheel` writes where the record was made) to read this record"
            )
        raise RecordError(
            f"{path} has format {fmt}, newer than this acceptrun {__version__} reads (up to "
            f"{FORMAT}); upgrade acceptrun (python -m pip install -U acceptrun) to read this "
            "record"
        )
    return fmt


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _opt_num(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunState:
    """run.json: where the run is, when it started and ended, and its verdict."""

    format: int
    run_id: str | None
    name: str | None
    status: str  # a RunStatus value; kept as written so a newer status still reads
    mode: str | None  # None (supervised), standalone, tune
    created_at: str | None
    ended_at: str | None
    verdict: str | None  # accepted | rejected | None (not decided)
    attempts: int
    steps: int | None
    duration_s: float | None
    work: dict[str, Any]  # steps, seconds and device-seconds lost (record.view.work_lost)
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Any, path: str | Path) -> RunState:
        fmt = record_format(data, path)
        attempts = data.get("attempts")
        steps = data.get("steps")
        work = data.get("work")
        return cls(
            format=fmt,
            run_id=_opt_str(data.get("run_id")),
            name=_opt_str(data.get("name")),
            status=str(data.get("status", "unknown")),
            mode=_opt_str(data.get("mode")),
            created_at=_opt_str(data.get("created_at")),
            ended_at=_opt_str(data.get("ended_at")),
            verdict=_opt_str(data.get("verdict")),
            attempts=attempts if type(attempts) is int else 0,
            steps=steps if type(steps) is int else None,
            duration_s=_opt_num(data.get("duration_s")),
            work=work if isinstance(work, dict) else {},
            raw=data,
        )

    @property
    def run_status(self) -> RunStatus | None:
        """The status as a :class:`RunStatus`; None for a status this code does not know."""
        try:
            return RunStatus(self.status)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictFile:
    """verdict.json: the decision and every check with its evidence."""

    format: int
    run_id: str | None
    accepted: bool
    decided_at: str | None
    failed: list[str]
    checks: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Any, path: str | Path) -> VerdictFile:
        fmt = record_format(data, path)
        failed, checks = data.get("failed"), data.get("checks")
        return cls(
            format=fmt,
            run_id=_opt_str(data.get("run_id")),
            accepted=data.get("accepted") is True,
            decided_at=_opt_str(data.get("decided_at")),
            failed=[str(f) for f in failed] if isinstance(failed, list) else [],
            checks=[c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else [],
            raw=data,
        )

    @property
    def label(self) -> str:
        return "ACCEPTED" if self.accepted else "REJECTED"


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerFile:
    """ledger.json: what the run cost, by attempt and by kind (cost/ledger.py)."""

    format: int
    run_id: str | None
    priced: bool
    total_usd: float | None
    totals: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: Any, path: str | Path) -> LedgerFile:
        fmt = record_format(data, path)
        totals = data.get("totals")
        return cls(
            format=fmt,
            run_id=_opt_str(data.get("run_id")),
            priced=data.get("priced") is True,
            total_usd=_opt_num(data.get("total_usd")),
            totals=totals if isinstance(totals, dict) else {},
            raw=data,
        )
