"""Are the checkpoints frequent enough for the run's value? The verdict's interval line.

The model is :mod:`acceptrun.cost.interval`; this module reads its inputs from a run's
record, each with where it came from:

- the interval: seconds of step time per checkpoint committed, measured when the run
  committed two or more; else the spec's ``checkpoint.every``, or ``every_steps`` times
  the mean step time;
- the save cost δ: the mean time a checkpoint blocked the training loop (``stall_s`` of
  its ``checkpoint_stage`` events; a commit's ``stall_s`` where there is none). A black
  box's own save blocks it for a time acceptrun does not see: no advice then;
- the restart cost R: per restart, the time from the end of the interrupted attempt to
  the next one's first step (the supervisor's restart, the start-up, the restore, the
  first step), plus the hang window for a hang (the time to detect it); without a restart,
  the first attempt's start-up, said to be an estimate;
- the interruptions: attempts that ended in a failure a checkpoint protects against (not a
  success, a stop, a limit or the user's error);
- M: measured when the run saw three interruptions or more; else ``checkpoint.mtbf``;
  else this workspace's newest runs of the same spec name (three interruptions or more
  between them; the index names them, the newest 20 are read); else the published fleet figure :data:`~acceptrun.cost.interval.FLEET` divided by
  the run's GPUs (at least one), named with its source.

The line is information, never a failure, unless ``acceptance.min_ettr`` asks for a
minimum measured ETTR.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acceptrun._util.units import format_duration
from acceptrun.cost.interval import FLEET, daly_interval, forecast, young_interval
from acceptrun.record.status import FailureClass
from acceptrun.record.view import read_attempts
from acceptrun.record.workspace import RunRecord, Workspace, iso_seconds
from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput

if TYPE_CHECKING:
    from acceptrun.spec.model import RunSpec
    from acceptrun.telemetry.summary import Summary

__all__ = ["Measured", "interval_check", "measure"]

# Attempt classes that are no interruption a checkpoint protects against.
_NOT_INTERRUPTIONS = {
    FailureClass.SUCCESS, FailureClass.STOPPED, FailureClass.WALL_TIME, FailureClass.BUDGET,
    FailureClass.IDLE, FailureClass.USER_ERROR,
}  # fmt: skip
MIN_MEASURED = 3  # interruptions a run (or its history) needs before its own M is used


@dataclass
class Measured:
    """The model's inputs as one run's record gives them, each with its source."""

    interval_s: float | None = None
    interval_from: str = ""
    save_s: float | None = None
    save_from: str = ""
    memory_save_s: float | None = None  # the memory tier's stall per save (memory_every)
    memory_save_from: str = ""
    restart_s: float | None = None
    restart_from: str = ""
    interruptions: int = 0
    mtbf_s: float | None = None
    mtbf_from: str = ""
    productive_s: float | None = None
    wall_s: float | None = None
    fixed_s: float = 0.0  # seconds outside the model: the first start-up, the close
    usd_per_hour: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ettr(self) -> float | None:
        if self.productive_s is None or not self.wall_s:
            return None
        return self.productive_s / self.wall_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s, "interval_from": self.interval_from,
            "save_s": self.save_s, "save_from": self.save_from,
            "memory_save_s": self.memory_save_s, "memory_save_from": self.memory_save_from,
            "restart_s": self.restart_s, "restart_from": self.restart_from,
            "interruptions": self.interruptions,
            "mtbf_s": self.mtbf_s, "mtbf_from": self.mtbf_from,
            "productive_s": self.productive_s, "wall_s": self.wall_s, "ettr": self.ettr,
            "fixed_s": self.fixed_s,
            "usd_per_hour": self.usd_per_hour,
        }  # fmt: skip


def _interruptions(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in attempts if a.get("class") not in _NOT_INTERRUPTIONS]


def measure(given: CheckInput, summary: Summary | None = None) -> Measured:
    """The interval model's inputs for the run of ``given`` (see the module docstring).

    ``summary``: the run's telemetry summary when the caller has it (a closed run's
    summary.json, :func:`~acceptrun.telemetry.summary.load_summary`); else the verdict's.
    """
    spec, record, out = given.spec, given.record, Measured()
    summary = summary if summary is not None else given.summary
    attempts = read_attempts(record)
    events = list(record.events("checkpoint_stage", "checkpoint_commit"))
    # Productive step time and wall time: the summary's breakdown.
    if summary is not None and summary.wall_s:
        parts = summary.breakdown
        out.productive_s = float(parts.get("compute", 0.0) + parts.get("data_wait", 0.0))
        out.wall_s = float(summary.wall_s)
        # Paid once whatever the interval: launch to the first step, and the close.
        out.fixed_s = float((summary.first_step_s or 0.0) + parts.get("other", 0.0))
    commits = [
        e for e in events
        if e.get("kind") == "checkpoint_commit" and not e.get("redated_from")
    ]  # fmt: skip
    _measure_save(out, events, commits)
    _measure_memory_save(out, record)
    _measure_interval(out, spec, summary, commits)
    _measure_restart(out, spec, attempts)
    _measure_mtbf(out, spec, record, attempts)
    out.usd_per_hour = _usd_per_hour(record, spec)
    return out


def _measure_save(
    out: Measured, events: list[dict[str, Any]], commits: list[dict[str, Any]]
) -> None:
    """The save cost: what the loop was blocked for per checkpoint (its stage, else its
    commit; a black box's own save is not seen)."""
    stalls = [
        float(e["stall_s"]) for e in events
        if e.get("kind") == "checkpoint_stage" and isinstance(e.get("stall_s"), int | float)
    ]  # fmt: skip
    if not stalls:
        stalls = [
            float(e["stall_s"]) for e in commits
            if isinstance(e.get("stall_s"), int | float) and e.get("source") != "watched"
        ]  # fmt: skip
    if stalls:
        out.save_s = statistics.fmean(stalls)
        out.save_from = f"measured: the mean stall of {len(stalls)} checkpoint(s)"
    elif any(e.get("source") == "watched" for e in commits):
        out.notes.append("a black box's own save blocks it for a time acceptrun does not see")


def _measure_memory_save(out: Measured, record: Any) -> None:
    """The memory tier's stall per save: its attempts' ``memory_saves`` figures summed
    (a durable commit copied in, `adopted`, is counted apart: no stall of its own)."""
    saves, stall = 0, 0.0
    for e in record.events("memory_saves"):
        own = int(e.get("saves") or 0)
        if own > 0 and isinstance(e.get("stall_s"), int | float):
            saves, stall = saves + own, stall + float(e["stall_s"])
    if saves:
        out.memory_save_s = stall / saves
        out.memory_save_from = f"measured: the mean stall of {saves} save(s) to memory"


def _measure_interval(
    out: Measured, spec: RunSpec, summary: Summary | None, commits: list[dict[str, Any]]
) -> None:
    """The interval, in seconds of step time: measured, else the spec's."""
    if len(commits) >= 2 and out.productive_s:
        out.interval_s = out.productive_s / len(commits)
        out.interval_from = f"measured: {len(commits)} checkpoints over the step time"
    elif spec.checkpoint.every is not None:
        out.interval_s = float(spec.checkpoint.every)
        out.interval_from = "checkpoint.every"
    elif spec.checkpoint.every_steps is not None and summary is not None and summary.steps:
        mean = (summary.step_time or {}).get("mean")
        if mean:
            out.interval_s = spec.checkpoint.every_steps * float(mean)
            out.interval_from = "checkpoint.every_steps x the mean step time"


def _measure_restart(out: Measured, spec: RunSpec, attempts: list[dict[str, Any]]) -> None:
    """Interruptions and the restart cost: the gap to the next attempt, its start-up, and
    the hang window a hang waited out."""
    hits = _interruptions(attempts)
    out.interruptions = len(hits)
    hang = float(spec.limits.hang_window) if spec.limits.hang_window else 0.0
    costs = []
    by_number = {int(a.get("attempt", 0)): a for a in attempts}
    for a in attempts:
        nxt = by_number.get(int(a.get("attempt", 0)) + 1)
        if a not in hits or nxt is None:
            continue
        end, start = iso_seconds(a.get("ended_at")), iso_seconds(nxt.get("started_at"))
        startup = (nxt.get("work") or {}).get("startup_s")
        if end is None or start is None or not isinstance(startup, int | float):
            continue
        detect = hang if a.get("class") == FailureClass.HANG else 0.0
        costs.append(max(0.0, start - end) + float(startup) + detect)
    if costs:
        out.restart_s = statistics.fmean(costs)
        out.restart_from = f"measured over {len(costs)} restart(s)"
    elif attempts and isinstance((attempts[0].get("work") or {}).get("startup_s"), int | float):
        out.restart_s = float(attempts[0]["work"]["startup_s"])
        out.restart_from = "estimate: no restart; the first start-up"


def _measure_mtbf(
    out: Measured, spec: RunSpec, record: RunRecord, attempts: list[dict[str, Any]]
) -> None:
    """M, the mean time between interruptions: this run's, the spec's, the spec name's
    history, else the published fleet figure for the run's GPUs."""
    run_time = sum(float(a.get("duration_s") or 0.0) for a in attempts)
    if out.interruptions >= MIN_MEASURED and run_time > 0:
        out.mtbf_s = run_time / out.interruptions
        out.mtbf_from = (
            f"measured: {out.interruptions} interruptions in {format_duration(run_time)}"
        )
    elif spec.checkpoint.mtbf is not None:
        out.mtbf_s = float(spec.checkpoint.mtbf)
        out.mtbf_from = "checkpoint.mtbf"
    else:
        seen = _history(record, spec.name)
        if seen is not None:
            out.mtbf_s, out.mtbf_from = seen
        else:
            gpus = max(1, int(spec.resources.gpus) * int(spec.resources.nodes))
            out.mtbf_s = FLEET.gpu_mtbf_s / gpus
            out.mtbf_from = f"published: {FLEET.source}, per GPU / {gpus} GPU(s)"


def _usd_per_hour(record: RunRecord, spec: RunSpec) -> float | None:
    """The price of the whole job per wall hour; None when it has none."""
    try:
        from acceptrun.cost.ledger import price_of_run

        price, _, _ = price_of_run(record)
        if price is not None:
            return float(price.price_per_hour) * int(spec.resources.nodes)
    except Exception:  # a price the catalog no longer has: no dollars in the line
        return None
    return None


HISTORY_RUNS = 20  # the newest runs of a spec name read for its history of interruptions


def _history(record: RunRecord, name: str) -> tuple[float, str] | None:
    """M from this workspace's newest runs of the same spec name, when they saw enough.

    The workspace's index says which runs have that name; only their attempts' exit
    records are read, the newest :data:`HISTORY_RUNS` at most.
    """
    try:
        rows = Workspace(record.path.parent.parent).list_runs()
    except Exception:  # a record outside a workspace (a copied path): no history
        return None
    mine = [r for r in rows if r.name == name and r.run_id != record.run_id][-HISTORY_RUNS:]
    total, hits, runs = 0.0, 0, 0
    for row in mine:
        try:
            attempts = read_attempts(RunRecord(Path(row.path)))
        except Exception:  # a damaged record is not history
            continue
        runs += 1
        total += sum(float(a.get("duration_s") or 0.0) for a in attempts)
        hits += len(_interruptions(attempts))
    if hits < MIN_MEASURED or total <= 0:
        return None
    return total / hits, (
        f"this workspace's history: {hits} interruptions in {format_duration(total)} over "
        f"the newest {runs} run(s) of {name!r}"
    )


def interval_check(given: CheckInput) -> list[Check]:
    """The checkpoint interval against the optimum for the measured costs (information)."""
    if given.spec.serving.enabled or given.spec.inference.enabled:
        return []
    m = measure(given)
    floor = given.spec.acceptance.min_ettr
    required = floor is not None and not given.standalone
    ettr = m.ettr
    measured = "" if ettr is None else f"ETTR {ettr:.3f} measured"
    if floor is not None:
        measured += f" (at least {floor:g})" if measured else ""
    status = PASS
    fix = None
    if floor is not None:
        if ettr is None:
            status, fix = NOT_RECORDED, "the run recorded no step time to measure its ETTR from"
        elif ettr < floor:
            status = FAIL
            fix = "see the optimum interval in this line; docs/checkpoint-interval.md"
    if m.interval_s is None or m.save_s is None or not m.save_s or m.mtbf_s is None:
        why = "; ".join(m.notes) or (
            "no checkpoint interval" if m.interval_s is None else "no checkpoint stall measured"
        )
        evidence = f"{measured + '; ' if measured else ''}no interval advice: {why}"
        return [Check("data", "checkpoint interval", status, required, evidence, fix)]
    restart = m.restart_s or 0.0
    work = m.productive_s or m.interval_s
    best = daly_interval(m.save_s, m.mtbf_s)
    save, mtbf, price, fixed = m.save_s, m.mtbf_s, m.usd_per_hour, m.fixed_s
    now = forecast(m.interval_s, save=save, mtbf=mtbf, restart=restart, work=work,
                   usd_per_hour=price, fixed=fixed)  # fmt: skip
    opt = forecast(best, save=save, mtbf=mtbf, restart=restart, work=work,
                   usd_per_hour=price, fixed=fixed)  # fmt: skip
    parts = [
        f"every {format_duration(m.interval_s)} of step time ({m.interval_from})",
        f"a save blocks {_seconds(m.save_s)} ({m.save_from})",
        f"a restart costs {_seconds(restart)} ({m.restart_from or 'none measured'})",
        f"{m.interruptions} interruption(s); M = {format_duration(m.mtbf_s)} ({m.mtbf_from})",
        f"optimum every {format_duration(best)} (Daly 2006; Young 1974: "
        f"{format_duration(young_interval(m.save_s, m.mtbf_s))})",
        (f"{measured}, " if measured else "")
        + f"predicted {now.ettr:.3f} at this interval and {opt.ettr:.3f} at the optimum",
    ]
    if now.cost_usd is not None and opt.cost_usd is not None:
        diff = now.cost_usd - opt.cost_usd
        parts.append(
            f"the optimum would cost {abs(diff):.2f} USD {'less' if diff >= 0 else 'more'} "
            "for this run's work (predicted)"
        )
    # The terminal's line: the interval against the optimum; the model, its inputs and
    # where each comes from stay in the evidence (the report, `show --explain`).
    ettr_now = f"{ettr:.3f} measured" if ettr is not None else f"{now.ettr:.3f} predicted"
    brief = (
        f"every {format_duration(m.interval_s)}, optimum {format_duration(best)}; "
        f"ETTR {ettr_now}, {opt.ettr:.3f} at the optimum"
    )
    return [Check("data", "checkpoint interval", status, required, "; ".join(parts), fix, brief)]


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 60 else format_duration(value)
