"""Which recorded events are worth telling someone, and the message each one makes.

A condition is already in the record before anyone is told: a ``diverged`` or
``hang_detected`` line in events.jsonl, an attempt's exit, the verdict. :func:`condition_of`
reads one such event and returns the :class:`Condition` it is (or None); the notifier
(:mod:`acceptrun.notify.notifier`) follows events.jsonl and hands each condition to the
targets that asked for its kind. The one condition that no line records is the death of
the supervisor itself: :mod:`acceptrun.notify.watch` builds it from the lease
(:func:`supervisor_gone`).

Each message names the run, the failure in words, the evidence in one line, the fix, and
where the report is. The condition's own time (the event's ``t``) is what time to detect
counts from.

>>> condition_of({"t": 1.0, "kind": "diverged", "step": 7, "loss": "nan",
...               "reason": "loss is nan", "attempt": 1}, "r1", "/runs/r1").kind
'divergence'
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_json

__all__ = [
    "SOURCE_KINDS",
    "Condition",
    "condition_of",
    "supervisor_gone",
]

# The events.jsonl kinds that make a condition, by the notification kind they make.
SOURCE_KINDS: dict[str, str] = {
    "verdict": "rejected|accepted",
    "attempt_exit": "attempt_failed",
    "hang_detected": "hang",
    "diverged": "divergence",
    "idle_stop": "idle_stop",
    "budget_warning": "budget",
    "budget_stop": "budget",
    "mirror_failed": "mirror_behind",
    "mirror_behind": "mirror_behind",
    "checkpoint_quarantine": "checkpoint_quarantined",
    "mirror_quarantine": "checkpoint_quarantined",
}

# Attempts that ended like this are no failure to tell: done, or stopped on request.
_NOT_FAILED = ("success", "stopped")

# What to do about a failed attempt, by its class (record/status.py FailureClass).
_CLASS_FIX = {
    "preempted": "nothing to fix: the machine was taken back; acceptrun restarts from the newest checkpoint",
    "killed": "find who sent the kill (an OOM killer, a scheduler, a person); the attempt's stderr.log has its last lines",
    "cuda_oom": "lower the batch size or the sequence length, or enable activation checkpointing",
    "host_oom": "lower the data loader's workers or prefetch, or ask for more host memory",
    "distributed": "look at every rank's stderr.log for the first rank that failed (NCCL timeouts follow it)",
    "node_lost": "a machine of the run went away: check it with the provider; the run restarts from a checkpoint",
    "gpu_fault": "an Xid or ECC fault: report the GPU to the provider and run on another one",
    "hang": "read the attempt's stacks.txt; raise limits.hang_window if a step is slow on purpose",
    "data_stall": "the loop waited for data for the hang window: check the data loader and the storage",
    "diverged": 'lower the learning rate or clip gradients; limits.on_divergence = "rollback" restarts from the checkpoint before',
    "disk_full": "free space on the checkpoint disk or lower checkpoint.keep_last",
    "setup_changed": "the data or a package changed since preflight: put it back and resume, or start a new run",
    "user_error": "fix the error in the attempt's stderr.log and run again (a restart would fail the same way)",
    "wall_time": "raise limits.wall_time, or resume the run (acceptrun resume)",
    "budget": "raise limits.budget_usd, or resume with a new budget",
    "idle": "the GPU sat idle: check the data loader and device placement, or telemetry.idle_threshold",
    "failed": "read the attempt's stderr.log: the exit matched no known failure",
}


@dataclass(frozen=True)
class Condition:
    """Something to tell: what it is, when it was recorded, and the words of the message."""

    kind: str  # a name of spec.model.NOTIFY_EVENTS
    key: str  # the same condition seen again has the same key (dedupe)
    t: float  # the condition's own time (unix s): time to detect counts from here
    source: str  # the events.jsonl kind (or "lease" for a gone supervisor)
    title: str  # one line: the run and the failure in words
    evidence: str  # one line of evidence
    fix: str  # what to do about it
    run_id: str
    run_dir: str
    attempt: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> str:
        """Where the report is: report.html in the record (written at the close)."""
        return str(Path(self.run_dir) / "report.html")

    def message(self, name: str | None = None) -> dict[str, Any]:
        """The message every target sends (as JSON, or its ``text`` in words)."""
        lines = [
            self.title,
            f"evidence: {self.evidence}" if self.evidence else "",
            f"fix: {self.fix}" if self.fix else "",
            f"report: {self.report}",
            f"record: {self.run_dir}",
        ]
        return {
            "source": "acceptrun",
            "event": self.kind,
            "run": self.run_id,
            "name": name,
            "host": socket.gethostname(),
            "attempt": self.attempt,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
            "report": self.report,
            "record": self.run_dir,
            "condition": self.source,
            "condition_t": self.t,
            **({"details": self.extra} if self.extra else {}),
            "text": "\n".join(line for line in lines if line),
        }


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def condition_of(event: dict[str, Any], run_id: str, run_dir: str | Path) -> Condition | None:
    """The condition an events.jsonl line records, or None when it tells nobody anything."""
    kind = event.get("kind")
    t = event.get("t")
    if not isinstance(kind, str) or kind not in SOURCE_KINDS or not isinstance(t, int | float):
        return None
    builder = _BUILDERS[kind]
    attempt = event.get("attempt")
    attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None
    made = builder(event, attempt, Path(run_dir))
    if made is None:
        return None
    what, key, title, evidence, fix = made
    return Condition(
        kind=what, key=f"{what}:{key}", t=float(t), source=kind,
        title=f"run {run_id}: {title}", evidence=evidence, fix=fix,
        run_id=run_id, run_dir=str(run_dir), attempt=attempt,
    )  # fmt: skip


_Made = tuple[str, str, str, str, str] | None  # kind, key, title, evidence, fix


def _verdict(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    verdict = ev.get("verdict")
    if verdict not in ("accepted", "rejected"):
        return None
    try:
        decided = read_json(run_dir / "verdict.json")
    except (OSError, ValueError):
        decided = {}
    checks = decided.get("checks", []) if isinstance(decided, dict) else []
    failed = [c for c in checks if isinstance(c, dict) and c.get("status") == "fail"]
    if verdict == "accepted":
        return ("accepted", "accepted", "accepted", f"{len(checks)} checks decided, none failed",
                "")  # fmt: skip
    names = ", ".join(str(c.get("name")) for c in failed) or "see the verdict"
    first = failed[0] if failed else {}
    evidence = f"{first.get('name')}: {first.get('evidence')}" if first else ""
    fix = next((str(c["fix"]) for c in failed if c.get("fix")), "")
    return ("rejected", "rejected", f"rejected ({len(failed)} failed: {names})", evidence,
            fix or "read the report's failed checks")  # fmt: skip


def _attempt_exit(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    cls = str(ev.get("class") or ev.get("outcome") or "failed")
    if ev.get("outcome") in _NOT_FAILED or cls in _NOT_FAILED:
        return None
    evidence = ev.get("evidence")
    line = (
        str(evidence[0]) if isinstance(evidence, list) and evidence
        else str(ev.get("class_reason") or ev.get("reason") or "")
    )  # fmt: skip
    decision = ev.get("decision")
    title = f"attempt {attempt} failed: {cls}" + (f"; {decision}" if decision else "")
    first = line.splitlines()[0] if line else ""
    if _BARE_EXIT.fullmatch(first) and attempt is not None:
        last = _last_line(run_dir / "attempts" / str(attempt) / "stderr.log")
        first = f"{first}; the last line of its stderr: {last}" if last else first
    return ("attempt_failed", str(attempt), title, first,
            _CLASS_FIX.get(cls, _CLASS_FIX["failed"]))  # fmt: skip


_BARE_EXIT = re.compile(r"exit status -?\d+")  # evidence that says nothing of the cause
_TAIL_BYTES = 4096


def _last_line(path: Path) -> str:
    """The last non-empty line of a log (read from its end only), cut to 300 characters.

    The message passes through the redactor on its way out (targets.outgoing), as every
    message does: the raw log's secrets never leave in it.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def _hang(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    stall = str(ev.get("stall") or "hang")
    words = "waited for data" if stall == "data_stall" else "made no progress"
    evidence = ev.get("evidence")
    line = str(evidence) if evidence else ""
    return ("hang", f"{attempt}", f"attempt {attempt} {words} for the hang window ({stall})",
            line[:300], _CLASS_FIX["data_stall" if stall == "data_stall" else "hang"])  # fmt: skip


def _diverged(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    return ("divergence", f"{attempt}",
            f"diverged at step {ev.get('step')} (loss {_num(ev.get('loss'))})",
            str(ev.get("reason") or ""), _CLASS_FIX["diverged"])  # fmt: skip


def _idle(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    seconds = ev.get("seconds")
    evidence = str(ev.get("reason") or "")
    if isinstance(seconds, int | float):
        evidence = f"{evidence} (idle {seconds:.0f} s)".strip()
    return ("idle_stop", f"{attempt}", "stopped: the workload sat idle", evidence,
            _CLASS_FIX["idle"])  # fmt: skip


def _budget(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    spent, budget = ev.get("spent_usd"), ev.get("budget_usd")
    if ev.get("kind") == "budget_stop":
        return ("budget", "stop", f"stopping at the budget ({_num(spent)} of {_num(budget)} USD)",
                f"{_num(spent)} USD spent of limits.budget_usd = {_num(budget)}",
                _CLASS_FIX["budget"])  # fmt: skip
    fraction = ev.get("fraction")
    share = f"{100 * fraction:.0f}%" if isinstance(fraction, int | float) else "its warning share"
    title = f"spend passed {share} of the budget"
    if isinstance(spent, int | float) and isinstance(budget, int | float) and budget > 0:
        now = spent / budget
        title = f"spend at {100 * now:.0f}% of the budget, past {share}"
        if isinstance(fraction, int | float) and now < fraction:  # a long grace period
            title = (
                f"the budget stop is due before the spend reaches {share} (now {100 * now:.0f}%)"
            )
    return ("budget", f"{fraction}", title,
            f"{_num(spent)} USD spent of limits.budget_usd = {_num(budget)}",
            "raise limits.budget_usd before it stops the run, or let it stop with a checkpoint")  # fmt: skip


def _mirror_behind(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    status = ev.get("status")
    pending = (
        sorted(str(k) for k, v in status.items() if v != "ok") if isinstance(status, dict) else []
    )
    evidence = f"steps not on the mirror: {', '.join(pending[:10])}" if pending else ""
    return ("mirror_behind", f"{attempt}", "the checkpoint mirror is behind at the end", evidence,
            "check that checkpoint.mirror is reachable and has space; until it catches up only "
            "the local copies hold those steps")  # fmt: skip


def _mirror_failed(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    """An upload that failed while the run goes on: the mirror is falling behind now.

    Told once per attempt (the mirror retries with backoff, and each retry is recorded);
    ``mirror_behind`` at the attempt's end is told apart, under its own key. A failed
    deletion of a retired step leaves every checkpoint a restore needs on the mirror, and
    a step ``skipped`` was removed by retention before its upload: neither tells anybody.
    """
    state, step = ev.get("state"), ev.get("step")
    if state not in ("pending", "failed") or not isinstance(step, int):
        return None
    retry = ev.get("retry_in_s")
    then = (
        f"retrying in {_num(retry)} s" if state == "pending" and isinstance(retry, int | float)
        else f"not retried ({state})"
    )  # fmt: skip
    return ("mirror_behind", f"live:{attempt}",
            f"the checkpoint mirror is falling behind: step {step} not uploaded, {then}",
            str(ev.get("reason") or "")[:300],
            "check that checkpoint.mirror is reachable and has space (its credentials, the "
            "network); until it catches up only the local copies hold the newest steps")  # fmt: skip


def _quarantine(ev: dict[str, Any], attempt: int | None, run_dir: Path) -> _Made:
    step = ev.get("step")
    where = "mirrored checkpoint" if ev.get("kind") == "mirror_quarantine" else "checkpoint"
    return ("checkpoint_quarantined", f"{ev.get('kind')}:{step}:{ev.get('path')}",
            f"{where} at step {step} failed verification and was set aside",
            str(ev.get("reason") or "")[:300],
            "the run resumes from the newest checkpoint that verifies; check the disk or "
            "the mirror that held it")  # fmt: skip


_BUILDERS = {
    "verdict": _verdict,
    "attempt_exit": _attempt_exit,
    "hang_detected": _hang,
    "diverged": _diverged,
    "idle_stop": _idle,
    "budget_warning": _budget,
    "budget_stop": _budget,
    "mirror_failed": _mirror_failed,
    "mirror_behind": _mirror_behind,
    "checkpoint_quarantine": _quarantine,
    "mirror_quarantine": _quarantine,
}


def supervisor_gone(
    run_id: str, run_dir: str | Path, *, since: float, pid: Any, detail: str
) -> Condition:
    """The death of a run's supervisor, seen by a process that outlived it.

    ``since`` is the supervisor's last renewal of its lease: the last moment it was known
    alive (it renews every 2 s), so time to detect counts from at most one renewal before
    the death.
    """
    return Condition(
        kind="supervisor_gone", key=f"supervisor_gone:{pid}:{since}", t=float(since),
        source="lease", title=f"run {run_id}: its supervisor is gone ({detail})",
        evidence=f"supervisor.json not renewed since {since:.3f} (pid {pid})",
        fix=f"acceptrun resume {run_id} continues it from the newest checkpoint",
        run_id=run_id, run_dir=str(run_dir),
    )  # fmt: skip
