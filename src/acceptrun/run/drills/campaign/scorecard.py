"""The campaign's scorecard: per kind and in all, as JSON (campaign.json, ``--json``) or text.

A campaign passes (``ok``) when it tried at least one kind, named every kind it tried
right, and every run that finished ended where the reference did (``final_state``
``bitwise`` or ``within_tolerance``). Kinds not tried are listed with the reason and
neither pass nor fail: the scorecard shows how much of the registry was covered.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from acceptrun.record.workspace import now_iso
from acceptrun.run.drills.campaign.score import (
    BITWISE,
    DIFFERS,
    NOT_COMPARABLE,
    WITHIN,
    KindResult,
)

__all__ = ["CampaignReport", "format_scorecard", "overall_state", "summary"]

FORMAT = "acceptrun.campaign/1"


def overall_state(results: list[KindResult]) -> str:
    """The campaign's final state: differs if any run does, else the weakest equality."""
    states = [r.final_state for r in results if r.tried and r.final_state != NOT_COMPARABLE]
    if not states:
        return NOT_COMPARABLE
    if DIFFERS in states:
        return DIFFERS
    return WITHIN if WITHIN in states else BITWISE


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def summary(results: list[KindResult], reference_compute_s: float = 0.0) -> dict[str, Any]:
    """The figures in all: detection median and max, lost steps, recovery, compute lost."""
    tried = [r for r in results if r.tried]
    detect = [r.detect_s for r in tried if r.detect_s is not None]
    recover = [r.recover_s for r in tried if r.recover_s is not None]
    compute = reference_compute_s + sum(r.compute_s for r in tried)
    lost = sum(r.lost_s for r in tried)
    return {
        "detect_s_median": _median(detect),
        "detect_s_max": round(max(detect), 3) if detect else None,
        "lost_steps": sum(r.lost_steps or 0 for r in tried),
        "recover_s_median": _median(recover),
        "compute_s": round(compute, 3),
        "lost_s": round(lost, 3),
        "lost_share": round(lost / compute, 4) if compute > 0 else None,
    }


@dataclass(slots=True)
class CampaignReport:
    """Everything the campaign found; ``to_dict()`` is campaign.json, the certificate."""

    spec: str
    spec_hash: str
    source: str
    reference_run: str
    reference_compute_s: float
    tolerance: float
    kinds: list[KindResult]
    provenance: dict[str, Any] = field(default_factory=dict)
    verdict: str | None = None

    @property
    def tried(self) -> int:
        return sum(1 for r in self.kinds if r.tried)

    @property
    def named_right(self) -> int:
        return sum(1 for r in self.kinds if r.tried and r.named_right)

    @property
    def final_state(self) -> str:
        return overall_state(self.kinds)

    @property
    def ok(self) -> bool:
        return self.tried > 0 and self.named_right == self.tried and self.final_state != DIFFERS

    def evidence(self) -> str:
        """One sentence for the drill event and the verdict."""
        wrong = [r.kind for r in self.kinds if r.tried and not r.named_right]
        text = (
            f"{self.tried} of {len(self.kinds)} fault kinds tried, {self.named_right} named "
            f"right; final state {self.final_state}"
        )
        if wrong:
            text += f"; named wrong: {', '.join(wrong)}"
        return text + f" (campaign.json in run {self.reference_run})"

    def to_json(self) -> dict[str, Any]:
        """``--json``: the scorecard as one object."""
        return {
            "kinds": [
                {
                    "kind": r.kind,
                    "family": r.family,
                    "tried": r.tried,
                    "named_right": r.named_right,
                    "detect_s": r.detect_s,
                    "lost_steps": r.lost_steps,
                    "recover_s": r.recover_s,
                    "final_state": r.final_state,
                    "why_not_tried": r.why_not_tried,
                }
                for r in self.kinds
            ],
            "tried": self.tried,
            "named_right": self.named_right,
            "final_state": self.final_state,
            "ok": self.ok,
            "spec_hash": self.spec_hash,
            "reference_run": self.reference_run,
            "summary": summary(self.kinds, self.reference_compute_s),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "ok": self.ok,
            "spec": self.spec,
            "spec_hash": self.spec_hash,
            "campaign": self.source,
            "reference_run": self.reference_run,
            "provenance": self.provenance,
            "tolerance": self.tolerance,
            "tried": self.tried,
            "named_right": self.named_right,
            "final_state": self.final_state,
            "summary": summary(self.kinds, self.reference_compute_s),
            "kinds": [r.to_dict() for r in self.kinds],
            "verdict": self.verdict,
            "at": now_iso(),
        }


def _num(x: float | int | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:.2f}{unit}" if isinstance(x, float) else f"{x}{unit}"


def format_scorecard(report: CampaignReport) -> str:
    """The readable table: one line per kind, then the totals."""
    lines = [
        f"resilience campaign {'PASSED' if report.ok else 'FAILED'}: {report.spec}",
        f"  reference run {report.reference_run}; {report.source}",
        f"  {'kind':<19} {'family':<12} {'tried':<6} {'named':<6} {'said':<22} "
        f"{'detect':>7} {'lost':>5} {'recover':>8}  final",
    ]
    for r in report.kinds:
        if not r.tried:
            lines.append(f"  {r.kind:<19} {r.family:<12} {'no':<6} {'-':<6} {r.why_not_tried}")
            continue
        said = r.said or {}
        what = f"{said.get('class')}/{said.get('action')}"
        lines.append(
            f"  {r.kind:<19} {r.family:<12} {'yes':<6} {'yes' if r.named_right else 'NO':<6} "
            f"{what:<22} {_num(r.detect_s, 's'):>7} {_num(r.lost_steps):>5} "
            f"{_num(r.recover_s, 's'):>8}  {r.final_state}"
        )
        if not r.named_right and r.expected is not None:
            exp = r.expected
            lines.append(
                f"  {'':<19} expected {exp['class']}/{exp['whose']}/{exp['action']}, acceptrun "
                f"said {said.get('class')}/{said.get('whose')}/{said.get('action')}"
                f"{'' if said.get('quarantined') or not exp.get('quarantine') else ', no quarantine'}"
            )
    s = summary(report.kinds, report.reference_compute_s)
    share = "-" if s["lost_share"] is None else f"{100 * s['lost_share']:.1f}%"
    lines += [
        f"  tried {report.tried} of {len(report.kinds)}, named right {report.named_right}; "
        f"final state {report.final_state}",
        f"  detection median {_num(s['detect_s_median'], 's')}, max {_num(s['detect_s_max'], 's')}; "
        f"lost steps {s['lost_steps']}; recovery median {_num(s['recover_s_median'], 's')}; "
        f"compute lost {share} of {s['compute_s']:.1f}s",
        f"  record: campaign.json and a drill event in run {report.reference_run}",
    ]
    return "\n".join(lines)
