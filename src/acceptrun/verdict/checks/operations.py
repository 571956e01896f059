"""Group 4, operations: how the run ended, resumes, failures and the work they lost,
restarts, drills, clean-up, injected faults, budget and cost.

Also, for a script without step events, that its lost work cannot be counted in steps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from acceptrun.cost.billing import format_usd
from acceptrun.record.glossary import label as part_label
from acceptrun.record.lost import lost_work
from acceptrun.record.recovery import restarts as restarts_of
from acceptrun.record.view import read_attempts
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import format_duration
from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput

__all__ = [
    "black_box_lost_work",
    "budget",
    "cleanup",
    "cost",
    "drill_check",
    "drills",
    "exit_status",
    "failures",
    "injected_faults",
    "preemption_notice",
    "recovery",
    "restarts",
    "resumed",
]

_CLASS_FIX = {
    "user_error": "fix the error in stderr.log (import, syntax, missing file, or an exception that recurs at the same place); it is never retried",
    "cuda_oom": "lower the batch size, or use bf16 / activation checkpointing (acceptrun tune)",
    "host_oom": "the host ran out of memory: fewer data-loader workers, smaller prefetch, a bigger machine",
    "disk_full": "free space where the error says (or raise the file-size limit), or set "
    "checkpoint.dir to a larger file system; then `acceptrun resume RUN` continues from the "
    "newest checkpoint",
    "diverged": 'lower the learning rate, or set limits.on_divergence = "rollback"',
    "hang": "read stacks.txt in the attempt's directory: where the workload was stuck",
    "data_stall": "the data loader stopped delivering: check the data source and num_workers",
    "distributed": "a collective or rendezvous failed: check every rank's log and the network",
    "node_lost": "a node's processes died (the evidence names the node and how): check that "
    "node (scontrol show node, its slurmd log), or exclude it (slurm.extra_args = "
    '["--exclude=NODE"])',
    "gpu_fault": "a GPU error (Xid, ECC, illegal address): check the GPU, or move to another machine",
    "wall_time": "raise limits.wall_time, or make the run faster",
    "setup_changed": "the data or a package changed between attempts (the evidence names "
    "which): restore what preflight verified, then `acceptrun resume RUN`, or start a new run",
    "idle": "the workload sat idle: see what it waited for in stderr.log and telemetry.jsonl, "
    "or raise limits.idle_window / lower telemetry.idle_threshold",
}

_DRILL_FIX = {
    "restore": "run `acceptrun ckpt drill RUN` (restores the newest checkpoint in a fresh process)",
    "kill": "run `acceptrun drill SPEC` once for this spec (a reference run vs a killed one)",
    "preempt": "run `acceptrun drill SPEC` once for this spec (it also preempts the run)",
    "campaign": "run `acceptrun drill --campaign SPEC` once for this spec (every fault kind "
    "it can inject, each named, timed and compared with an uninterrupted run)",
}


def _attempts(given: CheckInput) -> list[dict[str, Any]]:
    """The attempts' exit.json of a supervised run; [] for a standalone one."""
    return [] if given.standalone else read_attempts(given.record)


def exit_status(given: CheckInput) -> list[Check]:
    """The run ended well: the last attempt succeeded (a standalone run: its workload_end)."""
    if given.standalone:
        ends = list(given.record.events("workload_end"))
        if not ends:
            return [Check("operations", "exit", NOT_RECORDED, True,
                          "the workload never reported its end",
                          "call run.finish() or let the script exit")]  # fmt: skip
        status = str(ends[-1].get("status"))
        return [Check("operations", "exit", PASS if status == "ok" else FAIL, True,
                      f"workload ended: {status}",
                      None if status == "ok" else "read the traceback above")]  # fmt: skip
    attempts = read_attempts(given.record)
    if not attempts:
        return [Check("operations", "exit", NOT_RECORDED, True, "no attempt ran",
                      "see preflight.json for why the run did not launch")]  # fmt: skip
    last = attempts[-1]
    ok = last["outcome"] == "success"
    fix = None if ok else f"read attempts/{last['attempt']}/stderr.log"
    if not ok and last.get("class"):
        fix = _CLASS_FIX.get(last["class"], fix)
    if last["outcome"] == "wall_time":
        fix = "raise limits.wall_time, or make the run faster"
    evidence = (
        f"attempt {last['attempt']} {last['reason']} after {format_duration(last['duration_s'])}"
    )
    return [Check("operations", "exit", PASS if ok else FAIL, True, evidence, fix)]


def resumed(given: CheckInput) -> list[Check]:
    """Where each later attempt resumed from (information)."""
    if not _attempts(given):
        return []
    resumes = [e for e in given.record.events("restored") if e.get("attempt", 0) >= 1]
    if not resumes:
        return []
    fetched = {e.get("attempt") for e in given.record.events("mirror_fetch")}
    text = "; ".join(
        f"attempt {e['attempt']} from step {e['step']}"
        + (f" (an estimate: {e['step_estimate']})" if e.get("step_estimate") else "")
        + f" ({e.get('seconds', 0):.2f}s"
        + (", fetched from the mirror)" if e["attempt"] in fetched else ")")
        for e in resumes
    )
    for note in given.record.events("resume_note"):  # what a framework's resume said
        text += f"; attempt {note.get('attempt')}: {note.get('note')}"
    bad = list(given.record.events("mirror_quarantine"))  # passed over by a resume
    if bad:
        text += "; mirror: " + ", ".join(
            f"step {b.get('step')} did not verify (attempt {b.get('attempt')})" for b in bad
        )
    return [Check("operations", "resumed", PASS, False, text)]


def failures(given: CheckInput) -> list[Check]:
    """The attempts that failed, why, and the work they lost (information)."""
    attempts = _attempts(given)
    failed = [a for a in attempts if a["outcome"] != "success"]
    if not failed:
        return []
    text = "; ".join(
        f"attempt {a['attempt']}: {a.get('class', a['outcome'])} ({a.get('class_reason') or a['reason']})"
        for a in failed
    )
    # Exact, bounded or unknown (record/lost.py): the figure every view prints.
    lost = f"; lost {lost_work(attempts).text()}"
    # On the terminal: each attempt's class and the work lost; the reasons in --explain.
    brief = "; ".join(f"attempt {a['attempt']}: {a.get('class', a['outcome'])}" for a in failed)
    return [Check("operations", "failures", PASS, False, text + lost, None, brief + lost)]


def preemption_notice(given: CheckInput) -> list[Check]:
    """The cloud's preemption notice (limits.preemption_notice): the step the workload
    saved after it, how soon, inside the notice or not, and the steps lost."""
    notices = list(given.record.events("preemption_notice"))
    if not notices:
        return []
    notice = notices[0]
    t0, provider, deadline = float(notice["t"]), notice.get("provider"), notice.get("deadline")
    commits = [
        e for e in given.record.events("checkpoint_commit")
        if isinstance(e.get("t"), int | float) and e["t"] >= t0 and e.get("step") is not None
    ]  # fmt: skip
    ends = [e["t"] for e in given.record.events("attempt_exit") if e.get("t", 0) >= t0]
    end = min(ends, default=float("inf"))  # the attempt the notice ended: its last step
    last = _last_step_by(given.record, end)
    gave = None if deadline is None else f"{max(0.0, deadline - t0):.0f}s"
    if not commits:
        return [Check("operations", "preemption notice", FAIL, False,
                      f"no checkpoint after the notice from {provider}"
                      f"{'' if gave is None else f' ({gave} ahead)'}; the work since the newest "
                      "checkpoint is lost",
                      "save a checkpoint when the workload gets SIGTERM (run.stop_requested, "
                      "or a signal handler), inside limits.grace_period")]  # fmt: skip
    saved = commits[0]
    after = float(saved["t"]) - t0
    late = deadline is not None and float(saved["t"]) > deadline
    lost = "" if last is None else f"; {max(0, int(last) - int(saved['step'])):,} steps lost"
    inside = "" if gave is None else f", {'past' if late else 'inside'} the {gave} it gave"
    evidence = (
        f"saved step {int(saved['step']):,} {after:.1f}s after the notice from {provider}"
        f"{inside}{lost}"
    )
    fix = "save faster, or lower the state saved on SIGTERM" if late else None
    return [Check("operations", "preemption notice", FAIL if late else PASS, False, evidence, fix)]


def recovery(given: CheckInput) -> list[Check]:
    """How long each restart took, from the workload's end to the next first step, and
    where the time went (record/recovery.py; information)."""
    done = [r for r in restarts_of(given.record) if r.total is not None]
    if not done:
        return []
    slowest = max(done, key=lambda r: r.total or 0.0)
    totals = sorted(float(r.total or 0.0) for r in done)
    median = totals[len(totals) // 2]
    tiers = ("memory", "disk", "mirror")  # where run.restore read the state
    source = {"restore": f" from {slowest.source}"} if slowest.source in tiers else {}
    parts = ", ".join(
        f"{name.replace('_', ' ')} {seconds:.2f}s{source.get(name, '')}"
        for name, seconds in slowest.parts().items()
        if seconds is not None
    )
    modes = Counter(r.mode for r in done if r.mode is not None)  # warm: from a standby
    how = f" ({', '.join(f'{n} {m}' for m, n in sorted(modes.items()))})" if modes else ""
    brief = f"{len(done)} restart(s), median {median:.2f}s from the end to the first step{how}"
    mode = "" if slowest.mode is None else f" {slowest.mode}"
    evidence = (
        f"{brief}; the slowest, attempt {slowest.attempt + 1}{mode}, {slowest.total:.2f}s: {parts}"
    )
    sources = Counter(r.source for r in done if r.source in tiers)
    if len(done) > 1 and sources:
        evidence += "; restored from " + ", ".join(f"{s} {n}" for s, n in sorted(sources.items()))
    return [Check("operations", "recovery", PASS, False, evidence, None, brief)]


def _last_step_by(record: RunRecord, end: float) -> int | None:
    """The highest step logged by ``end`` (unix s): the step log in chunks of arrays, never
    a dict per step (a month-long run logs millions)."""
    import numpy as np

    from acceptrun.record.steplog import StepLog

    last = None
    for chunk in StepLog(record.path).chunks(1 << 16):
        done = chunk.step[chunk.t <= end]
        if done.size:
            top = int(np.max(done))
            last = top if last is None else max(last, top)
    return last


def restarts(given: CheckInput) -> list[Check]:
    """Restarts the supervisor chose, at most limits.max_restarts.

    A resume (`acceptrun resume`) is a person's decision and does not count.
    """
    if not _attempts(given):
        return []
    n = sum(1 for _ in given.record.events("restart"))
    most = given.spec.limits.max_restarts
    return [
        Check("operations", "restarts", PASS if n <= most else FAIL, True, f"{n} of at most {most}")
    ]


def drills(given: CheckInput) -> list[Check]:
    """The kill and preempt drills the spec requires (restore belongs to the data group)."""
    if not _attempts(given):
        return []
    return [drill_check(given, d) for d in given.spec.acceptance.drills if d != "restore"]


def cleanup(given: CheckInput) -> list[Check]:
    """Every [cleanup] command and removal ran and succeeded (cleanup events)."""
    spec = given.spec
    if not _attempts(given) or (not spec.cleanup.commands and not spec.cleanup.remove):
        return []
    events = list(given.record.events("cleanup"))
    if not events:
        return [Check("operations", "cleanup", NOT_RECORDED, True, "no clean-up ran (the run did not finish)",
                      "run the [cleanup] commands by hand, then remove what [cleanup] remove names")]  # fmt: skip
    failed = [e for e in events if not e.get("ok")]
    removed = sum(len(e.get("removed") or []) for e in events)
    if failed:
        # A removal refused by the path guard (outside the workdir, the workspace, a store,
        # the data) is a failure too: the spec asked for something that did not happen.
        what = "; ".join(
            f"{e.get('command') or e.get('remove')}: {e.get('detail')}" for e in failed
        )
        return [Check("operations", "cleanup", FAIL, True,
                      f"{len(failed)} of {len(events)} failed: {what}"
                      + (f"; {removed} path{'' if removed == 1 else 's'} removed" if removed else ""),
                      "fix the failing clean-up step and run it by hand; a refused removal names "
                      "what it would have reached: narrow the [cleanup] remove glob to the run's own files")]  # fmt: skip
    return [Check("operations", "cleanup", PASS, True,
                  f"{len(events)} step{'' if len(events) == 1 else 's'} done, {removed} path{'' if removed == 1 else 's'} removed")]  # fmt: skip


def _events_with_step_bounds(given: CheckInput) -> list[dict[str, Any]]:
    """The record's events with each attempt's steps reduced to its first and last one:
    all that :func:`unfired` reads of them, without a dict per step of a long run."""
    from acceptrun.record.view import RecordView

    view = RecordView(given.record)
    events = [e for e in view.log_events if e.get("kind") != "step"]
    for attempt, b in view.step_log.bounds().items():
        for step, t in ((b["min_step"], b["first_t"]), (b["max_step"], b["last_t"])):
            events.append({"t": t, "kind": "step", "attempt": attempt, "step": step})
    return events


def injected_faults(given: CheckInput) -> list[Check]:
    """Every fault asked for with ``--inject`` happened: a drill whose fault never fired
    proved nothing, and must not pass as one that did."""
    from acceptrun.workload.inject import unfired

    requested = given.record.state.get("injected") or []
    if not requested:
        return []
    missed = unfired(requested, _events_with_step_bounds(given))
    if missed:
        return [Check("operations", "injected faults", FAIL, True, "; ".join(missed),
                      "inject at a step the run reaches (a step it logs with run.steps() or "
                      "run.log(step, ...)), or at a time before the attempt ends")]  # fmt: skip
    n = len(requested)
    return [Check("operations", "injected faults", PASS, True,
                  f"{n} fault{'' if n == 1 else 's'} fired as requested: {', '.join(requested)}")]  # fmt: skip


def _priced_ledger(given: CheckInput) -> dict[str, Any] | None:
    ledger = given.record.read_json("ledger.json")
    return ledger if isinstance(ledger, dict) and ledger.get("priced") else None


def budget(given: CheckInput) -> list[Check]:
    """The compute spent is within limits.budget_usd (ledger.json), when the spec has one."""
    limit = given.spec.limits.budget_usd
    if limit is None:
        return []
    ledger = _priced_ledger(given)
    if ledger is None:
        return [Check("operations", "budget", NOT_RECORDED, True, "no priced ledger.json", "set cost.price_per_hour or cost.provider/instance")]  # fmt: skip
    usd = float(ledger.get("compute", {}).get("usd", 0.0))
    label = (ledger.get("price") or {}).get("label", "?")
    ok = usd <= limit + 1e-9
    return [Check("operations", "budget", PASS if ok else FAIL, True, f"{format_usd(usd)} of {format_usd(limit)} USD ({label})", None if ok else "raise limits.budget_usd, or find the waste in `acceptrun cost show`")]  # fmt: skip


def cost(given: CheckInput) -> list[Check]:
    """Where the money went, from a priced ledger.json (information)."""
    ledger = _priced_ledger(given)
    if ledger is None:
        return []
    compute = ledger.get("compute", {})
    usd = float(compute.get("usd", 0.0))
    label = (ledger.get("price") or {}).get("label", "?")
    split = compute.get("split_s", {})
    billed = sum(v for v in split.values() if isinstance(v, int | float))
    parts = ", ".join(
        f"{part_label(k)} {100 * v / billed:.0f}%"  # the ledger's idle is "no step": glossary
        for k, v in sorted(split.items(), key=lambda kv: -kv[1])
        if isinstance(v, int | float) and billed > 0
    )
    total = float(ledger.get("total_usd", usd))
    text = f"{format_usd(total)} USD in all; compute {format_usd(usd)} USD, billed {format_duration(billed)}"
    text += f" ({parts})" if parts else ""
    brief = f"{format_usd(total)} USD, billed {format_duration(billed)}" + (
        f" ({parts})" if parts else ""
    )
    behind = (ledger.get("storage") or {}).get("left_behind") or {}
    left = float(behind.get("monthly_usd") or 0.0) + float(behind.get("mirror_monthly_usd") or 0.0)
    if left > 0:
        text += f"; left behind costs {format_usd(left)} USD/month"
    return [Check("operations", "cost", PASS, False, f"{text} ({label})", None, brief)]


def black_box_lost_work(given: CheckInput) -> list[Check]:
    """Lost work a black box's progress does not measure (information): none of it without
    step events, none after step N when its step lines could not be ordered."""
    what = given.black_box
    if what is None:
        return []
    if "step" not in given.event_kinds():
        return [Check("operations", "lost work", NOT_RECORDED, False,
                      f"not measured in steps: {what} without step events loses all of a "
                      "failed attempt; set progress.pattern so lost steps are counted")]  # fmt: skip
    unordered = [
        e for e in given.record.events("progress_warning")
        if e.get("reason") in ("unordered", "dropped") and isinstance(e.get("unknown_after"), int)
    ]  # fmt: skip
    if not unordered:
        return []
    first = min(unordered, key=lambda e: int(e["unknown_after"]))
    dropped = sum(int(e.get("dropped") or 0) for e in unordered if e.get("reason") == "dropped")
    brief = f"unknown after step {first['unknown_after']}"
    evidence = (
        f"{brief}: in attempt {first.get('attempt')} the step counter went back to a count "
        f"that cannot be ordered, so {dropped or 'its'} step lines were dropped; the last "
        "step, the steps lost and the step times after it are not known"
    )
    fix = "make progress.pattern match one counter, or name its epoch with (?P<epoch>\\d+)"
    return [Check("operations", "lost work", NOT_RECORDED, False, evidence, fix, brief)]


def drill_check(given: CheckInput, drill: str) -> Check:
    """A required drill: its result in this run, or (kill, preempt, campaign) in a drill of this spec.

    `acceptrun drill SPEC` proves the operations of a spec once, in runs of its own; every
    later run of the same spec (same spec hash) counts that proof. The restore drill
    belongs to the data and checkpoints test, the others to operations.
    """
    check = _drill_result(given, drill)
    if drill == "restore":
        return Check("data", check.name, check.status, check.required, check.evidence, check.fix)
    return check


def _drill_result(given: CheckInput, drill: str) -> Check:
    name = f"drill {drill}"
    own = [e for e in given.record.events("drill") if e.get("drill") == drill]
    if own and own[-1].get("skipped"):
        # Not applicable to this script (e.g. a preemption of a black box): neither a pass
        # it did not earn nor a failure of the script; the required check stays unproven.
        ev = own[-1]
        return Check("operations", name, NOT_RECORDED, True, str(ev.get("evidence", "")),
                     str(ev.get("fix") or _DRILL_FIX.get(drill) or ""))  # fmt: skip
    if own:
        ok = bool(own[-1].get("ok"))
        return Check("operations", name, PASS if ok else FAIL, True,
                     str(own[-1].get("evidence", "")), None if ok else _DRILL_FIX.get(drill))  # fmt: skip
    unread: list[str] = []
    found = (
        _drill_elsewhere(given, drill, unread) if drill in ("kill", "preempt", "campaign") else None
    )
    note = (
        f"; {len(unread)} other run record(s) could not be read: {'; '.join(unread)}"
        if unread
        else ""
    )
    if found is None:
        return Check("operations", name, NOT_RECORDED, True,
                     "no result recorded for this drill" + note, _DRILL_FIX.get(drill))  # fmt: skip
    run_id, ev = found
    if ev.get("skipped"):
        return Check("operations", name, NOT_RECORDED, True,
                     f"skipped in drill run {run_id} of the same spec: {ev.get('evidence', '')}{note}",
                     str(ev.get("fix") or _DRILL_FIX.get(drill) or ""))  # fmt: skip
    ok = bool(ev.get("ok"))
    evidence = f"{'passed' if ok else 'failed'} in drill run {run_id} of the same spec: {ev.get('evidence', '')}{note}"
    return Check("operations", name, PASS if ok else FAIL, True, evidence,
                 None if ok else _DRILL_FIX.get(drill))  # fmt: skip


def _drill_elsewhere(
    given: CheckInput, drill: str, unread: list[str]
) -> tuple[str, dict[str, Any]] | None:
    """The newest result of ``drill`` in a drill run of the same spec (same spec hash).

    A neighbouring record that cannot be read does not break this verdict: it is skipped,
    recorded (``best_effort_failed``) and named in ``unread``.
    """
    spec_hash = given.record.state.get("spec_hash")
    runs = given.record.path.parent
    if not spec_hash or not runs.is_dir():
        return None
    latest: tuple[str, dict[str, Any]] | None = None
    for d in sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")):
        other = RunRecord(d)
        try:
            state = other.state
        except Exception as exc:  # recorded: a damaged neighbour must not break this verdict
            unread.append(given.record_failure(f"drill {drill}: reading run {d.name}", exc))
            continue
        if state.get("spec_hash") != spec_hash or "drill" not in state:
            continue
        for ev in other.events("drill"):
            if ev.get("drill") == drill:
                latest = (other.run_id, ev)
    return latest
