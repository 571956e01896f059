"""Group 1, launch and setup: provenance, the preflight checks, time to the first step.

Also the spec keys that had no effect (``spec_warning`` events), for information.
"""

from __future__ import annotations

from acceptrun.record.view import run_timeline
from acceptrun.spec.model import format_duration
from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput

__all__ = ["PREFLIGHT_FIX", "first_step", "preflight", "provenance", "spec_warnings"]

PREFLIGHT_FIX = {
    "expectations": "install the expected versions, or change [expect] if the new ones are intended",
    "resources": "run on a machine that has the GPUs in [resources], or change [resources]",
    "storage": "free space or fix permissions in the run and checkpoint directories",
    "device": "check the GPU (nvidia-smi, driver logs) or move to another machine",
    "data": "restore the data, or refresh the manifest with `acceptrun data snapshot` if the change is intended",
    "watched files": 'move the file aside, or set checkpoint.existing = "move" or "start"',
    "backend": "install the launcher the spec's processes need, or set resources.processes = 1",
    "dependencies": "install what the check names where it names it (the extra of acceptrun)",
}

# Every preflight check is a setup check, but these, which have checks of their own
# ("data" in the data group, "provenance" above): one added to preflight tomorrow reaches
# the verdict without a word here.
_NOT_SETUP = ("data", "provenance")


def provenance(given: CheckInput) -> list[Check]:
    """provenance.json exists; the parts it could not capture are named."""
    prov = given.record.read_json("provenance.json")
    if prov is None:
        return [Check("setup", "provenance", NOT_RECORDED, True, "no provenance.json",
                      "run through `acceptrun run` or `acceptrun.init()`")]  # fmt: skip
    absent = sorted(k for k, v in prov.items() if isinstance(v, dict) and v.get("absent"))
    note = f"; absent: {', '.join(absent)}" if absent else ""
    return [Check("setup", "provenance", PASS, True, f"environment recorded{note}")]


def preflight(given: CheckInput) -> list[Check]:
    """Every check of preflight.json but data and provenance (expectations, resources,
    storage, device, backend, watched files, ...)."""
    if given.standalone:
        return [Check("setup", "expectations", NOT_RECORDED, False,
                      "standalone run: no spec, no preflight")]  # fmt: skip
    pre = given.record.read_json("preflight.json")
    if pre is None:
        return [Check("setup", "expectations", NOT_RECORDED, True, "no preflight.json",
                      "run through `acceptrun run SPEC`")]  # fmt: skip
    out = []
    for c in pre.get("checks", []):
        if c["name"] not in _NOT_SETUP:
            own = (c.get("details") or {}).get("fix")  # a check's own fix, where it has one
            fix = (
                None if c["ok"] else (own if isinstance(own, str) else PREFLIGHT_FIX.get(c["name"]))
            )
            out.append(
                Check("setup", c["name"], PASS if c["ok"] else FAIL, True, c["message"], fix)
            )
    return out


def first_step(given: CheckInput) -> list[Check]:
    """Launch (run_start: preflight included) to the first step, against max_first_step.

    Without the summary's figure (no run_start event, or a summary that failed) the time
    is read from the events, since the first attempt's start.
    """
    limit = given.spec.acceptance.max_first_step
    summary = given.summary
    seconds = None if summary is None else summary.first_step_s
    since = "launch"
    if seconds is None:
        tl = run_timeline(given.record)
        if tl["first_step"] is not None and tl["launch"] is not None:
            seconds, since = tl["first_step"] - tl["launch"], "its start"
    failure = given.summary_failure
    if seconds is None:
        return [Check("setup", "first step", NOT_RECORDED, limit is not None,
                      failure or "no step events",
                      "log steps with run.steps() / run.log()")]  # fmt: skip
    evidence = f"attempt 1's first step {format_duration(seconds)} after {since}"
    if limit is None:
        return [Check("setup", "first step", PASS, False, _noting(evidence, failure))]
    ok = seconds <= limit
    evidence += f", at most {format_duration(limit)}"
    fix = None if ok else (
        "find the slow part of the start in preflight.json and the report's time breakdown "
        "(data verification, imports, restore), or raise acceptance.max_first_step"
    )  # fmt: skip
    return [
        Check("setup", "first step", PASS if ok else FAIL, True, _noting(evidence, failure), fix)
    ]


def _noting(evidence: str, failure: str | None) -> str:
    return evidence if failure is None else f"{evidence} ({failure})"


def spec_warnings(given: CheckInput) -> list[Check]:
    """The spec keys that had no effect on this run (information, never required)."""
    return [
        Check("setup", f"spec {ev.get('key')}", NOT_RECORDED, False,
              f"{ev.get('message')}; {ev.get('fix')}")
        for ev in given.record.events("spec_warning")
    ]  # fmt: skip
