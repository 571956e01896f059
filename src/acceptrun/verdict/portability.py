"""Portability: what ties a spec or a run to one provider or one machine, and how to move it.

``acceptrun portability RUN|SPEC`` lists each finding with where it is (a field path such
as ``command[1]`` or ``env.DATA_DIR``), why it ties the run down, and the one step that
moves it. A spec file is read as written (a relative path travels with the spec, an
absolute one does not); a run is read from its frozen spec and provenance, where paths
under the code's checkout (the git root) travel with the code.

Severity:

- ``blocker``: the run cannot be repeated elsewhere from its record as it stands: the
  command's own script is neither committed nor in ``git.diff`` (untracked), or the
  recorded ``git.diff`` is missing or does not match its hash. The verdict's exit test
  fails on a blocker.
- ``warning``: tied to this provider or machine (a provider mount, an absolute path, a
  provider-only tool, local data with no copy elsewhere, data inside the repository that
  git ignores, a spec or data manifest that is not committed, no git remote); one step
  moves it.
- ``note``: worth knowing when moving (a pinned GPU model, a bucket in one region, a
  CUDA build of torch); nothing to do to repeat it on a like machine.

A run is checked once, as it closes (:func:`write_portability`, called by run/close.py
before the verdict): ``portability.json`` in the record holds what was found then, and
the verdict's exit check and every view of the closed run read it
(:func:`recorded_portability`), never the checkout as it is later.

>>> report = check_spec_file("spec.toml")
>>> print(format_portability(report))

The rules applied to a spec's own values are :mod:`acceptrun.verdict.portability_rules`;
what a clone of the code lacks, and a run's code, :mod:`acceptrun.verdict.portability_git`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun.errors import RecordError
from acceptrun.record.models import stamp
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import load_spec
from acceptrun.verdict.portability_git import (
    build_findings,
    checkout_of,
    code_findings,
    committed_findings,
    git_data_findings,
    git_state,
    recorded_states,
    state_of,
)
from acceptrun.verdict.portability_rules import BLOCKER, NOTE, WARNING, Finding, check_spec

__all__ = [
    "PORTABILITY_FILE",
    "PortabilityReport",
    "check_run",
    "check_spec_file",
    "format_portability",
    "portability_of",
    "recorded_portability",
    "write_portability",
]

PORTABILITY_FILE = "portability.json"  # the findings as the run closed (write_portability)

_ORDER = {BLOCKER: 0, WARNING: 1, NOTE: 2}


@dataclass(slots=True)
class PortabilityReport:
    """All findings for a spec file or a run, blockers first."""

    subject: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == BLOCKER]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PortabilityReport:
        """The report :meth:`to_dict` wrote (``portability.json``)."""
        findings = [Finding(**{k: str(f[k]) for k in _FINDING_KEYS}) for f in data["findings"]]
        return cls(str(data["subject"]), findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "blockers": len(self.blockers),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.findings],
        }


_FINDING_KEYS = ("severity", "kind", "where", "value", "why", "fix")


# ---- entry points --------------------------------------------------------------------------


def write_portability(record: RunRecord) -> PortabilityReport:
    """Check the run as it closes and write ``portability.json``: what its views read."""
    report = check_run(record)
    record.write_json(PORTABILITY_FILE, {**stamp(), **report.to_dict()})
    return report


def recorded_portability(record: RunRecord) -> PortabilityReport | None:
    """The findings written as the run closed; None when it has no portability.json
    (a run still going, or one closed by an older release)."""
    data = record.read_json(PORTABILITY_FILE)
    if data is None:
        return None
    try:
        return PortabilityReport.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise RecordError(
            f"{record.file(PORTABILITY_FILE)} is damaged ({type(exc).__name__}: {exc}); "
            f"`acceptrun portability {record.run_id}` checks the run again"
        ) from None


def portability_of(record: RunRecord) -> PortabilityReport:
    """The findings written at close when there are some, else checked now."""
    return recorded_portability(record) or check_run(record)


def check_spec_file(path: str | Path) -> PortabilityReport:
    """Findings for a spec file, its values read as written (relative paths travel).

    In a git checkout, also what a clone would lack: the spec itself or its data
    manifest not committed, data inside the repository that git ignores.
    """
    spec = load_spec(path)
    findings = check_spec(spec, home=None)
    root = checkout_of(Path(path).resolve().parent)
    if root is not None:
        findings += committed_findings("spec", str(path), git_state(path, root))
        findings += git_data_findings(spec, root, None)
    return PortabilityReport(str(path), _sorted(findings))


def check_run(record: RunRecord) -> PortabilityReport:
    """Findings for a run: its frozen spec, plus its code as provenance recorded it."""
    spec = record.spec
    prov = record.read_json("provenance.json") or {}
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    home: Path | None = None
    if git and not git.get("absent") and git.get("root"):
        home = Path(str(git["root"]))
    else:
        source = record.state.get("spec_source")
        home = Path(str(source)).parent if source else spec.workdir_path
    findings = check_spec(spec, home=home)
    findings += code_findings(record, spec, git or {})
    findings += build_findings(prov)
    if git and not git.get("absent") and git.get("root"):
        root = Path(str(git["root"]))
        at_run = recorded_states(record, root)
        source = record.state.get("spec_source")
        if source:
            findings += committed_findings("spec", str(source), state_of(source, root, at_run))
        findings += git_data_findings(spec, root, at_run)
    return PortabilityReport(record.run_id, _sorted(findings))


def _sorted(findings: list[Finding]) -> list[Finding]:
    unique = list(dict.fromkeys(findings))
    return sorted(unique, key=lambda f: (_ORDER.get(f.severity, 3), f.where))


# ---- output ----------------------------------------------------------------------------------


def format_portability(report: PortabilityReport) -> str:
    """One block per finding: severity, where, value, why, and the step that moves it."""
    if not report.findings:
        return f"{report.subject}: nothing ties it to one provider or machine"
    counts = ", ".join(
        f"{n} {label}{'s' if n != 1 else ''}"
        for label, n in (
            (BLOCKER, len(report.blockers)),
            (WARNING, len(report.warnings)),
            (NOTE, len(report.findings) - len(report.blockers) - len(report.warnings)),
        )
        if n
    )
    lines = [f"{report.subject}: {counts}"]
    for f in report.findings:
        lines.append(f"  {f.severity:<7} {f.where}: {f.value}")
        lines.append(f"          {f.why}")
        lines.append(f"          move it: {f.fix}")
    return "\n".join(lines)
