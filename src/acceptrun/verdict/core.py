"""The verdict: acceptance checks over a run record, each with its evidence.

The verdict only reads the record (frozen spec, preflight.json, attempts, events), so it
can be recomputed at any time with the same answer. A check is ``pass``, ``fail`` or
``not_recorded``; the run is ACCEPTED only when every *required* check passes. A
required check whose evidence is missing is never a pass.

Checks are grouped by the five acceptance tests of docs/architecture.md (``GROUPS``):
setup, data (and checkpoints), performance (and observability), operations and exit,
plus the results the spec asks for (metrics and outputs). Each group's check functions
live in one module of :mod:`acceptrun.verdict.checks`; :mod:`acceptrun.verdict.decide`
lists them all and runs them (``compute_verdict``); this module holds the types they share
(:class:`Check`, :class:`CheckInput`, :class:`Verdict`) and formats the result.
Figures about time (first step, throughput, data wait, idle share) come from
:func:`acceptrun.telemetry.summary.summarize`; what the record lacks is ``not_recorded``,
never a pass.

A part the verdict uses that raises (the telemetry summary, the portability check, a
neighbouring record read for a drill) never loses the verdict and never fails silently:
the checks that needed it are ``not_recorded`` with evidence "<part> failed: <error>;
see events", and a ``best_effort_failed`` event (component, error, traceback) is
appended to the run's events.jsonl.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acceptrun.record.status import CheckStatus
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec, load_spec

if TYPE_CHECKING:
    from acceptrun.telemetry.summary import Summary

__all__ = [
    "GROUPS",
    "Check",
    "CheckFn",
    "CheckInput",
    "Verdict",
    "check_mark",
    "format_verdict",
]

PASS, FAIL, NOT_RECORDED = CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.NOT_RECORDED

# Check groups, in the order of the acceptance tests, with their titles.
GROUPS: dict[str, str] = {
    "setup": "1. launch and setup",
    "data": "2. data and checkpoints",
    "performance": "3. performance and observability",
    "operations": "4. operations",
    "exit": "5. exit",
    "results": "results",
}

# The event a failed best-effort part of the verdict leaves in events.jsonl.
BEST_EFFORT_FAILED = "best_effort_failed"


@dataclass(frozen=True, slots=True)
class Check:
    """One acceptance check: its group, status, evidence and, when it fails, the fix."""

    group: str
    name: str
    status: str
    required: bool
    evidence: str
    fix: str | None = None
    brief: str | None = None
    """The finding in a few words for the terminal, when the evidence is long (the
    checkpoint interval's model); the evidence stays whole in verdict.json, the report and
    ``show --explain``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "status": self.status,
            "required": self.required,
            "evidence": self.evidence,
            "fix": self.fix,
            **({"brief": self.brief} if self.brief else {}),
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    run_id: str
    checks: list[Check]
    decided_at: str

    @property
    def accepted(self) -> bool:
        return all(c.status == PASS for c in self.checks if c.required)

    @property
    def label(self) -> str:
        return "ACCEPTED" if self.accepted else "REJECTED"

    def to_dict(self) -> dict[str, Any]:
        failed = [c.name for c in self.checks if c.required and c.status != PASS]
        return {
            "run_id": self.run_id,
            "verdict": "accepted" if self.accepted else "rejected",
            "accepted": self.accepted,
            "decided_at": self.decided_at,
            "failed": failed,
            "checks": [c.to_dict() for c in self.checks],
        }


@dataclass(slots=True)
class CheckInput:
    """What every check function reads: the record, its spec, and facts several share.

    The telemetry summary is the one given (close hands over the summary it stored), else
    computed on first use, once per verdict; if it raises, :attr:`summary` is None and
    :attr:`summary_failure` says why (the failure is in events.jsonl, see
    :meth:`record_failure`).
    """

    record: RunRecord
    spec: RunSpec
    standalone: bool
    """The run was not supervised (``acceptrun.init()`` in a plain script)."""
    _summary: Summary | None = field(default=None, init=False, repr=False)
    _summary_done: bool = field(default=False, init=False, repr=False)
    _summary_failure: str | None = field(default=None, init=False, repr=False)

    @classmethod
    def of(
        cls, record: RunRecord, spec: RunSpec | None = None, summary: Summary | None = None
    ) -> CheckInput:
        """The input of one verdict; ``spec`` defaults to the frozen spec in the record,
        ``summary`` (the telemetry summary already computed) to one computed on first use."""
        spec = spec or load_spec(record.spec_path)
        given = cls(record, spec, record.state.get("mode") == "standalone")
        if summary is not None:
            given._summary, given._summary_done = summary, True
        return given

    @property
    def summary(self) -> Summary | None:
        """The telemetry summary of the record, or None when it failed (recorded)."""
        self._summarize()
        return self._summary

    @property
    def summary_failure(self) -> str | None:
        """Evidence text when the summary raised ("summary failed: <error>; see events")."""
        self._summarize()
        return self._summary_failure

    def _summarize(self) -> None:
        """Compute the summary on first use; a failure is recorded, never raised."""
        if self._summary_done:
            return
        self._summary_done = True
        try:
            from acceptrun.telemetry.summary import summarize

            self._summary = summarize(self.record.path)
        except Exception as exc:  # recorded: the checks that need it say why
            self._summary_failure = self.record_failure("summary", exc)

    @property
    def usage(self) -> str | None:
        """How the workload used the client (the ``usage`` event), or None if not recorded."""
        ev = next(iter(self.record.events("usage")), None)
        return None if ev is None else str(ev.get("usage"))

    @property
    def black_box(self) -> str | None:
        """How evidence names a training script that does not use the client ("a black
        box", "a command of unknown kind"), or None: it used the client, its usage was not
        recorded, or the run serves or infers (steps and checkpoints are not what it proves).
        """
        usage = self.usage
        if usage is None or usage == "client":
            return None
        if self.spec.serving.enabled or self.spec.inference.enabled:
            return None
        return "a black box" if usage == "black box" else "a command of unknown kind"

    def event_kinds(self) -> set[str]:
        """The kinds of event in the record ("step" when the step log holds any)."""
        from acceptrun.record.view import RecordView

        view = RecordView(self.record)
        kinds = {str(ev.get("kind")) for ev in view.log_events}
        return kinds | ({"step"} if view.step_log.count() else set())

    def record_failure(self, component: str, exc: BaseException) -> str:
        """Append a ``best_effort_failed`` event for ``exc``; return the evidence text."""
        return record_failure(self.record, component, exc)


CheckFn = Callable[[CheckInput], list[Check]]


def record_failure(record: RunRecord, component: str, exc: BaseException) -> str:
    """Leave a failed best-effort part in the run's events; the text for a check's evidence.

    The event names the component, the exception and its traceback. The same failure
    already in the events (a verdict computed again over the same record) is not written
    twice. Writing it can fail too (a read-only record): the returned text then says so,
    it never goes unseen.
    """
    error = f"{type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        seen = any(
            ev.get("component") == component and ev.get("error") == error
            for ev in record.events(BEST_EFFORT_FAILED)
        )
        if not seen:
            record.event(BEST_EFFORT_FAILED, sync=True, component=component, error=error,
                         traceback=trace)  # fmt: skip
    except OSError as write_exc:
        return f"{component} failed: {error}; recording it in events.jsonl failed too: {write_exc}"
    return f"{component} failed: {error}; see events"


# A check's mark and word, by status and whether the verdict needs it: the failure cross
# belongs to a required check alone, so an ACCEPTED verdict never shows one.
_MARKS: dict[tuple[str, bool], tuple[str, str]] = {
    (PASS, True): ("✓", "pass"),
    (PASS, False): ("✓", "pass"),
    (FAIL, True): ("✗", "FAIL"),
    (FAIL, False): ("ℹ", "info"),
    (NOT_RECORDED, True): ("–", "not recorded"),
    (NOT_RECORDED, False): ("–", "not recorded"),
}


def check_mark(status: str, required: bool) -> tuple[str, str]:
    """The mark and the word every view shows for a check: ``("✗", "FAIL")``, ``("ℹ", "info")``.

    An informational check that did not pass is ``ℹ info``, never the failure cross: the
    terminal, Markdown and HTML views all take their marks from here.
    """
    return _MARKS.get((str(status), bool(required)), ("?", str(status)))


# Columns of a terminal verdict line: every line fits, the rest is one command away.
WIDTH = 100
CUT = " …"  # ends a finding cut to fit; `show --explain` and the report have all of it


def format_verdict(verdict: Verdict, *, name: str = "", explain: bool = False) -> str:
    """The verdict for a person: its label, then each group's checks, a line each.

    Every line fits in :data:`WIDTH` columns: a check's finding (its ``brief``, else its
    evidence) is cut at a clause or a word and ends with "…", and the last line says
    where the rest is (``acceptrun show --explain RUN``, the report). With ``explain``
    every check's whole evidence is printed, wrapped to the same width.
    """
    lines = [f"{verdict.label}  {name + '  ' if name else ''}{verdict.run_id}"]
    width = min(max((len(c.name) for c in verdict.checks), default=10), 24)
    lead = 4 + width + 2  # "  ✓ " + the name + two spaces
    cut = False
    group = None
    for c in verdict.checks:
        if c.group != group:
            group = c.group
            lines.append(GROUPS.get(group, group))
        tag = "" if c.required or c.status == PASS else " (info)"
        mark = check_mark(c.status, c.required)[0]
        head = f"  {mark} {c.name:<{width}}  "
        if explain:
            lines += _wrapped(head, c.evidence + tag, lead)
        else:
            text = _fit((c.brief or c.evidence) + tag, WIDTH - len(head))
            cut = cut or text.endswith(CUT) or (c.brief is not None and c.brief != c.evidence)
            lines.append(head + text)
        if c.status != PASS and c.fix and c.required:
            lines += _wrapped(" " * lead + "fix: ", c.fix, lead + 5)
    if cut:
        lines.append(f"… the rest: acceptrun show --explain {verdict.run_id}, or its report")
    return "\n".join(lines)


def _fit(text: str, room: int) -> str:
    """``text`` in ``room`` columns: whole, or cut after its last clause ("; ") or word
    that fits, ending with :data:`CUT`."""
    if len(text) <= room:
        return text
    keep = room - len(CUT)
    head = text[:keep]
    for sep in ("; ", ", ", " "):
        at = head.rfind(sep)
        if at > keep // 3:
            return head[:at].rstrip(" ,;") + CUT
    return head + CUT


def _wrapped(first: str, text: str, indent: int) -> list[str]:
    """``first`` then ``text`` wrapped to :data:`WIDTH` columns, later lines indented."""
    import textwrap

    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=" " * indent,
        break_on_hyphens=False, break_long_words=True,
    ) or [first.rstrip()]  # fmt: skip
