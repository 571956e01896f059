"""``acceptrun drill --campaign``: the spec uninterrupted, then once per fault kind, scored.

1. **Reference**: the spec runs once uninterrupted; its steps and checkpoints place the
   faults (:func:`~.plan.default_step`), its trajectory is the final state to match.
2. **Each kind**: a kind that cannot be tried here (:meth:`~.kinds.FaultKind.why_not_tried`)
   is recorded as not tried with the reason. Every other kind runs the spec once more, as
   written, with its fault injected for real (``--inject``), and is scored from that run's
   record (:func:`~.score.score_kind`).
3. **The certificate**: campaign.json in the reference run's record (the scorecard, the
   spec hash, the provenance hashes), a ``drill`` event ``{"drill": "campaign"}`` that the
   verdict reads (``acceptance.drills = ["campaign"]``), and the reference's verdict
   decided again.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun.errors import UserError
from acceptrun.record.models import stamp
from acceptrun.record.workspace import RunRecord
from acceptrun.run.drills.campaign.kinds import Reference
from acceptrun.run.drills.campaign.outside import run_outside
from acceptrun.run.drills.campaign.plan import Campaign, default_campaign, default_step
from acceptrun.run.drills.campaign.score import KindResult, not_tried, score_kind, score_outside
from acceptrun.run.drills.campaign.scorecard import CampaignReport
from acceptrun.run.drills.campaign.scratch import scratch_spec
from acceptrun.run.drills.operations import startup_seconds
from acceptrun.spec.model import load_spec

__all__ = ["run_campaign"]

_log = get_logger(__name__)


def run_campaign(
    spec_path: str | Path,
    campaign: Campaign | None = None,
    *,
    workspace: str | Path | None = None,
    tolerance: float = 0.0,
    echo: bool = False,
) -> CampaignReport:
    """Run the campaign on ``spec_path``; record the certificate and return the scorecard.

    Raises :class:`~acceptrun.errors.UserError` when the spec cannot be drilled (a black
    box without watched checkpoints, a failed reference run, no checkpoint before the last step, a bad tolerance).
    """
    from acceptrun.run.launch import launch

    campaign = campaign or default_campaign()
    spec, client = _check_campaignable(spec_path, tolerance)
    # A script's own checkpoint, left in its directory by the run before, is moved into
    # that run's record: each run of the campaign starts from scratch, as the first did.
    existing = "move" if spec.checkpoint.watch else None
    _log.info(f"campaign: reference run of {spec_path}, uninterrupted")
    a = launch(spec_path, workspace=workspace, echo=echo, existing=existing)
    ref_rec = a.record
    ref = _reference(a)
    startup = startup_seconds(ref_rec) or 0.0
    results: list[KindResult] = []
    for i, kind in enumerate(campaign.kinds, 1):
        step = campaign.step_for(kind, default_step(ref.checkpoints, kind.nth_checkpoint))
        why = kind.why_not_tried(spec, ref, client)
        if why is None and step >= ref.steps[-1]:
            why = f"step {step} is not before the reference run's last step {ref.steps[-1]}"
        if why is not None:
            results.append(not_tried(kind, why))
            continue
        expect = kind.expect(spec)
        if kind.outside:
            _log.info(f"campaign {i}/{len(campaign.kinds)}: {kind.name} after step {step}")
            ws = ref_rec.path.parent.parent  # the workspace the reference ran in
            hang = spec.limits.hang_window
            out = run_outside(kind.name, spec_path, ws, step,
                              None if hang is None else float(hang), existing)  # fmt: skip
            results.append(score_outside(kind, expect, out, ref_rec, tolerance))
            continue
        fault = kind.injection(step)
        _log.info(f"campaign {i}/{len(campaign.kinds)}: {kind.name} ({fault})")
        ws = ref_rec.path.parent.parent
        # A kind that changes the run's inputs runs on a copy of them (campaign/scratch.py).
        with (
            scratch_spec(kind.name, spec_path, ws) if kind.scratch else nullcontext(spec_path) as p
        ):
            b = launch(p, workspace=ws, echo=echo, inject=[fault], existing=existing)
        results.append(score_kind(kind, expect, fault, ref_rec, b.record, startup, tolerance))
    report = CampaignReport(
        spec=str(Path(spec_path).resolve()),
        spec_hash=a.spec.hash,
        source=campaign.source,
        reference_run=ref_rec.run_id,
        reference_compute_s=_compute_s(ref_rec),
        tolerance=tolerance,
        kinds=results,
        provenance=_provenance(ref_rec),
    )
    _record_certificate(ref_rec, report)
    return report


def _check_campaignable(spec_path: str | Path, tolerance: float) -> tuple[Any, bool]:
    """The spec, and whether its script uses the client API (False: a black box).

    A black box is drilled with the kinds the supervisor or the campaign fire from outside
    (:attr:`~.kinds.FaultKind.black_box`); its checkpoints must be watched, or no fault
    could land after one.
    """
    if tolerance < 0 or not math.isfinite(tolerance):
        raise UserError(f"--tolerance {tolerance}: expected 0 (bitwise) or a small positive number")
    from acceptrun.workload.usage import detect_usage

    spec = load_spec(spec_path)
    usage = detect_usage(spec)
    if not usage.client and not spec.checkpoint.watch:
        raise UserError(
            f"{spec_path}: {usage.reason} and [checkpoint] watch is not set: the campaign "
            "places its faults after a checkpoint. Name the script's own checkpoint files in "
            '[checkpoint] watch (e.g. watch = ["out/ckpt.pt"], docs/own-script.md), or use the '
            "client API (acceptrun.init(), run.maybe_checkpoint)"
        )
    return spec, bool(usage.client)


def _reference(a: Any) -> Reference:
    """The reference run's steps and checkpoints, refusing a run the campaign cannot use."""
    rec = a.record
    if a.supervision is None or not a.supervision.succeeded:
        raise UserError(
            f"the reference run {rec.run_id} did not finish; the campaign needs a spec that "
            f"succeeds on its own: fix it first (acceptrun show {rec.run_id})"
        )
    steps = sorted({e["step"] for e in rec.events("step") if isinstance(e.get("step"), int)})
    checkpoints = sorted(
        {e["step"] for e in rec.events("checkpoint_commit") if isinstance(e.get("step"), int)}
    )
    if not steps or not checkpoints or checkpoints[0] >= steps[-1]:
        raise UserError(
            f"the reference run {rec.run_id} logged {len(steps)} steps and committed "
            f"{len(checkpoints)} checkpoints, none before its last step: the campaign places "
            "its faults after a checkpoint; set [checkpoint] every_steps so that one lands "
            "early (run.maybe_checkpoint(step) in the loop)"
        )
    return Reference(steps, checkpoints)


def _compute_s(rec: RunRecord) -> float:
    return round(sum(float(e.get("duration_s") or 0) for e in rec.events("attempt_exit")), 3)


def _provenance(rec: RunRecord) -> dict[str, Any]:
    """The environment the certificate holds for: the provenance's hashes, by part."""
    prov = rec.read_json("provenance.json", default={}) or {}
    hashes = prov.get("hashes") if isinstance(prov, dict) else None
    return {"run": rec.run_id, "hashes": hashes if isinstance(hashes, dict) else {}}


def _record_certificate(rec: RunRecord, report: CampaignReport) -> None:
    """campaign.json, the drill event and the reference run's verdict decided again."""
    from acceptrun.verdict.decide import compute_verdict

    rec.write_json("campaign.json", report.to_dict())
    rec.event(
        "drill",
        sync=True,
        drill="campaign",
        ok=report.ok,
        evidence=report.evidence(),
        spec_hash=report.spec_hash,
        reference_run=report.reference_run,
        tried=report.tried,
        named_right=report.named_right,
        final_state=report.final_state,
    )
    rec.update_state(drill={"of": "campaign", "reference_run": rec.run_id, "ok": report.ok})
    verdict = compute_verdict(rec)
    label = "accepted" if verdict.accepted else "rejected"
    rec.write_json("verdict.json", {**stamp(), **verdict.to_dict()})
    rec.update_state(verdict=label)
    rec.event("verdict", sync=True, verdict=label, after="drill")
    report.verdict = label
    _report_again(rec)


def _report_again(rec: RunRecord) -> None:
    """report.html with the campaign's section; a failure is recorded, never the campaign's."""
    from acceptrun.report.html import write_report

    try:
        write_report(rec)
    except Exception as exc:  # recorded: the certificate is written; `acceptrun report` redoes it
        rec.event("best_effort_failed", sync=True, component="report",
                  error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        _log.warning(f"campaign: report.html of run {rec.run_id} not rewritten: {exc}")
