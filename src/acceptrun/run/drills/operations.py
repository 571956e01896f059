"""The operations drill: ``acceptrun drill SPEC``, acceptance test 4 in one command.

1. **Reference** (run A): the spec runs uninterrupted. Its events give the steps, the
   first checkpoints and the workload's own start-up time (attempt start to first step).
2. **Drill run** (run B): the same spec with two real faults injected
   (:mod:`acceptrun.workload.inject`): ``kill@step=K1:after=checkpoint`` between the first and
   second checkpoint, so some steps are really lost, and ``term@step=K2:attempt=2`` at about 70% of the
   steps, a graceful preemption of the resumed attempt.
3. **Compare**: B's final trajectory (for each step, the loss of the last attempt that
   logged it) against A's, bitwise by default (losses are floats written by ``json``,
   which round-trips them exactly) or within ``tolerance``; the registered outputs'
   hashes; the final metrics.
4. **Measure** each restart: lost steps (last step logged before the failure minus the
   step resumed from; 0 for the preemption) and recovery time: the supervisor's gap (the
   failed attempt's recorded exit to the next attempt's start, measured directly) plus
   the next attempt's start-up beyond A's (its start to its first step, minus A's start
   to first step; none when it started faster, which is start-up noise, not negative
   time), so a recovery is never shorter than the gap it contains.

A script without the client API whose checkpoints are watched (``checkpoint.watch``) is
drilled for the kill only: the supervisor puts its captured checkpoint back and resumes
it, and the kill is judged by the trajectory (its first step after the resume is at or
after the checkpoint's step, which for a checkpoint dated by its log lines is a lower
bound). The preemption is skipped up front, as not applicable, not failed: such a script
saves when it decides, not on SIGTERM, so a preemption can only lose the steps since its
last save, which is what the kill already measures. A required ``"preempt"`` drill then
reads "not recorded" in the verdict, with the reason.

The results are ``drill`` events in B's record (``{"drill": "kill" | "preempt", "ok",
"evidence", ...}``, which the verdict reads, as it does for the restore drill) and
``drill.json`` in B's record with every figure, the reference run and the spec hash.
"""

from __future__ import annotations

import math
import statistics
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun.errors import UserError
from acceptrun.record import recovery
from acceptrun.record.models import stamp
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord, now_iso
from acceptrun.spec.model import RunSpec, load_spec

__all__ = [
    "DrillReport",
    "Restart",
    "compare_runs",
    "final_trajectory",
    "format_drill",
    "measure_restarts",
    "plan_kill",
    "preempt_not_applicable",
    "run_ops_drill",
    "startup_seconds",
]

_log = get_logger(__name__)  # which of the two runs is going

FORMAT = "acceptrun.ops-drill/1"
PREEMPT_AT = 0.7  # fraction of the steps where the drill preempts the resumed attempt


@dataclass(slots=True)
class Restart:
    """One failed attempt and the resume that followed it."""

    attempt: int
    """The attempt that failed."""
    fault: str | None
    """The injected action that ended it (kill, term...), None for a failure of its own."""
    fault_step: int | None
    """The step the fault fired at (None for a time fault or no fault)."""
    exit: str
    """How it ended, from exit.json ("killed by SIGKILL", "exited 143")."""
    last_step: int | None
    """The last step it logged."""
    resume_step: int | None
    """The checkpoint step the next attempt resumed from (None: started over)."""
    lost_steps: int | None
    """Steps done again: last_step - resume_step."""
    first_step: int | None
    """The first step the next attempt logged (resume_step + 1 when resumed)."""
    stopped_checkpoint: int | None
    """For a graceful stop: the step its "stopped" event says was checkpointed."""
    detect_s: float | None
    """The fault (the child's death) to the attempt's recorded exit: noticing it, the logs."""
    gap_s: float | None
    """Supervisor time: the attempt's exit to the next attempt's start (backoff included)."""
    backoff_s: float | None
    """The restart backoff the spec asked for (part of gap_s)."""
    restore_s: float | None
    """Time the next attempt spent loading its checkpoint."""
    recovery_s: float | None
    """The attempt's exit to the next attempt's start, plus its start-up beyond the
    reference's (never below the gap: a faster start-up is noise, not negative time)."""
    death_to_step_s: float | None
    """The same from the fault (the child's death) instead of the recorded exit."""
    next_startup_s: float | None = None
    """The next attempt's own start-up: its start to its first step (restore included)."""


@dataclass(slots=True)
class DrillReport:
    """Everything the drill found; ``to_dict()`` is drill.json."""

    spec: str
    spec_hash: str
    reference_run: str
    drill_run: str
    faults: list[str]
    steps: int
    checkpoints: list[int]
    startup_s: float
    tolerance: float
    restarts: list[Restart]
    comparison: dict[str, Any]
    drills: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    verdict: str | None = None

    @property
    def ok(self) -> bool:
        """Every drill that ran passed (a skipped one, not applicable, neither passes nor fails)."""
        ran = [d for d in self.drills if not d.get("skipped")]
        return bool(ran) and all(d["ok"] for d in ran)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "ok": self.ok,
            "spec": self.spec,
            "spec_hash": self.spec_hash,
            "reference_run": self.reference_run,
            "drill_run": self.drill_run,
            "faults": self.faults,
            "steps": self.steps,
            "checkpoints": self.checkpoints,
            "startup_s": round(self.startup_s, 3),
            "tolerance": self.tolerance,
            "drills": self.drills,
            "restarts": [asdict(r) for r in self.restarts],
            "comparison": self.comparison,
            "warnings": self.warnings,
            "verdict": self.verdict,
            "at": now_iso(),
        }


# ---- reading a record -----------------------------------------------------------------------


def final_trajectory(record: RunRecord) -> dict[int, tuple[float, int]]:
    """Step -> (loss, attempt) from the last attempt that logged the step."""
    return RecordView(record).trajectory("loss")


def startup_seconds(record: RunRecord, attempt: int = 1) -> float | None:
    """The workload's own start-up: ``attempt_start`` to its first ``step`` event, seconds."""
    view = RecordView(record)  # one read of events.jsonl
    start = next((e["t"] for e in view.events("attempt_start") if e["attempt"] == attempt), None)
    first = next((e["t"] for e in view.steps() if e.get("attempt") == attempt), None)
    return None if start is None or first is None else first - start


def measure_restarts(record: RunRecord, startup_s: float) -> list[Restart]:
    """Each attempt followed by another one: what it lost and how long the resume took.

    The times are the record's restarts (:func:`acceptrun.record.recovery.restarts`); the
    drill adds the steps lost and the next attempt's start-up beyond the reference's.
    """
    events = RecordView(record).all_events
    out = []
    for timed in recovery.restarts(record):
        attempt, nxt = timed.attempt, timed.attempt + 1
        mine = [e for e in events if e.get("attempt") == attempt]
        steps = [e["step"] for e in mine if e["kind"] == "step"]
        next_steps = [e for e in events if e.get("attempt") == nxt and e["kind"] == "step"]
        ended = next(e for e in mine if e["kind"] == "attempt_exit")
        started = next(e for e in events if e["kind"] == "attempt_start" and e["attempt"] == nxt)
        fault = next((e for e in mine if e["kind"] == "fault_injected"), None)
        stopped = next((e for e in mine if e["kind"] == "stopped"), None)
        last = max(steps) if steps else None
        resume = started.get("resume_step")
        first_t = timed.first_step_t
        # Each part is measured from the same supervisor's clock and is never negative; the
        # reference's start-up is subtracted only from the next attempt's own start-up, so
        # a start faster than the reference's (noise) never makes the gap look shorter.
        own = None if first_t is None else max(0.0, first_t - timed.start_t)
        extra = None if own is None else max(0.0, own - startup_s)
        out.append(
            Restart(
                attempt=attempt,
                fault=None if fault is None else str(fault["action"]),
                fault_step=None if fault is None else fault.get("step"),
                exit=str(ended.get("reason", "")),
                last_step=last,
                resume_step=resume,
                lost_steps=None if last is None else last - (-1 if resume is None else resume),
                first_step=next_steps[0]["step"] if next_steps else None,
                stopped_checkpoint=None if stopped is None else stopped.get("checkpoint"),
                detect_s=None if fault is None else timed.parts()["detect"],
                gap_s=_round(timed.start_t - timed.exit_t),
                backoff_s=timed.backoff_s,
                restore_s=timed.restore_s,
                recovery_s=None
                if extra is None
                else _round(max(0.0, timed.start_t - timed.exit_t) + extra),
                death_to_step_s=None
                if extra is None or fault is None
                else _round(max(0.0, timed.start_t - fault["t"]) + extra),
                next_startup_s=None if own is None else _round(own),
            )
        )
    return out


def _round(x: float) -> float:
    return round(x, 3)


def _outputs(record: RunRecord) -> dict[str, str]:
    return {str(e["name"]): str(e.get("hash")) for e in record.events("output")}


def _metrics(record: RunRecord) -> dict[str, float]:
    return {
        str(e["name"]): float(e["value"])
        for e in record.events("metric")
        if isinstance(e.get("value"), int | float)
    }


# ---- comparing two runs ---------------------------------------------------------------------


def _same(a: float, b: float, tolerance: float) -> bool:
    """Bitwise equal (tolerance 0; NaN equals NaN), else ``|a-b| <= tolerance * max(1, |a|, |b|)``."""
    if tolerance == 0:
        return struct.pack("<d", a) == struct.pack("<d", b) or (a != a and b != b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (a != a and b != b)
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def compare_runs(reference: RunRecord, drill: RunRecord, tolerance: float = 0.0) -> dict[str, Any]:
    """Trajectory, outputs and final metrics of ``drill`` against ``reference``.

    Returns plain data (it goes into drill.json): ``equal`` for the whole, the first
    step whose loss differs with the attempt that logged it, steps missing from either
    trajectory, and per output and metric both values. ``fresh_start_equal`` compares
    only the steps of the drill run's first attempt, before any fault: when those
    differ the workload is not deterministic, whatever the resume does.
    """
    ref, got = final_trajectory(reference), final_trajectory(drill)
    first_diff = None
    for step in sorted(set(ref) & set(got)):
        if not _same(ref[step][0], got[step][0], tolerance):
            first_diff = {
                "step": step,
                "attempt": got[step][1],
                "reference": ref[step][0],
                "drill": got[step][0],
            }
            break
    fresh = [s for s in sorted(set(ref) & set(got)) if got[s][1] == 1]
    fresh_equal = all(_same(ref[s][0], got[s][0], tolerance) for s in fresh)
    missing = sorted(set(ref) - set(got))
    extra = sorted(set(got) - set(ref))
    ref_out, got_out = _outputs(reference), _outputs(drill)
    outputs = {
        name: {
            "reference": ref_out.get(name),
            "drill": got_out.get(name),
            "equal": ref_out.get(name) == got_out.get(name),
        }
        for name in sorted(set(ref_out) | set(got_out))
    }
    ref_m, got_m = _metrics(reference), _metrics(drill)
    metrics = {}
    for name in sorted(set(ref_m) | set(got_m)):
        a, b = ref_m.get(name), got_m.get(name)
        same = a is not None and b is not None and _same(a, b, tolerance)
        metrics[name] = {"reference": a, "drill": b, "equal": same}
    # Output files are compared by hash: only a bitwise comparison can ask for equality.
    outputs_ok = tolerance > 0 or all(o["equal"] for o in outputs.values())
    equal = (
        bool(ref)
        and first_diff is None
        and not missing
        and not extra
        and outputs_ok
        and all(m["equal"] for m in metrics.values())
    )
    return {
        "equal": equal,
        "bitwise": tolerance == 0,
        "steps_compared": len(set(ref) & set(got)),
        "first_difference": first_diff,
        "missing_steps": _spans(missing),
        "extra_steps": _spans(extra),
        "fresh_start_equal": fresh_equal,
        "outputs": outputs,
        "metrics": metrics,
    }


def _spans(steps: Iterable[int]) -> list[str]:
    """[3, 4, 5, 9] -> ["3-5", "9"]: short evidence for long gaps."""
    out: list[list[int]] = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return [f"{a}-{b}" if a != b else str(a) for a, b in out]


def _comparison_text(cmp: dict[str, Any], reference_run: str, tolerance: float) -> str:
    how = "bitwise equal" if tolerance == 0 else f"equal within {tolerance:g}"
    if cmp["equal"]:
        return f"trajectory {how} to run {reference_run} ({cmp['steps_compared']} steps)"
    parts = []
    diff = cmp["first_difference"]
    if diff is not None:
        parts.append(
            f"trajectory differs from run {reference_run} first at step {diff['step']} "
            f"(attempt {diff['attempt']}): loss {diff['drill']!r} vs {diff['reference']!r}"
        )
        if not cmp["fresh_start_equal"]:
            parts.append(
                "steps before any fault already differ, so the workload is not deterministic "
                "(seed every RNG, torch.use_deterministic_algorithms(True)) or pass --tolerance"
            )
    if cmp["missing_steps"]:
        parts.append(f"steps {', '.join(cmp['missing_steps'])} were never logged")
    if cmp["extra_steps"]:
        parts.append(f"steps {', '.join(cmp['extra_steps'])} are not in the reference")
    for name, o in cmp["outputs"].items():
        if not o["equal"] and tolerance == 0:
            parts.append(f"output {name!r} hash {o['drill']} vs {o['reference']}")
    for name, m in cmp["metrics"].items():
        if not m["equal"]:
            parts.append(f"metric {name} {m['drill']!r} vs {m['reference']!r}")
    return "; ".join(parts) or f"nothing to compare with run {reference_run}"


# ---- the drill ------------------------------------------------------------------------------


def plan_faults(steps: list[int], checkpoints: list[int]) -> tuple[int, int]:
    """K1 (kill) between the first two checkpoints, K2 (preempt) at about 70% of the steps.

    K1 falls halfway to the second checkpoint, so the kill really loses steps; K2 comes
    later than K1, in the resumed attempt, and before the last step, so the attempt after
    it has work to do.
    """
    first, last = steps[0], steps[-1]
    c1 = checkpoints[0]
    k1 = plan_kill(checkpoints)
    k2 = max(k1 + 1, first + round(PREEMPT_AT * (last - first)))
    if k2 >= last:
        raise UserError(
            f"the workload runs steps {first}-{last} with its first checkpoint at step {c1}: "
            "too few steps after it for a kill and a preemption; the drill needs at least "
            "3 steps after the first checkpoint (raise the step count or checkpoint sooner)"
        )
    return k1, k2


def plan_kill(checkpoints: list[int]) -> int:
    """K1: halfway from the first checkpoint to the second, so the kill really loses steps."""
    c1 = checkpoints[0]
    c2 = next((c for c in checkpoints[1:] if c > c1 + 1), None)
    return c1 + max(1, (c2 - c1) // 2) if c2 is not None else c1 + 1


def _kill_fault(k1: int) -> str:
    """The kill at K1, once the attempt's first checkpoint is committed.

    A kill before anything was saved proves nothing (the attempt can only start over),
    and when a save lands depends on the machine's load, not on the step number: a
    watched checkpoint is captured by the supervisor after its ``settle`` time, a client
    save commits in the background. So the kill waits for it (workload/inject.py): the
    client waits for the save in flight at K1, the supervisor for the capture.
    """
    return f"kill@step={k1}:after=checkpoint:attempt=1"


def preempt_not_applicable(spec: RunSpec) -> str | None:
    """Why a preemption drill cannot apply to this spec's script, or None when it can.

    A script without the client whose checkpoints are watched saves when it decides;
    nothing in it checkpoints on SIGTERM, so the drill could only fail it for a save it
    never promised.
    """
    from acceptrun.workload.usage import detect_usage

    usage = detect_usage(spec)
    if usage.client or not spec.checkpoint.watch:
        return None
    return (
        f"not applicable: {usage.reason}, so nothing checkpoints on SIGTERM (acceptrun can "
        "only send the signal; the script saves its watched files when it decides), and a "
        "preemption loses the steps since its last save, as the kill drill measures"
    )


_PREEMPT_FIX = (
    "save on SIGTERM through the client API (run.restore, run.maybe_checkpoint) to drill a "
    'preemption, or remove "preempt" from acceptance.drills'
)


def _refuse_black_box(spec: RunSpec, spec_path: str | Path) -> None:
    """A script the drill cannot resume or compare is refused before the reference run."""
    from acceptrun.workload.usage import BLACK_BOX, detect_usage

    usage = detect_usage(spec)
    if usage.kind != BLACK_BOX:
        return
    if not spec.checkpoint.watch:
        raise UserError(
            f"{spec_path}: {usage.reason} and the spec watches no checkpoint of it: a killed "
            "attempt could only start over, so the drill has nothing to prove. Set "
            "checkpoint.watch (the script's own checkpoint files) and checkpoint.resume_args "
            '(e.g. ["--resume", "{checkpoint}"]) with progress.pattern for its losses, or use '
            "the client API (run.restore, run.maybe_checkpoint, run.log)"
        )
    if spec.progress.pattern is None and spec.progress.tensorboard is None:
        raise UserError(
            f"{spec_path}: {usage.reason} and the spec reads no progress from it: the drill "
            "compares the losses of each step with a reference run. Set progress.pattern "
            r'(e.g. "iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)") or progress.tensorboard'
        )


def run_ops_drill(
    spec_path: str | Path,
    *,
    workspace: str | Path | None = None,
    tolerance: float = 0.0,
    echo: bool = False,
) -> DrillReport:
    """Run the reference and the drill run, compare them, record and return the results.

    Raises :class:`~acceptrun.errors.UserError` when the spec cannot be drilled (fewer
    than 2 restarts allowed, no steps or checkpoints, a failed reference run).
    """
    from acceptrun.run.launch import launch

    no_preempt = _check_drillable(spec_path, tolerance)
    _log.info(f"drill 1/2: reference run of {spec_path}, uninterrupted")
    a = launch(spec_path, workspace=workspace, echo=echo)
    ref = a.record
    warnings = _check_reference(a)
    steps, checkpoints = _steps_and_checkpoints(ref)
    startup = startup_seconds(ref)
    assert startup is not None, "a run with steps has an attempt start and a first step"
    k1, k2, faults = _plan_drill_faults(ref.run_id, steps, checkpoints, no_preempt)

    _log.info(f"drill 2/2: the same spec with {', '.join(faults)}")
    # The reference run's own watched files are still there: moved into the drill run's
    # record, so both runs start from the same state.
    b = launch(spec_path, workspace=workspace, echo=echo, inject=faults, existing="move")
    rec = b.record
    if b.spec.hash != a.spec.hash:
        warnings.append(f"the spec changed between the two runs ({a.spec.hash} then {b.spec.hash})")
    restarts = measure_restarts(rec, startup)
    cmp = compare_runs(ref, rec, tolerance)
    finished = b.supervision is not None and b.supervision.succeeded
    tail = "" if finished else f"; the drill run did not finish ({_last_reason(b)})"
    same = _comparison_text(cmp, ref.run_id, tolerance)
    drills = _judge_drills(restarts, k1, k2, same, cmp["equal"] and finished, tail, no_preempt)
    report = DrillReport(
        spec=str(Path(spec_path).resolve()),
        spec_hash=a.spec.hash,
        reference_run=ref.run_id,
        drill_run=rec.run_id,
        faults=faults,
        steps=len(steps),
        checkpoints=checkpoints,
        startup_s=startup,
        tolerance=tolerance,
        restarts=restarts,
        comparison=cmp,
        drills=drills,
        warnings=warnings,
    )
    _record_report(rec, report)
    return report


def _check_drillable(spec_path: str | Path, tolerance: float) -> str | None:
    """Refuse a tolerance or a spec the drill cannot run; return why preempt is skipped, if so."""
    if tolerance < 0 or not math.isfinite(tolerance):
        raise UserError(f"--tolerance {tolerance}: expected 0 (bitwise) or a small positive number")
    spec = load_spec(spec_path)
    _refuse_black_box(spec, spec_path)
    no_preempt = preempt_not_applicable(spec)
    if no_preempt is None and spec.limits.max_restarts < 2:
        raise UserError(
            f"{spec_path}: limits.max_restarts = {spec.limits.max_restarts}; the drill restarts "
            "the run twice (after a kill and after a preemption): set it to 2 or more"
        )
    if no_preempt is not None and spec.limits.max_restarts < 1:
        raise UserError(
            f"{spec_path}: limits.max_restarts = {spec.limits.max_restarts}; the drill restarts "
            "the run after a kill: set it to 1 or more"
        )
    if no_preempt is not None:
        _log.info(f"drill: the kill only; preempt skipped, {no_preempt}")
    return no_preempt


def _check_reference(a: Any) -> list[str]:
    """Refuse a reference run that failed; warn (returned) when it took several attempts."""
    ref = a.record
    if a.supervision is None or not a.supervision.succeeded:
        raise UserError(
            f"the reference run {ref.run_id} did not finish ({_last_reason(a)}); the drill "
            "needs a spec that succeeds on its own: fix it first (acceptrun show "
            f"{ref.run_id})"
        )
    if len(a.supervision.attempts) > 1:
        return [
            f"the reference run {ref.run_id} was not uninterrupted: it took "
            f"{len(a.supervision.attempts)} attempts. Does the spec inject a failure of its "
            "own (an env variable in the spec)? Its trajectory is still compared."
        ]
    return []


def _steps_and_checkpoints(ref: RunRecord) -> tuple[list[int], list[int]]:
    """The reference run's logged steps and committed checkpoint steps, refusing too few."""
    steps = sorted({e["step"] for e in ref.events("step") if isinstance(e.get("step"), int)})
    checkpoints = sorted(
        {e["step"] for e in ref.events("checkpoint_commit") if isinstance(e.get("step"), int)}
    )
    if not steps:
        raise UserError(
            f"the reference run {ref.run_id} logged no steps: the drill needs a workload that "
            "uses the client API (run.steps(...), run.log(step, loss=...))"
        )
    if not checkpoints or checkpoints[0] >= steps[-1]:
        raise UserError(
            f"the reference run {ref.run_id} committed no checkpoint before its last step: the "
            "drill needs checkpoints (run.restore(model=..., optimizer=...) and "
            "run.maybe_checkpoint(step) with [checkpoint] every_steps in the spec, or "
            "sharded.save(run.checkpoint_store(), step, ...))"
        )
    return steps, checkpoints


def _plan_drill_faults(
    run_id: str, steps: list[int], checkpoints: list[int], no_preempt: str | None
) -> tuple[int, int, list[str]]:
    """The kill step, the preempt step (-1 when skipped) and the faults the drill run injects."""
    if no_preempt is None:
        k1, k2 = plan_faults(steps, checkpoints)
        return k1, k2, [_kill_fault(k1), f"term@step={k2}:attempt=2"]
    k1 = plan_kill(checkpoints)
    if k1 >= steps[-1]:
        raise UserError(
            f"the reference run {run_id} runs steps {steps[0]}-{steps[-1]} with its "
            f"first checkpoint at step {checkpoints[0]}: no step after it to kill at; "
            "raise the step count or checkpoint sooner"
        )
    return k1, -1, [_kill_fault(k1)]


def _judge_drills(
    restarts: list[Restart],
    k1: int,
    k2: int,
    same: str,
    equal: bool,
    tail: str,
    no_preempt: str | None,
) -> list[dict[str, Any]]:
    """The kill drill's and the preempt drill's findings (preempt skipped where it cannot apply)."""
    kill = next((r for r in restarts if r.fault == "kill"), None)
    term = next((r for r in restarts if r.fault == "term"), None)
    return [
        _judge_kill(kill, k1, same, equal, tail, watched=no_preempt is not None),
        _judge_preempt(term, k2, same, equal, tail)
        if no_preempt is None
        else {"drill": "preempt", "ok": None, "skipped": True, "evidence": no_preempt,
              "fix": _PREEMPT_FIX},
    ]  # fmt: skip


def _record_report(rec: RunRecord, report: DrillReport) -> None:
    """Record each drill as an event of the drill run, decide its verdict again, write drill.json."""
    for d in report.drills:
        rec.event(
            "drill",
            sync=True,
            spec_hash=report.spec_hash,
            reference_run=report.reference_run,
            **d,
        )
    report.verdict = _decide_again(rec)
    rec.write_json("drill.json", report.to_dict())
    rec.update_state(
        drill={"of": "operations", "reference_run": report.reference_run, "ok": report.ok}
    )


def _last_reason(result: Any) -> str:
    sup = result.supervision
    if sup is None or sup.last is None:
        return "no attempt ran: see its preflight.json"
    return f"attempt {sup.last.attempt} {sup.last.reason}"


def _took(r: Restart) -> str:
    """ "1.05 s, 1.0 s of it the restart backoff": the backoff is policy, not overhead."""
    took = "?" if r.recovery_s is None else f"{r.recovery_s:.2f} s"
    if r.backoff_s:
        took += f", {r.backoff_s:g} s of it the restart backoff"
    return took


def _judge_kill(
    r: Restart | None, k1: int, same: str, equal: bool, tail: str, *, watched: bool = False
) -> dict[str, Any]:
    """The kill drill. ``watched``: the checkpoints are a script's own captured files.

    A client checkpoint's step is exact: the resumed attempt's first step is the next one.
    A watched checkpoint's step is the number in its name or the newest step logged before
    the file was written (a lower bound of the state it holds): its first step is at or
    after it, and no later than the killed attempt got; the trajectory is the proof.
    """
    base = {"drill": "kill", "fault_step": k1}
    if r is None:
        return {**base, "ok": False, "evidence": f"the kill at step {k1} never fired{tail}"}
    if watched:
        resumed = (
            r.resume_step is not None
            and r.first_step is not None
            and r.resume_step <= r.first_step <= (r.last_step or 0) + 1
        )
    else:
        resumed = r.resume_step is not None and r.first_step == r.resume_step + 1
    # One process dies of the SIGKILL itself; under torchrun a rank does, and the agent
    # exits 1 after it: the injected kill event says which fault ended the attempt.
    killed = "SIGKILL" in r.exit or (r.fault == "kill" and r.exit != "exited 0")
    ok = equal and resumed and killed and r.lost_steps is not None
    where = (
        f"resumed from step {r.resume_step}"
        if r.resume_step is not None
        else "started over from step 0 (no checkpoint was found)"
    )
    if watched and r.resume_step is not None:
        where += f" (its first step {r.first_step})"
    how = (
        "killed"
        if "SIGKILL" in r.exit
        else f"a rank killed (the attempt {r.exit})"
        if killed
        else f"meant to be killed, but the attempt {r.exit},"
    )
    evidence = (
        f"{how} at step {r.last_step}, {where} in {_took(r)} "
        f"({r.lost_steps} steps redone); {same}{tail}"
    )
    return {
        **base,
        "ok": ok,
        "evidence": evidence,
        "lost_steps": r.lost_steps,
        "recovery_s": r.recovery_s,
    }


def _judge_preempt(r: Restart | None, k2: int, same: str, equal: bool, tail: str) -> dict[str, Any]:
    base = {"drill": "preempt", "fault_step": k2}
    if r is None:
        return {
            **base,
            "ok": False,
            "evidence": f"the preemption at step {k2} (attempt 2) never fired{tail}",
        }
    saved = r.stopped_checkpoint
    ok = equal and r.lost_steps == 0 and saved == r.last_step and r.first_step == k2 + 1
    how = (
        f"checkpointed step {saved} and {r.exit}"
        if saved is not None
        else f"{r.exit} without a stopped event (the client's SIGTERM handler did not run)"
    )
    evidence = (
        f"SIGTERM at step {r.fault_step}: {how}, resumed from step {r.resume_step} in "
        f"{_took(r)} ({r.lost_steps} steps redone); {same}{tail}"
    )
    return {
        **base,
        "ok": ok,
        "evidence": evidence,
        "lost_steps": r.lost_steps,
        "recovery_s": r.recovery_s,
    }


def _decide_again(record: RunRecord) -> str:
    """The drill run's verdict once its drill events exist (it was decided at close before)."""
    from acceptrun.verdict.decide import compute_verdict

    verdict = compute_verdict(record)
    label = "accepted" if verdict.accepted else "rejected"
    record.write_json("verdict.json", {**stamp(), **verdict.to_dict()})
    record.update_state(verdict=label)  # also refreshes the index
    record.event("verdict", sync=True, verdict=label, after="drill")
    return label


def format_drill(report: DrillReport) -> str:
    """The short terminal report."""
    lines = [
        f"operations drill {'PASSED' if report.ok else 'FAILED'}"
        f"{' (kill only)' if any(d.get('skipped') for d in report.drills) else ''}: {report.spec}",
        f"  reference {report.reference_run}: {report.steps} steps, checkpoints at "
        f"{', '.join(map(str, report.checkpoints[:6]))}{' ...' if len(report.checkpoints) > 6 else ''}, "
        f"start-up {report.startup_s:.2f} s",
        f"  drill run {report.drill_run}: {', '.join(report.faults)}",
    ]
    for d in report.drills:
        mark = "skip" if d.get("skipped") else "ok  " if d["ok"] else "FAIL"
        lines.append(f"  {d['drill']:<8} {mark} {d['evidence']}")
    recoveries = [r.recovery_s for r in report.restarts if r.recovery_s is not None]
    if recoveries:
        lines.append(
            f"  recovery (exit to next start, plus start-up beyond the reference's): median "
            f"{statistics.median(recoveries):.2f} s"
        )
    lines += [f"  warning: {w}" for w in report.warnings]
    lines.append(f"  record: drill.json and drill events in run {report.drill_run}")
    return "\n".join(lines)
