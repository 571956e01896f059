"""Score one kind: what acceptrun said about the fault, read back from the run's record.

The record's events are the only source: the ``fault_injected`` event (the ground truth's
when and where), the first ``attempt_exit`` that is not a success (the class, the work it
lost), ``restart``, ``rollback`` and ``checkpoint_quarantine`` (the action), and the
trajectory, compared with the reference run's
(:func:`acceptrun.run.drills.operations.compare_runs`).

- ``named_right``: the class, whose failure it is (:data:`RESPONSIBILITY` of the class)
  and the action all match the kind's ground truth (:class:`~.kinds.Expect`), and a
  damaged checkpoint was quarantined where that is expected. A fault that never fired is
  never named right.
- ``detect_s``: the fault's event to the attempt's recorded exit (seconds, the
  supervisor's clock): noticing the death, or the hang window for a hang.
- ``lost_steps``: the steps done again: the last step logged minus the step the next
  attempt resumed from (an older checkpoint's when the newest was quarantined); for a
  run that stopped, the exit's ``work.steps_lost``.
- ``recover_s``: the exit to the next attempt's first step, beyond the reference's own
  start-up (:func:`~acceptrun.run.drills.operations.measure_restarts`).
- ``final_state``: ``bitwise`` or ``within_tolerance`` (the run finished where the
  reference did), ``differs``, or ``not_comparable`` with why (the run stopped).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from acceptrun.record.status import RESPONSIBILITY, FailureClass
from acceptrun.record.view import RecordView
from acceptrun.record.workspace import RunRecord
from acceptrun.run.drills.campaign.kinds import Expect, FaultKind
from acceptrun.run.drills.operations import compare_runs, measure_restarts

__all__ = [
    "BITWISE",
    "DIFFERS",
    "NOT_COMPARABLE",
    "WITHIN",
    "KindResult",
    "not_tried",
    "score_kind",
]

BITWISE, WITHIN, DIFFERS, NOT_COMPARABLE = (
    "bitwise",
    "within_tolerance",
    "differs",
    "not_comparable",
)


@dataclass(slots=True)
class KindResult:
    """One kind's line of the scorecard; ``to_dict()`` is its entry in campaign.json."""

    kind: str
    family: str
    tried: bool
    why_not_tried: str | None = None
    fault: str | None = None
    run: str | None = None
    truth: dict[str, Any] | None = None
    expected: dict[str, Any] | None = None
    said: dict[str, Any] | None = None
    named_right: bool = False
    detect_s: float | None = None
    lost_steps: int | None = None
    recover_s: float | None = None
    final_state: str = NOT_COMPARABLE
    final_state_why: str | None = None
    compute_s: float = 0.0
    lost_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def not_tried(kind: FaultKind, why: str) -> KindResult:
    """A kind the campaign could not inject here: counted as not tried, never as passed."""
    return KindResult(kind.name, kind.family, tried=False, why_not_tried=why,
                      final_state_why="not tried")  # fmt: skip


def whose(klass: str | None) -> str | None:
    """Whose failure acceptrun says a class is (the party it would blame for real)."""
    try:
        return RESPONSIBILITY[FailureClass(str(klass))].value
    except ValueError:
        return None


def score_kind(
    kind: FaultKind,
    expect: Expect,
    fault: str,
    ref: RunRecord,
    rec: RunRecord,
    startup_s: float,
    tolerance: float,
) -> KindResult:
    """Read what acceptrun said about ``fault`` in ``rec`` and score it against ``expect``."""
    events = RecordView(rec).all_events
    fired = next((e for e in events if e["kind"] == "fault_injected"), None)
    exits = [e for e in events if e["kind"] == "attempt_exit"]
    failed = next((e for e in exits if e.get("class") != "success"), None)
    if expect.refused:  # the fault's own kill first, then the restart that refused to start
        failed = next((e for e in reversed(exits) if e.get("class") != "success"), None)
        # A fault the supervisor fired in that attempt (rdzv) is the one scored.
        later = [e for e in events if e["kind"] == "fault_injected" and failed is not None
                 and e.get("attempt") == failed.get("attempt")]  # fmt: skip
        fired = later[0] if later else fired
    said = _said(events, failed)
    result = KindResult(
        kind.name, kind.family, tried=True, fault=fault, run=rec.run_id,
        expected={"class": expect.klass, "whose": expect.whose, "action": expect.action,
                  "quarantine": expect.quarantine},
        said=said,
        compute_s=round(sum(float(e.get("duration_s") or 0) for e in exits), 3),
        lost_s=round(sum(float((e.get("work") or {}).get("seconds_lost") or 0) for e in exits), 3),
    )  # fmt: skip
    if fired is None:
        result.truth = {"what": kind.what, "fired": False}
        result.final_state_why = "the fault never fired: nothing was injected"
        return result
    result.truth = {
        "what": kind.what,
        "fired": True,
        "step": fired.get("seen_step", fired.get("step")),
        "attempt": fired.get("attempt"),
        "where": fired.get("target") or "the workload's process",
        "t": fired["t"],
    }
    result.named_right = (
        said["class"] == expect.klass
        and said["whose"] == expect.whose
        and said["action"] == expect.action
        and (said["quarantined"] or not expect.quarantine)
    )
    if expect.slow_save_s is not None:
        result.named_right &= _slow_save(said, events, float(fired["t"]), expect.slow_save_s)
    if expect.mirror_outage:
        result.named_right &= _mirror_caught_up(said, events, float(fired["t"]))
    if failed is not None:
        result.detect_s = round(max(0.0, float(failed["t"]) - float(fired["t"])), 3)
        result.lost_steps = (failed.get("work") or {}).get("steps_lost")
        restart = next(
            (r for r in measure_restarts(rec, startup_s) if r.attempt == failed["attempt"]), None
        )
        result.recover_s = None if restart is None else restart.recovery_s
        if restart is not None and restart.lost_steps is not None:
            # From the step really resumed: an older one when the newest was quarantined.
            result.lost_steps = restart.lost_steps
    _final_state(result, ref, rec, exits, tolerance)
    return result


def _slow_save(
    said: dict[str, Any], events: list[dict[str, Any]], fired_t: float, want_s: float
) -> bool:
    """Whether the record shows the slowed write: a commit after the fault as slow as it.

    ``save_s``: the slowest commit's begin-to-commit seconds after the fault; ``stall_s``:
    the most the loop waited in one save for it (``checkpoint_stage``).
    """
    after = [e for e in events if float(e.get("t") or 0) >= fired_t]
    saves = [float(e.get("seconds") or 0) for e in after if e["kind"] == "checkpoint_commit"]
    stalls = [float(e.get("stall_s") or 0) for e in after if e["kind"] == "checkpoint_stage"]
    said["save_s"] = round(max(saves, default=0.0), 3)
    said["stall_s"] = round(max(stalls, default=0.0), 3)
    return bool(said["save_s"] >= want_s)


def _mirror_caught_up(said: dict[str, Any], events: list[dict[str, Any]], fired_t: float) -> bool:
    """Whether the record names the outage (failed uploads) and then the catch-up: the
    newest committed checkpoint mirrored after the last failure."""
    after = [e for e in events if float(e.get("t") or 0) >= fired_t]
    failed = [e for e in after if e["kind"] == "mirror_failed"]
    commits = [e["step"] for e in events if e["kind"] == "checkpoint_commit"]
    last_fail = max((float(e["t"]) for e in failed), default=fired_t)
    ok = {e.get("step") for e in after if e["kind"] == "mirror_ok" and float(e["t"]) > last_fail}
    said["mirror_failed"] = len(failed)
    said["mirror_reason"] = failed[0].get("reason") if failed else None
    said["mirror_caught_up"] = bool(commits) and max(commits) in ok
    return bool(failed) and bool(said["mirror_caught_up"])


def _said(events: list[dict[str, Any]], failed: dict[str, Any] | None) -> dict[str, Any]:
    """The class, whose, action acceptrun recorded for the first failed attempt."""
    if failed is None:
        return {"class": "success", "whose": "none", "action": "none",
                "quarantined": False, "reason": "no attempt failed"}  # fmt: skip
    nxt = int(failed["attempt"]) + 1
    if any(e["kind"] == "rollback" for e in events):
        action = "rollback"
    elif any(e["kind"] == "restart" and e.get("attempt") == nxt for e in events):
        action = "restart"
    else:
        action = "stop"
    return {
        "class": failed.get("class"),
        "whose": whose(failed.get("class")),
        "action": action,
        "quarantined": any(e["kind"] == "checkpoint_quarantine" for e in events),
        "reason": failed.get("class_reason") or failed.get("reason"),
    }


def _final_state(
    result: KindResult,
    ref: RunRecord,
    rec: RunRecord,
    exits: list[dict[str, Any]],
    tolerance: float,
) -> None:
    """Compare the run's end with the reference's; a run that stopped is not comparable."""
    if not exits or exits[-1].get("class") != "success":
        last = exits[-1].get("class") if exits else None
        result.final_state = NOT_COMPARABLE
        result.final_state_why = f"the run stopped (class {last}): it has no final state"
        return
    cmp = compare_runs(ref, rec, tolerance)
    if cmp["equal"]:
        result.final_state = BITWISE if tolerance == 0 else WITHIN
        result.final_state_why = f"{cmp['steps_compared']} steps, outputs and metrics equal"
        return
    result.final_state = DIFFERS
    diff = cmp["first_difference"]
    if diff is not None:
        result.final_state_why = (
            f"loss differs first at step {diff['step']}: {diff['drill']!r} vs {diff['reference']!r}"
        )
    else:
        result.final_state_why = (
            f"missing steps {cmp['missing_steps']}, extra steps {cmp['extra_steps']}, or an "
            "output or metric differs"
        )


def score_outside(
    kind: FaultKind, expect: Expect, out: Any, ref: RunRecord, tolerance: float
) -> KindResult:
    """Score a fault the campaign fired at the supervisor (:mod:`.outside`).

    A killed supervisor leaves no ``attempt_exit`` event: acceptrun's word is the attempt's
    exit.json (``outcome: interrupted``, written by ``acceptrun resume``) and the resume's
    ``audit`` event. ``detect_s`` is the kill to that resume's take-over (the operator's
    command here, ``acceptrun watch`` in production); ``recover_s`` the take-over to the
    resumed attempt's first step.
    """
    rec: RunRecord = out.record
    view = RecordView(rec)
    events = view.all_events
    exits = [e for e in events if e["kind"] == "attempt_exit"]
    result = KindResult(
        kind.name, kind.family, tried=True, fault=f"{kind.name} after step {out.step}",
        run=rec.run_id,
        truth={"what": kind.what, "fired": True, "step": out.step, "attempt": 1,
               "where": "the supervisor's process", "t": out.fired_t, "paused_s": out.paused_s},
        expected={"class": expect.klass, "whose": expect.whose, "action": expect.action,
                  "quarantine": expect.quarantine},
        compute_s=round(sum(float(e.get("duration_s") or 0) for e in exits), 3),
    )  # fmt: skip
    takeover = next(
        (e for e in events if e["kind"] == "audit" and e.get("action") == "resume"), None
    )
    first = rec.read_json("attempts/1/exit.json", default={}) or {}
    if first.get("outcome") == "interrupted":
        result.said = {
            "class": "interrupted",
            "whose": "unknown",
            "action": "restart" if takeover and takeover.get("interrupted") else "stop",
            "quarantined": False,
            "reason": first.get("reason"),
        }
        work = first.get("work") or {}
        result.lost_steps = work.get("steps_lost")
        result.lost_s = float(work.get("seconds_lost") or 0)
        if takeover is not None:
            result.detect_s = round(max(0.0, float(takeover["t"]) - out.fired_t), 3)
            step = next((e for e in view.steps() if e.get("attempt") == 2), None)
            if step is not None:
                result.recover_s = round(max(0.0, float(step["t"]) - float(takeover["t"])), 3)
    else:
        failed = next((e for e in exits if e.get("class") != "success"), None)
        result.said = _said(events, failed)
        result.lost_s = sum(float((e.get("work") or {}).get("seconds_lost") or 0) for e in exits)
    said = result.said
    result.named_right = (said["class"], said["whose"], said["action"]) == (
        expect.klass, expect.whose, expect.action,
    )  # fmt: skip
    _final_state(result, ref, rec, exits, tolerance)
    return result
