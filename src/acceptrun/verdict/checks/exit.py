"""Group 5, exit: the run can be repeated elsewhere (portability of the code that ran).

Informational, unless a finding is a blocker (the code that ran cannot be rebuilt from
the record: see :mod:`acceptrun.verdict.portability`).
"""

from __future__ import annotations

from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput

__all__ = ["portability"]

# Warnings named in the evidence; the rest are counted.
_WARNINGS_SHOWN = 4


def portability(given: CheckInput) -> list[Check]:
    """No portability blocker; warnings and notes counted (`acceptrun portability RUN`)."""
    from acceptrun.verdict.portability import portability_of

    try:
        report = portability_of(given.record)  # portability.json, written as the run closes
    except Exception as exc:  # recorded: a verdict is never lost to a failed portability check
        return [Check("exit", "portability", NOT_RECORDED, False,
                      given.record_failure("portability", exc),
                      "read the best_effort_failed event in events.jsonl (its traceback), then "
                      "run `acceptrun portability RUN`")]  # fmt: skip
    blockers, warnings = report.blockers, report.warnings
    if blockers:
        text = "; ".join(f"{f.where}: {f.why}" for f in blockers)
        return [Check("exit", "portability", FAIL, True, text, blockers[0].fix)]
    notes = len(report.findings) - len(warnings)
    evidence = "no blockers"
    if warnings:
        shown = "; ".join(f"{f.where} ({f.kind})" for f in warnings[:_WARNINGS_SHOWN])
        more = (
            f" and {len(warnings) - _WARNINGS_SHOWN} more"
            if len(warnings) > _WARNINGS_SHOWN
            else ""
        )
        evidence += f"; {len(warnings)} warning{'s' if len(warnings) != 1 else ''}: {shown}{more}"
    if notes:
        evidence += f"; {notes} note{'s' if notes != 1 else ''}"
    evidence += " (`acceptrun portability RUN`)"
    return [Check("exit", "portability", PASS, True, evidence)]
