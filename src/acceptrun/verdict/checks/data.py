"""Group 2, data and checkpoints: the data verified, the last checkpoint, its mirror copy.

Also the restore drill (the checkpoint puts back in a fresh process) and, for a script
without the client, what its own checkpoints leave unchecked.
"""

from __future__ import annotations

from acceptrun.record.view import read_attempts
from acceptrun.verdict.checks.operations import drill_check
from acceptrun.verdict.checks.setup import PREFLIGHT_FIX
from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput
from acceptrun.verdict.interval import interval_check

__all__ = [
    "black_box_checkpoints",
    "checkpoint_interval",
    "data_verified",
    "last_checkpoint",
    "restore_drill",
]


def data_verified(given: CheckInput) -> list[Check]:
    """The data check of preflight.json: required when the spec names a data manifest."""
    spec = given.spec
    if not spec.data.path:
        return [Check("data", "data verified", NOT_RECORDED, False, "the spec names no data")]
    required = bool(spec.data.manifest)
    pre = given.record.read_json("preflight.json") or {}
    # Preflight's own, or a restart's that found the data changed (capture/reverify.py).
    checks = [c for c in pre.get("checks", []) if c["name"] == "data"]
    found = next((c for c in reversed(checks) if not c["ok"]), checks[0] if checks else None)
    if found is None:
        return [Check("data", "data verified", NOT_RECORDED, required,
                      "no data check in preflight.json", PREFLIGHT_FIX["data"])]  # fmt: skip
    if not found["details"].get("verified") and found["ok"]:
        return [Check("data", "data verified", NOT_RECORDED, False, found["message"],
                      "add data.manifest to the spec")]  # fmt: skip
    ok = bool(found["ok"])
    fix = found["details"].get("fix") or PREFLIGHT_FIX["data"]
    return [Check("data", "data verified", PASS if ok else FAIL, required, found["message"],
                  None if ok else fix)]  # fmt: skip


def last_checkpoint(given: CheckInput) -> list[Check]:
    """The last checkpoint verifies (re-read and hashed) and, with a mirror, is mirrored."""
    from acceptrun.checkpoint.owner import StoreOwnedError, open_run_store

    record, ck = given.record, given.spec.checkpoint
    configured = ck.every_steps is not None or ck.every is not None
    if given.usage not in (None, "client") and not ck.watch:
        configured = False  # the interval has no effect without the client (a spec warning)
    try:  # the run's own store; another run's steps are never this run's evidence
        store = open_run_store(record, given.spec, retention=False)
    except StoreOwnedError as exc:
        return [Check("data", "last checkpoint", FAIL, configured, str(exc),
                      "give the run a checkpoint store of its own (checkpoint.dir/<run id>/)")]  # fmt: skip
    root = store.root
    latest = store.latest()
    if latest is None:
        if not configured:
            return []
        return [Check("data", "last checkpoint", NOT_RECORDED, True, f"no checkpoint committed in {root}",
                      "call run.restore(...) once and run.maybe_checkpoint(step) every step")]  # fmt: skip
    result = store.verify(latest.step)
    mb = result.checked_bytes / 1e6
    if result.ok:
        out = [Check("data", "last checkpoint", PASS, configured,
                     f"step {latest.step} verified ({len(latest.files)} files, {mb:.1f} MB, {result.seconds:.2f}s)")]  # fmt: skip
    else:
        out = [Check("data", "last checkpoint", FAIL, configured, "; ".join(result.problems),
                     "the run's newest checkpoint is damaged: `acceptrun ckpt verify` names the file")]  # fmt: skip
    if ck.mirror:
        states = (record.read_json("mirror.json") or {}).get("steps", {})
        state = states.get(str(latest.step), {}).get("state", "not recorded")
        ok = state == "ok"
        if ok:
            fix = None
        elif not states:  # no step was ever handed to the mirror
            fix = (
                "nothing was handed to the mirror: save with run.checkpoint() or through "
                "run.checkpoint_store() (a CheckpointStore built by the script is not mirrored)"
            )
        else:
            fix = "the mirror is behind: check its credentials and reachability (mirror.json)"
        out.append(Check("data", "mirror", PASS if ok else FAIL, True,
                         f"step {latest.step} on {ck.mirror}: {state}", fix))  # fmt: skip
    return out


def restore_drill(given: CheckInput) -> list[Check]:
    """A required restore drill (``acceptance.drills``) of a supervised run that ran."""
    if given.standalone or not read_attempts(given.record):
        return []
    return [drill_check(given, d) for d in given.spec.acceptance.drills if d == "restore"]


def black_box_checkpoints(given: CheckInput) -> list[Check]:
    """A script without the client whose checkpoints acceptrun does not know (information)."""
    what = given.black_box
    if what is None or given.spec.checkpoint.watch or "checkpoint_commit" in given.event_kinds():
        return []
    return [Check("data", "checkpoints", NOT_RECORDED, False,
                  f"not checked: {what}'s own checkpoints are unknown to acceptrun, a "
                  "restart starts over; list them in checkpoint.watch (with "
                  "checkpoint.resume_args), or save with run.maybe_checkpoint(step)")]  # fmt: skip


def checkpoint_interval(given: CheckInput) -> list[Check]:
    """The checkpoint interval against the optimum for the run's measured costs.

    Information, unless ``acceptance.min_ettr`` asks for a minimum ETTR; the model and
    where each input comes from: :mod:`acceptrun.verdict.interval`.
    """
    return interval_check(given)
