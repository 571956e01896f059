"""The verdict: acceptance checks over a run record, each with its evidence.

The verdict only reads the record (frozen spec, preflight.json, attempts, events), so it
can be recomputed at any time with the same answer. A check is ``pass``, ``fail`` or
``not_recorded``; the run is ACCEPTED only when every *required* check passes. A
required check whose evidence is missing is never a pass.

Checks are grouped by the five acceptance tests of docs/architecture.md (``GROUPS``):
setup, data (and checkpoints), performance (and observability), operations and exit,
plus the results the spec asks for (metrics and outputs). Figures about time (first
step, throughput, data wait, idle share) come from :func:`acceptrun.telemetry.summary.
summarize`; what the record lacks is ``not_recorded``, never a pass.

Some checks are required only where their evidence means something:

- throughput, first step: only when the spec sets ``acceptance.throughput`` or
  ``acceptance.max_first_step``;
- data wait: when the loop timed its data waits (``run.data_wait()``), in a supervised run
  with at least ``DATA_WAIT_MIN_STEP_S`` seconds of steps;
- idle share: when it was measured on GPUs (a CPU process's share of one core is too
  weak a signal to reject a run on; it is shown, for information);
- telemetry present: for supervised runs that asked for GPUs;
- portability (exit): informational, unless a finding is a blocker (the code that ran
  cannot be rebuilt from the record: see :mod:`acceptrun.verdict.portability`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acceptrun._util.durable import read_jsonl
from acceptrun._util.hashing import hash_file
from acceptrun.cost.billing import format_usd
from acceptrun.record.view import read_attempts, run_timeline, work_lost
from acceptrun.record.workspace import RunRecord, now_iso
from acceptrun.spec.model import RunSpec, format_duration, load_spec, parse_condition

__all__ = [
    "GROUPS",
    "Check",
    "Verdict",
    "compute_verdict",
    "format_verdict",
    "read_attempts",
    "run_timeline",
    "work_lost",
]

PASS, FAIL, NOT_RECORDED = "pass", "fail", "not_recorded"

# Check groups, in the order of the acceptance tests, with their titles.
GROUPS: dict[str, str] = {
    "setup": "1. launch and setup",
    "data": "2. data and checkpoints",
    "performance": "3. performance and observability",
    "operations": "4. operations",
    "exit": "5. exit",
    "results": "results",
}


@dataclass(frozen=True, slots=True)
class Check:
    """One acceptance check: its group, status, evidence and, when it fails, the fix."""

    group: str
    name: str
    status: str
    required: bool
    evidence: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "status": self.status,
            "required": self.required,
            "evidence": self.evidence,
            "fix": self.fix,
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


def compute_verdict(record: RunRecord, spec: RunSpec | None = None) -> Verdict:
    """Decide a run from its record. ``spec`` defaults to the frozen spec in the record."""
    spec = spec or load_spec(record.spec_path)
    state = record.state
    standalone = state.get("mode") == "standalone"
    summary = _summary(record)
    checks: list[Check] = []
    checks += _setup_checks(record, spec, standalone, summary)
    checks += _data_checks(record, spec, standalone)
    checks += _checkpoint_checks(record, spec)
    checks += _operations_checks(record, spec, standalone)
    checks += _fault_checks(record)
    checks += _performance_checks(record, spec)
    checks += _observability_checks(record, spec, standalone, summary)
    checks += _result_checks(record, spec)
    checks += _cost_checks(record, spec)
    checks += _exit_checks(record)
    checks += _black_box_checks(record, spec)
    checks += _inference_checks(record, spec)
    checks += _serving_checks(record, spec)
    order = list(GROUPS)
    checks.sort(key=lambda c: order.index(c.group) if c.group in order else len(order))
    return Verdict(record.run_id, checks, now_iso())


def _inference_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    """A batch inference run's coverage, error rate, items/s and cost per item."""
    if not spec.inference.enabled:
        return []
    from acceptrun.inference.summary import batch_checks

    return [Check(*c) for c in batch_checks(record, spec)]


def _serving_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    """A serving run's readiness, latency percentiles, TTFT, errors, goodput, cost per request."""
    if not spec.serving.enabled:
        return []
    from acceptrun.serving.summary import serving_checks

    return [Check(*c) for c in serving_checks(record, spec)]


def _black_box_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    """What the verdict could not check for a script without the client, and what would let it.

    Information checks (never required): a black box proves only what the spec lets the
    supervisor see. Also the spec keys that had no effect (``spec_warning`` events).
    """
    out = [
        Check("setup", f"spec {ev.get('key')}", NOT_RECORDED, False,
              f"{ev.get('message')}; {ev.get('fix')}")
        for ev in record.events("spec_warning")
    ]  # fmt: skip
    usage = next(iter(record.events("usage")), None)
    if usage is None or usage.get("usage") == "client":
        return out
    if spec.serving.enabled or spec.inference.enabled:
        return out  # not a training loop: steps and checkpoints are not what it proves
    kinds = {str(ev.get("kind")) for ev in record.events()}
    what = "a black box" if usage.get("usage") == "black box" else "a command of unknown kind"
    if "step" not in kinds:
        out.append(Check("performance", "step time", NOT_RECORDED, False,
                         f"not checked: {what} wrote no step events; set progress.pattern "
                         "(a regex over its step lines) or progress.tensorboard, or call "
                         "run.log(step, loss=...)"))  # fmt: skip
        out.append(Check("operations", "lost work", NOT_RECORDED, False,
                         f"not measured in steps: {what} without step events loses all of a "
                         "failed attempt; set progress.pattern so lost steps are counted"))  # fmt: skip
    if "checkpoint_commit" not in kinds and not spec.checkpoint.watch:
        out.append(Check("data", "checkpoints", NOT_RECORDED, False,
                         f"not checked: {what}'s own checkpoints are unknown to acceptrun, a "
                         "restart starts over; list them in checkpoint.watch (with "
                         "checkpoint.resume_args), or save with run.maybe_checkpoint(step)"))  # fmt: skip
    if not spec.outputs and "output" not in kinds:
        out.append(Check("results", "outputs", NOT_RECORDED, False,
                         f"not checked: {what} registered no output; declare its files in "
                         '[outputs] (e.g. model = "out/model.pt"), or call run.output(name, path)'))  # fmt: skip
    return out


def _summary(record: RunRecord) -> Any:
    """The telemetry summary, or None: a verdict is never lost to a summary that failed."""
    try:
        from acceptrun.telemetry.summary import summarize

        return summarize(record.path)
    except Exception:  # the checks that need it say "not recorded"
        return None


def _setup_checks(record: RunRecord, spec: RunSpec, standalone: bool, summary: Any) -> list[Check]:
    out = []
    prov = record.read_json("provenance.json")
    if prov is None:
        out.append(
            Check(
                "setup",
                "provenance",
                NOT_RECORDED,
                True,
                "no provenance.json",
                "run through `acceptrun run` or `acceptrun.init()`",
            )
        )
    else:
        absent = sorted(k for k, v in prov.items() if isinstance(v, dict) and v.get("absent"))
        note = f"; absent: {', '.join(absent)}" if absent else ""
        out.append(Check("setup", "provenance", PASS, True, f"environment recorded{note}"))
    pre = record.read_json("preflight.json")
    if standalone:
        out.append(
            Check(
                "setup",
                "expectations",
                NOT_RECORDED,
                False,
                "standalone run: no spec, no preflight",
            )
        )
    elif pre is None:
        out.append(
            Check(
                "setup",
                "expectations",
                NOT_RECORDED,
                True,
                "no preflight.json",
                "run through `acceptrun run SPEC`",
            )
        )
    else:
        for c in pre.get("checks", []):
            if c["name"] in ("expectations", "resources", "storage", "device"):
                fix = None if c["ok"] else _PREFLIGHT_FIX.get(c["name"])
                out.append(
                    Check("setup", c["name"], PASS if c["ok"] else FAIL, True, c["message"], fix)
                )
    out.append(_first_step_check(record, spec, summary))
    return out


def _first_step_check(record: RunRecord, spec: RunSpec, summary: Any) -> Check:
    """Launch (run_start: preflight included) to the first step, against max_first_step."""
    limit = spec.acceptance.max_first_step
    seconds = getattr(summary, "first_step_s", None)
    since = "launch"
    if seconds is None:
        tl = run_timeline(record)
        if tl["first_step"] is not None and tl["launch"] is not None:
            seconds, since = tl["first_step"] - tl["launch"], "the first attempt's start"
    if seconds is None:
        return Check("setup", "first step", NOT_RECORDED, limit is not None, "no step events",
                     "log steps with run.steps() / run.log()")  # fmt: skip
    evidence = f"{format_duration(seconds)} after {since}"
    if limit is None:
        return Check("setup", "first step", PASS, False, evidence)
    ok = seconds <= limit
    evidence += f", at most {format_duration(limit)}"
    fix = None if ok else (
        "find the slow part of the start in preflight.json and the report's time breakdown "
        "(data verification, imports, restore), or raise acceptance.max_first_step"
    )  # fmt: skip
    return Check("setup", "first step", PASS if ok else FAIL, True, evidence, fix)


_PREFLIGHT_FIX = {
    "expectations": "install the expected versions, or change [expect] if the new ones are intended",
    "resources": "run on a machine that has the GPUs in [resources], or change [resources]",
    "storage": "free space or fix permissions in the run and checkpoint directories",
    "device": "check the GPU (nvidia-smi, driver logs) or move to another machine",
    "data": "restore the data, or refresh the manifest with `acceptrun data snapshot` if the change is intended",
}


def _data_checks(record: RunRecord, spec: RunSpec, standalone: bool) -> list[Check]:
    if not spec.data.path:
        return [Check("data", "data verified", NOT_RECORDED, False, "the spec names no data")]
    required = bool(spec.data.manifest)
    pre = record.read_json("preflight.json") or {}
    found = next((c for c in pre.get("checks", []) if c["name"] == "data"), None)
    if found is None:
        return [
            Check(
                "data",
                "data verified",
                NOT_RECORDED,
                required,
                "no data check in preflight.json",
                _PREFLIGHT_FIX["data"],
            )
        ]
    if not found["details"].get("verified") and found["ok"]:
        return [
            Check(
                "data",
                "data verified",
                NOT_RECORDED,
                False,
                found["message"],
                "add data.manifest to the spec",
            )
        ]
    status = PASS if found["ok"] else FAIL
    return [
        Check(
            "data",
            "data verified",
            status,
            required,
            found["message"],
            None if found["ok"] else _PREFLIGHT_FIX["data"],
        )
    ]


def _checkpoint_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    """The last checkpoint verifies (re-read and hashed) and, with a mirror, is mirrored."""
    from acceptrun.checkpoint.store import CheckpointStore

    ck = spec.checkpoint
    root = Path(spec.resolve_path(ck.dir)) if ck.dir else record.checkpoints_dir
    configured = ck.every_steps is not None or ck.every is not None
    usage = next(iter(record.events("usage")), None)
    if usage is not None and usage.get("usage") != "client" and not ck.watch:
        configured = False  # the interval has no effect without the client (a spec warning)
    store = CheckpointStore(root)
    latest = store.latest()
    if latest is None:
        if not configured:
            return []
        return [
            Check("data", "last checkpoint", NOT_RECORDED, True, f"no checkpoint committed in {root}",
                  "call run.restore(...) once and run.maybe_checkpoint(step) every step")
        ]  # fmt: skip
    result = store.verify(latest.step)
    mb = result.checked_bytes / 1e6
    if result.ok:
        out = [
            Check(
                "data",
                "last checkpoint",
                PASS,
                configured,
                f"step {latest.step} verified ({len(latest.files)} files, {mb:.1f} MB, {result.seconds:.2f}s)",
            )
        ]
    else:
        out = [Check("data", "last checkpoint", FAIL, configured, "; ".join(result.problems),
                     "the run's newest checkpoint is damaged: `acceptrun ckpt verify` names the file")]  # fmt: skip
    if ck.mirror:
        states = (record.read_json("mirror.json") or {}).get("steps", {})
        state = states.get(str(latest.step), {}).get("state", "not recorded")
        ok = state == "ok"
        out.append(Check("data", "mirror", PASS if ok else FAIL, True,
                         f"step {latest.step} on {ck.mirror}: {state}",
                         None if ok else "the mirror is behind: check its credentials and reachability"))  # fmt: skip
    return out


def _operations_checks(record: RunRecord, spec: RunSpec, standalone: bool) -> list[Check]:
    out = []
    if standalone:
        ends = list(record.events("workload_end"))
        if not ends:
            out.append(
                Check(
                    "operations",
                    "exit",
                    NOT_RECORDED,
                    True,
                    "the workload never reported its end",
                    "call run.finish() or let the script exit",
                )
            )
        else:
            status = str(ends[-1].get("status"))
            out.append(
                Check(
                    "operations",
                    "exit",
                    PASS if status == "ok" else FAIL,
                    True,
                    f"workload ended: {status}",
                    None if status == "ok" else "read the traceback above",
                )
            )
        return out
    attempts = read_attempts(record)
    if not attempts:
        out.append(
            Check(
                "operations",
                "exit",
                NOT_RECORDED,
                True,
                "no attempt ran",
                "see preflight.json for why the run did not launch",
            )
        )
        return out
    last = attempts[-1]
    ok = last["outcome"] == "success"
    fix = None if ok else f"read attempts/{last['attempt']}/stderr.log"
    if not ok and last.get("class"):
        fix = _CLASS_FIX.get(last["class"], fix)
    if last["outcome"] == "wall_time":
        fix = "raise limits.wall_time, or make the run faster"
    out.append(
        Check(
            "operations",
            "exit",
            PASS if ok else FAIL,
            True,
            f"attempt {last['attempt']} {last['reason']} after {format_duration(last['duration_s'])}",
            fix,
        )
    )
    resumes = [e for e in record.events("restored") if e.get("attempt", 0) >= 1]
    if resumes:
        text = "; ".join(
            f"attempt {e['attempt']} from step {e['step']} ({e.get('seconds', 0):.2f}s)"
            for e in resumes
        )
        out.append(Check("operations", "resumed", PASS, False, text))
    failed = [a for a in attempts if a["outcome"] != "success"]
    if failed:
        lost = work_lost(attempts)
        text = "; ".join(
            f"attempt {a['attempt']}: {a.get('class', a['outcome'])} ({a.get('class_reason') or a['reason']})"
            for a in failed
        )
        n = int(lost["steps_lost"])
        text += f"; lost {n} step{'' if n == 1 else 's'}, {format_duration(lost['seconds_lost'])} ({lost['device_seconds_lost']:.1f} device-s)"
        out.append(Check("operations", "failures", PASS, False, text))
    # Restarts the supervisor chose; a resume (`acceptrun resume`) is a person's decision.
    restarts = sum(1 for _ in record.events("restart"))
    within = restarts <= spec.limits.max_restarts
    out.append(
        Check(
            "operations",
            "restarts",
            PASS if within else FAIL,
            True,
            f"{restarts} of at most {spec.limits.max_restarts}",
        )
    )
    for drill in spec.acceptance.drills:
        out.append(_drill_check(record, drill))
    out += _cleanup_checks(record, spec)
    return out


def _fault_checks(record: RunRecord) -> list[Check]:
    """Every fault asked for with ``--inject`` happened: a drill whose fault never fired
    proved nothing, and must not pass as one that did."""
    from acceptrun.workload.inject import unfired

    requested = record.state.get("injected") or []
    if not requested:
        return []
    missed = unfired(requested, list(record.events()))
    if missed:
        return [Check("operations", "injected faults", FAIL, True, "; ".join(missed),
                      "inject at a step the run reaches (a step it logs with run.steps() or "
                      "run.log(step, ...)), or at a time before the attempt ends")]  # fmt: skip
    n = len(requested)
    return [Check("operations", "injected faults", PASS, True,
                  f"{n} fault{'' if n == 1 else 's'} fired as requested: {', '.join(requested)}")]  # fmt: skip


def _cleanup_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    """Every [cleanup] command and removal ran and succeeded (cleanup events)."""
    if not spec.cleanup.commands and not spec.cleanup.remove:
        return []
    events = list(record.events("cleanup"))
    if not events:
        return [Check("operations", "cleanup", NOT_RECORDED, True, "no clean-up ran (the run did not finish)",
                      "run the [cleanup] commands by hand, then remove what [cleanup] remove names")]  # fmt: skip
    failed = [e for e in events if not e.get("ok")]
    if failed:
        what = "; ".join(
            f"{e.get('command') or e.get('remove')}: {e.get('detail')}" for e in failed
        )
        return [Check("operations", "cleanup", FAIL, True, f"{len(failed)} of {len(events)} failed: {what}",
                      "fix the failing clean-up step and run it by hand; the run left things behind")]  # fmt: skip
    removed = sum(len(e.get("removed") or []) for e in events)
    return [Check("operations", "cleanup", PASS, True,
                  f"{len(events)} step{'' if len(events) == 1 else 's'} done, {removed} path{'' if removed == 1 else 's'} removed")]  # fmt: skip


_DRILL_FIX = {
    "restore": "run `acceptrun ckpt drill RUN` (restores the newest checkpoint in a fresh process)",
    "kill": "run `acceptrun drill SPEC` once for this spec (a reference run vs a killed one)",
    "preempt": "run `acceptrun drill SPEC` once for this spec (it also preempts the run)",
}


def _drill_check(record: RunRecord, drill: str) -> Check:
    """A required drill: its result in this run, or (kill, preempt) in a drill of this spec.

    `acceptrun drill SPEC` proves the operations of a spec once, in runs of its own; every
    later run of the same spec (same spec hash) counts that proof. The restore drill
    belongs to the data and checkpoints test, the others to operations.
    """
    check = _drill_result(record, drill)
    if drill == "restore":
        return Check("data", check.name, check.status, check.required, check.evidence, check.fix)
    return check


def _drill_result(record: RunRecord, drill: str) -> Check:
    name = f"drill {drill}"
    own = [e for e in record.events("drill") if e.get("drill") == drill]
    if own and own[-1].get("skipped"):
        # Not applicable to this script (e.g. a preemption of a black box): neither a pass
        # it did not earn nor a failure of the script; the required check stays unproven.
        ev = own[-1]
        return Check("operations", name, NOT_RECORDED, True, str(ev.get("evidence", "")),
                     str(ev.get("fix") or _DRILL_FIX.get(drill) or ""))  # fmt: skip
    if own:
        ok = bool(own[-1].get("ok"))
        return Check(
            "operations",
            name,
            PASS if ok else FAIL,
            True,
            str(own[-1].get("evidence", "")),
            None if ok else _DRILL_FIX.get(drill),
        )
    found = _drill_elsewhere(record, drill) if drill in ("kill", "preempt") else None
    if found is None:
        return Check(
            "operations",
            name,
            NOT_RECORDED,
            True,
            "no result recorded for this drill",
            _DRILL_FIX.get(drill),
        )
    run_id, ev = found
    if ev.get("skipped"):
        return Check("operations", name, NOT_RECORDED, True,
                     f"skipped in drill run {run_id} of the same spec: {ev.get('evidence', '')}",
                     str(ev.get("fix") or _DRILL_FIX.get(drill) or ""))  # fmt: skip
    ok = bool(ev.get("ok"))
    evidence = f"{'passed' if ok else 'failed'} in drill run {run_id} of the same spec: {ev.get('evidence', '')}"
    return Check(
        "operations",
        name,
        PASS if ok else FAIL,
        True,
        evidence,
        None if ok else _DRILL_FIX.get(drill),
    )


def _drill_elsewhere(record: RunRecord, drill: str) -> tuple[str, dict[str, Any]] | None:
    spec_hash = record.state.get("spec_hash")
    runs = record.path.parent
    if not spec_hash or not runs.is_dir():
        return None
    latest: tuple[str, dict[str, Any]] | None = None
    for d in sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")):
        other = RunRecord(d)
        try:
            state = other.state
        except Exception:  # a damaged neighbour must not break this verdict
            continue
        if state.get("spec_hash") != spec_hash or "drill" not in state:
            continue
        for ev in other.events("drill"):
            if ev.get("drill") == drill:
                latest = (other.run_id, ev)
    return latest


_CLASS_FIX = {
    "user_error": "fix the error in stderr.log (import, syntax, missing file, or an exception that recurs at the same place); it is never retried",
    "cuda_oom": "lower the batch size, or use bf16 / activation checkpointing (acceptrun tune)",
    "host_oom": "the host ran out of memory: fewer data-loader workers, smaller prefetch, a bigger machine",
    "diverged": 'lower the learning rate, or set limits.on_divergence = "rollback"',
    "hang": "read stacks.txt in the attempt's directory: where the workload was stuck",
    "data_stall": "the data loader stopped delivering: check the data source and num_workers",
    "distributed": "a collective or rendezvous failed: check every rank's log and the network",
    "gpu_fault": "a GPU error (Xid, ECC, illegal address): check the GPU, or move to another machine",
    "wall_time": "raise limits.wall_time, or make the run faster",
    "idle": "the workload sat idle: see what it waited for in stderr.log and telemetry.jsonl, "
    "or raise limits.idle_window / lower telemetry.idle_threshold",
}


def _performance_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    rng = spec.limits.expected_runtime
    tl = run_timeline(record)
    if tl["launch"] is None or tl["end"] is None:
        return [
            Check(
                "performance",
                "runtime",
                NOT_RECORDED,
                bool(rng),
                "the run has no start and end events",
            )
        ]
    runtime = tl["end"] - tl["launch"]
    if not rng:
        return [
            Check(
                "performance",
                "runtime",
                PASS,
                False,
                f"{format_duration(runtime)} (no expected range in the spec)",
            )
        ]
    lo, hi = rng
    ok = lo <= runtime <= hi
    evidence = (
        f"{format_duration(runtime)}, expected {format_duration(lo)} to {format_duration(hi)}"
    )
    fix = (
        None
        if ok
        else (
            "the run ended early: check that it did all its work"
            if runtime < lo
            else "find what slowed it, or widen limits.expected_runtime"
        )
    )
    return [Check("performance", "runtime", PASS if ok else FAIL, True, evidence, fix)]


def _observability_checks(
    record: RunRecord, spec: RunSpec, standalone: bool, summary: Any
) -> list[Check]:
    """Throughput, data wait share, idle share and telemetry, from the telemetry summary."""
    return [
        *_throughput_check(spec, summary),
        *_data_wait_check(record, spec, standalone, summary),
        *_idle_check(spec, standalone, summary),
        _telemetry_check(record, spec, standalone),
    ]


def _throughput_check(spec: RunSpec, summary: Any) -> list[Check]:
    acc = spec.acceptance
    unit = acc.throughput_unit
    rates = getattr(summary, "throughput", None) or {}
    value = rates.get(unit)
    if not acc.throughput:
        if value is None:
            return []
        return [Check("performance", "throughput", PASS, False,
                      f"median {value:.4g} {unit} (no range in the spec)")]  # fmt: skip
    lo, hi = acc.throughput
    if value is None:
        seen = ", ".join(f"{v:.4g} {u}" for u, v in sorted(rates.items())) or "no timed steps"
        what = unit.split("/")[0]
        return [Check("performance", "throughput", NOT_RECORDED, True,
                      f"no {unit} recorded ({seen})",
                      f"log {what} per step with run.log(step, {what}=...), or change acceptance.throughput_unit")]  # fmt: skip
    ok = lo <= value <= hi
    evidence = f"median {value:.4g} {unit}, expected {lo:g} to {hi:g}"
    fix = None
    if value < lo:
        fix = ("find the bottleneck in the report's time breakdown and hints (data wait, "
               "checkpoint stall, idle GPU), or lower acceptance.throughput if the range was wrong")  # fmt: skip
    elif value > hi:
        fix = ("faster than expected: check that each step does all its work (batch size, "
               "sequence length), or raise acceptance.throughput")  # fmt: skip
    return [Check("performance", "throughput", PASS if ok else FAIL, True, evidence, fix)]


# Less step time than this (seconds, all steps together) is too little to judge a run's
# data wait on: a smoke run's loader start-up (forking workers, the first epoch) dominates it.
DATA_WAIT_MIN_STEP_S = 3.0


def _data_wait_check(
    record: RunRecord, spec: RunSpec, standalone: bool, summary: Any
) -> list[Check]:
    limit = spec.acceptance.max_data_wait
    share = getattr(summary, "data_wait_share", None)
    if limit is None:
        return []
    if share is None:
        usage = next(iter(record.events("usage")), None)
        if usage is not None and usage.get("usage") != "client":
            return [Check("performance", "data wait", NOT_RECORDED, False,
                          "not checked: only the client's `with run.data_wait():` around the "
                          "batch fetch measures time waiting for data")]  # fmt: skip
        return [Check("performance", "data wait", NOT_RECORDED, False,
                      "the loop never timed its data waits",
                      "wrap the batch fetch in `with run.data_wait():`")]  # fmt: skip
    step_s = sum(
        float(ev["step_time"])
        for ev in record.events("step")
        if isinstance(ev.get("step_time"), int | float)
    )
    ok = share <= limit
    evidence = f"{100 * share:.1f}% of step time waiting for data, at most {100 * limit:.0f}%"
    judged = not standalone and step_s >= DATA_WAIT_MIN_STEP_S
    if standalone:
        evidence += " (a standalone run)"
    elif not judged:
        evidence += f" (only {step_s:.1f}s of steps: too little to judge)"
    fix = None if ok else (
        "the loop waits for data: more DataLoader workers, pin_memory and prefetch, "
        "or faster storage; or raise acceptance.max_data_wait"
    )  # fmt: skip
    return [Check("performance", "data wait", PASS if ok else FAIL, judged, evidence, fix)]


def _idle_check(spec: RunSpec, standalone: bool, summary: Any) -> list[Check]:
    limit = spec.acceptance.max_idle
    share = getattr(summary, "idle_share", None)
    if limit is None or share is None:
        return []
    on_gpu = bool(getattr(summary, "gpus", None))
    threshold = spec.telemetry.idle_threshold
    source = f"GPU utilization below {threshold:g}%" if on_gpu else (
        f"workload CPU below {threshold:g}% of one core"
    )  # fmt: skip
    ok = share <= limit
    required = on_gpu and not standalone
    evidence = f"{100 * share:.1f}% of samples idle ({source}), at most {100 * limit:.0f}%"
    if not required:
        evidence += "; a standalone run" if on_gpu else "; CPU only"
    fix = None if ok else (
        "the device sat idle: find the gaps in the report's GPU timeline (data, checkpoints, "
        "a stuck rank); telemetry.idle_action = \"stop\" ends idle runs early"
    )  # fmt: skip
    return [Check("performance", "idle", PASS if ok else FAIL, required, evidence, fix)]


def _telemetry_check(record: RunRecord, spec: RunSpec, standalone: bool) -> Check:
    """Host and GPU samples exist (a GPU run must have GPU samples to explain itself)."""
    required = not standalone and spec.resources.gpus > 0
    counts: dict[str, int] = {}
    absent: list[str] = []
    errors: list[str] = []
    if record.telemetry_path.exists():
        for line in read_jsonl(record.telemetry_path):
            kind = str(line.get("kind"))
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "gpu_absent":
                absent.append(str(line.get("reason")))
            elif kind == "sampler_error":
                errors.append(f"{line.get('sampler')}: {line.get('error')}")
    host, gpu = counts.get("host", 0), counts.get("gpu", 0)
    if not host and not gpu:
        return Check("performance", "telemetry", NOT_RECORDED, required,
                     "no host or GPU samples in telemetry.jsonl",
                     "run through `acceptrun run` (the supervisor samples the machine)")  # fmt: skip
    parts = [f"{host} host samples"]
    if gpu:
        parts.append(f"{gpu} GPU samples")
    elif absent:
        parts.append(f"no GPU samples ({absent[-1]})")
    if errors:
        parts.append(f"sampler errors: {'; '.join(dict.fromkeys(errors))}")
    evidence = ", ".join(parts)
    if required and not gpu:
        return Check("performance", "telemetry", FAIL, True, evidence,
                     "GPU telemetry is missing: install nvidia-ml-py and check NVML (nvidia-smi) on the machine")  # fmt: skip
    return Check("performance", "telemetry", PASS, required, evidence)


def _exit_checks(record: RunRecord) -> list[Check]:
    """Portability: informational, unless a finding blocks repeating the run elsewhere."""
    from acceptrun.verdict.portability import check_run

    try:
        report = check_run(record)
    except Exception as exc:  # a verdict is never lost to a portability check that failed
        return [Check("exit", "portability", NOT_RECORDED, False, f"not checked: {type(exc).__name__}: {exc}")]  # fmt: skip
    blockers, warnings = report.blockers, report.warnings
    if blockers:
        first = blockers[0]
        text = "; ".join(f"{f.where}: {f.why}" for f in blockers)
        return [Check("exit", "portability", FAIL, True, text, first.fix)]
    notes = len(report.findings) - len(warnings)
    evidence = "no blockers"
    if warnings:
        shown = "; ".join(f"{f.where} ({f.kind})" for f in warnings[:4])
        more = f" and {len(warnings) - 4} more" if len(warnings) > 4 else ""
        evidence += f"; {len(warnings)} warning{'s' if len(warnings) != 1 else ''}: {shown}{more}"
    if notes:
        evidence += f"; {notes} note{'s' if notes != 1 else ''}"
    evidence += " (`acceptrun portability RUN`)"
    return [Check("exit", "portability", PASS, True, evidence)]


def _result_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    out = []
    last_metric: dict[str, Any] = {}
    outputs: dict[str, dict[str, Any]] = {}
    missing: dict[str, dict[str, Any]] = {}  # declared ([outputs]) and not found, newest last
    for ev in record.events("metric", "output", "output_missing"):
        name = str(ev.get("name"))
        if ev["kind"] == "metric":
            last_metric[name] = ev.get("value")
        elif ev["kind"] == "output":
            outputs[name] = ev
            missing.pop(name, None)
        else:
            missing[name] = ev
            outputs.pop(name, None)
    for name, text in spec.acceptance.metrics.items():
        cond = parse_condition(text)
        value = last_metric.get(name)
        if value is None:
            known = ", ".join(sorted(last_metric)) or "none"
            out.append(
                Check(
                    "results",
                    f"metric {name}",
                    NOT_RECORDED,
                    True,
                    f"never reported (metrics seen: {known})",
                    f'report it with run.metric("{name}", value)',
                )
            )
            continue
        ok = isinstance(value, int | float) and math.isfinite(value) and cond.check(value)
        out.append(
            Check(
                "results",
                f"metric {name}",
                PASS if ok else FAIL,
                True,
                f"{value:.6g} {'meets' if ok else 'misses'} {cond}",
                None if ok else "the run did not reach its target; see the loss curve",
            )
        )
    for name in spec.acceptance.outputs:
        registered = outputs.get(name)
        if registered is None and name in missing:
            ev = missing[name]
            out.append(Check("results", f"output {name}", FAIL, True,
                             f"declared as {ev.get('pattern')!r} in [outputs], not found after "
                             f"attempt {ev.get('attempt')}: {ev.get('reason')}",
                             f"make the script write it, or fix [outputs] {name} in the spec"))  # fmt: skip
            continue
        if registered is None:
            out.append(
                Check(
                    "results",
                    f"output {name}",
                    NOT_RECORDED,
                    True,
                    "never registered",
                    f'register it with run.output("{name}", path), or declare it in [outputs]',
                )
            )
            continue
        out.append(_verify_output(name, registered))
    extra = sorted(set(outputs) - set(spec.acceptance.outputs))
    for name in extra:
        out.append(_verify_output(name, outputs[name], required=False))
    for name in sorted(set(missing) - set(spec.acceptance.outputs)):
        ev = missing[name]
        out.append(Check("results", f"output {name}", FAIL, False,
                         f"declared in [outputs], not found: {ev.get('reason')}"))  # fmt: skip
    return out


def _verify_output(name: str, ev: dict[str, Any], *, required: bool = True) -> Check:
    path = Path(str(ev.get("path")))
    if not path.is_file():
        return Check(
            "results",
            f"output {name}",
            FAIL,
            required,
            f"{path} is gone",
            "outputs must stay where they were registered, or use copy=True",
        )
    digest, size = hash_file(path)
    if digest != ev.get("hash"):
        return Check(
            "results",
            f"output {name}",
            FAIL,
            required,
            f"{path} changed after it was registered ({ev.get('hash')} -> {digest})",
            "register the output again after its last write",
        )
    return Check(
        "results", f"output {name}", PASS, required, f"{path} ({_size(size)}, {digest[:25]}...)"
    )


def _cost_checks(record: RunRecord, spec: RunSpec) -> list[Check]:
    """Budget respected (when the spec has one) and where the money went, from ledger.json."""
    ledger = record.read_json("ledger.json")
    budget = spec.limits.budget_usd
    if not isinstance(ledger, dict) or not ledger.get("priced"):
        if budget is None:
            return []
        return [Check("operations", "budget", NOT_RECORDED, True, "no priced ledger.json", "set cost.price_per_hour or cost.provider/instance")]  # fmt: skip
    compute = ledger.get("compute", {})
    usd = float(compute.get("usd", 0.0))
    label = (ledger.get("price") or {}).get("label", "?")
    out = []
    if budget is not None:
        ok = usd <= budget + 1e-9
        out.append(Check("operations", "budget", PASS if ok else FAIL, True, f"{format_usd(usd)} of {format_usd(budget)} USD ({label})", None if ok else "raise limits.budget_usd, or find the waste in `acceptrun cost show`"))  # fmt: skip
    split = compute.get("split_s", {})
    billed = sum(v for v in split.values() if isinstance(v, int | float))
    parts = ", ".join(
        f"{k.replace('_', ' ')} {100 * v / billed:.0f}%"
        for k, v in sorted(split.items(), key=lambda kv: -kv[1])
        if isinstance(v, int | float) and billed > 0
    )
    total = float(ledger.get("total_usd", usd))
    text = f"{format_usd(total)} USD in all; compute {format_usd(usd)} USD, billed {format_duration(billed)}"
    text += f" ({parts})" if parts else ""
    behind = (ledger.get("storage") or {}).get("left_behind") or {}
    left = float(behind.get("monthly_usd") or 0.0) + float(behind.get("mirror_monthly_usd") or 0.0)
    if left > 0:
        text += f"; left behind costs {format_usd(left)} USD/month"
    out.append(Check("operations", "cost", PASS, False, f"{text} ({label})"))
    return out


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


_MARK = {PASS: "✓", FAIL: "✗", NOT_RECORDED: "–"}


def format_verdict(verdict: Verdict, *, name: str = "") -> str:
    """Terminal summary: the verdict, then one line per check with its evidence."""
    lines = [f"{verdict.label}  {name + '  ' if name else ''}{verdict.run_id}"]
    width = max((len(c.name) for c in verdict.checks), default=10)
    for c in verdict.checks:
        tag = "" if c.required or c.status == PASS else " (info)"
        lines.append(
            f"  {_MARK.get(c.status, '?')} {c.group:<11} {c.name:<{width}}  {c.evidence}{tag}"
        )
        if c.status != PASS and c.fix and c.required:
            lines.append(f"    {'':<11} {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)
