"""The verdict decided: every registered check run over a record, in its group's order.

The registry sits above the checks it lists (:mod:`acceptrun.verdict.checks`), which
import only the types of :mod:`acceptrun.verdict.core`.

::

    v = compute_verdict(RunRecord(".acceptrun/runs/20261130-015953-sumx-0b29"))
    print(format_verdict(v))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from acceptrun.record.workspace import RunRecord, now_iso
from acceptrun.spec.model import RunSpec
from acceptrun.verdict.core import GROUPS, CheckFn, CheckInput, Verdict

if TYPE_CHECKING:
    from acceptrun.telemetry.summary import Summary

__all__ = ["BEFORE_LAUNCH", "compute_verdict", "never_launched", "registered_checks"]


def registered_checks() -> tuple[CheckFn, ...]:
    """Every check function, in the order their checks are listed within a group.

    A check is one function ``(CheckInput) -> list[Check]`` in the module of its group
    (:mod:`acceptrun.verdict.checks`) and one line here. The verdict sorts the checks by
    group, keeping this order inside each group; functions whose checks span groups
    (inference, serving) come last so that they follow each group's own checks.
    """
    from acceptrun.verdict.checks import data, exit, operations, performance, results, setup

    return (
        setup.provenance,
        setup.preflight,
        setup.first_step,
        setup.spec_warnings,
        data.data_verified,
        data.last_checkpoint,
        data.restore_drill,
        data.black_box_checkpoints,
        data.checkpoint_interval,
        operations.exit_status,
        operations.resumed,
        operations.failures,
        operations.restarts,
        operations.preemption_notice,
        operations.recovery,
        operations.drills,
        operations.cleanup,
        operations.injected_faults,
        operations.budget,
        operations.cost,
        operations.black_box_lost_work,
        performance.runtime,
        performance.throughput,
        performance.data_wait,
        performance.idle,
        performance.telemetry,
        performance.black_box_step_time,
        results.metrics,
        results.outputs,
        results.black_box_outputs,
        exit.portability,
        results.inference,
        results.serving,
    )


# The check functions of what happens before launch: all a run refused there is judged on
# (no process ran, so no step, checkpoint, cost or exit check has anything to say).
BEFORE_LAUNCH = frozenset({"provenance", "preflight", "spec_warnings", "data_verified"})


def never_launched(record: RunRecord) -> bool:
    """The run was refused (or stopped) before its workload started: no attempt began."""
    launched = {"attempt_start", "workload_start"}
    refused = {"preflight_failed", "stopped_before_launch"}
    kinds = {str(ev.get("kind")) for ev in record.events(*launched, *refused)}  # no steps read
    if kinds & launched:
        return False
    return bool(kinds & refused) or record.state.get("status") == "failed_preflight"


def compute_verdict(
    record: RunRecord, spec: RunSpec | None = None, *, summary: Summary | None = None
) -> Verdict:
    """Decide a run from its record. ``spec`` defaults to the frozen spec in the record,
    ``summary`` (the telemetry summary close stored) to one the checks compute.

    A run refused before launch shows only the checks that ran (:data:`BEFORE_LAUNCH`).
    """
    given = CheckInput.of(record, spec, summary)
    fns = registered_checks()
    if never_launched(record):
        fns = tuple(fn for fn in fns if fn.__name__ in BEFORE_LAUNCH)
    checks = [c for fn in fns for c in fn(given)]
    order = list(GROUPS)
    checks.sort(key=lambda c: order.index(c.group) if c.group in order else len(order))
    return Verdict(record.run_id, checks, now_iso())
