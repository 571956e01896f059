"""Group 3, performance and observability: runtime, throughput, data wait, idle share,
telemetry present.

Throughput, data wait and idle share are figures of the telemetry summary
(:attr:`CheckInput.summary`); when the summary failed, the checks that need it say so.
Also, for a script without step events, that its step time was not checked.
"""

from __future__ import annotations

from acceptrun._util.durable import read_jsonl
from acceptrun.record.glossary import DEVICE_IDLE, MODEL_THROUGHPUT
from acceptrun.record.view import run_timeline
from acceptrun.spec.model import format_duration
from acceptrun.verdict.core import FAIL, NOT_RECORDED, PASS, Check, CheckInput

__all__ = [
    "DATA_WAIT_MIN_STEP_S",
    "black_box_step_time",
    "data_wait",
    "idle",
    "runtime",
    "telemetry",
    "throughput",
]

# Less step time than this (seconds, all steps together) is too little to judge a run's
# data wait on: a smoke run's loader start-up (forking workers, the first epoch) dominates it.
DATA_WAIT_MIN_STEP_S = 3.0


def runtime(given: CheckInput) -> list[Check]:
    """Launch to the end of the last attempt, within limits.expected_runtime."""
    rng = given.spec.limits.expected_runtime
    tl = run_timeline(given.record)
    if tl["launch"] is None or tl["end"] is None:
        return [Check("performance", "runtime", NOT_RECORDED, bool(rng),
                      "the run has no start and end events")]  # fmt: skip
    seconds = tl["end"] - tl["launch"]
    if not rng:
        return [Check("performance", "runtime", PASS, False,
                      f"{format_duration(seconds)} (no expected range in the spec)")]  # fmt: skip
    lo, hi = rng
    ok = lo <= seconds <= hi
    evidence = (
        f"{format_duration(seconds)}, expected {format_duration(lo)} to {format_duration(hi)}"
    )
    fix = None
    if seconds < lo:
        fix = "the run ended early: check that it did all its work"
    elif seconds > hi:
        fix = "find what slowed it, or widen limits.expected_runtime"
    return [Check("performance", "runtime", PASS if ok else FAIL, True, evidence, fix)]


def throughput(given: CheckInput) -> list[Check]:
    """The median steady-state rate in acceptance.throughput_unit, within acceptance.throughput."""
    acc = given.spec.acceptance
    unit = acc.throughput_unit
    summary = given.summary
    rates = (None if summary is None else summary.throughput) or {}
    value = rates.get(unit)
    if not acc.throughput:
        if value is None:
            return []
        return [Check("performance", "throughput", PASS, False,
                      f"{MODEL_THROUGHPUT} median {value:.4g} {unit} (no range in the spec)")]  # fmt: skip
    lo, hi = acc.throughput
    if given.summary_failure is not None:
        return [Check("performance", "throughput", NOT_RECORDED, True, given.summary_failure,
                      _SUMMARY_FIX)]  # fmt: skip
    if value is None:
        seen = ", ".join(f"{v:.4g} {u}" for u, v in sorted(rates.items())) or "no timed steps"
        what = unit.split("/")[0]
        return [Check("performance", "throughput", NOT_RECORDED, True,
                      f"no {unit} recorded ({seen})",
                      f"log {what} per step with run.log(step, {what}=...), or change acceptance.throughput_unit")]  # fmt: skip
    ok = lo <= value <= hi
    evidence = f"{MODEL_THROUGHPUT} median {value:.4g} {unit}, expected {lo:g} to {hi:g}"
    fix = None
    if value < lo:
        fix = ("find the bottleneck in the report's time breakdown and hints (data wait, "
               "checkpoint stall, idle GPU), or lower acceptance.throughput if the range was wrong")  # fmt: skip
    elif value > hi:
        fix = ("faster than expected: check that each step does all its work (batch size, "
               "sequence length), or raise acceptance.throughput")  # fmt: skip
    return [Check("performance", "throughput", PASS if ok else FAIL, True, evidence, fix)]


# The fix of a check whose figure the failed summary should have given.
_SUMMARY_FIX = (
    "read the best_effort_failed event in events.jsonl (its traceback), then "
    "`acceptrun verdict RUN` again once summarize() reads this record"
)


def _step_seconds(given: CheckInput) -> float:
    """The logged step time of the whole run, read from the step log in chunks."""
    import math

    import numpy as np

    from acceptrun.record.view import RecordView

    total = 0.0
    for c in RecordView(given.record).step_log.chunks():
        st = c.values.get("step_time")
        if st is not None:
            total += math.fsum(st[~np.isnan(st)])
    return total


def data_wait(given: CheckInput) -> list[Check]:
    """The share of step time spent waiting for data, at most acceptance.max_data_wait.

    Required in a supervised run with at least DATA_WAIT_MIN_STEP_S seconds of steps.
    """
    limit = given.spec.acceptance.max_data_wait
    if limit is None:
        return []
    summary = given.summary
    share = None if summary is None else summary.data_wait_share
    if given.summary_failure is not None:
        return [Check("performance", "data wait", NOT_RECORDED, False, given.summary_failure,
                      _SUMMARY_FIX)]  # fmt: skip
    if share is None:
        if given.usage not in (None, "client"):
            return [Check("performance", "data wait", NOT_RECORDED, False,
                          "not checked: only the client's `with run.data_wait():` around the "
                          "batch fetch measures time waiting for data")]  # fmt: skip
        return [Check("performance", "data wait", NOT_RECORDED, False,
                      "the loop never timed its data waits",
                      "wrap the batch fetch in `with run.data_wait():`")]  # fmt: skip
    step_s = _step_seconds(given)
    ok = share <= limit
    evidence = f"{100 * share:.1f}% of step time waiting for data, at most {100 * limit:.0f}%"
    judged = not given.standalone and step_s >= DATA_WAIT_MIN_STEP_S
    if given.standalone:
        evidence += " (a standalone run)"
    elif not judged:
        evidence += f" (only {step_s:.1f}s of steps: too little to judge)"
    fix = None if ok else (
        "the loop waits for data: more DataLoader workers, pin_memory and prefetch, "
        "or faster storage; or raise acceptance.max_data_wait"
    )  # fmt: skip
    return [Check("performance", "data wait", PASS if ok else FAIL, judged, evidence, fix)]


def idle(given: CheckInput) -> list[Check]:
    """The share of samples with the device idle, at most acceptance.max_idle.

    Required when measured on GPUs; a CPU process's share of one core is too weak a
    signal to reject a run on, so it is shown for information.
    """
    limit = given.spec.acceptance.max_idle
    if limit is None:
        return []
    summary = given.summary
    if given.summary_failure is not None:
        return [Check("performance", "idle", NOT_RECORDED, False, given.summary_failure,
                      _SUMMARY_FIX)]  # fmt: skip
    share = None if summary is None else summary.idle_share
    if summary is None or share is None:
        return []
    on_gpu = bool(summary.gpus)
    threshold = given.spec.telemetry.idle_threshold
    source = f"GPU utilization below {threshold:g}%" if on_gpu else (
        f"workload CPU below {threshold:g}% of one core"
    )  # fmt: skip
    ok = share <= limit
    required = on_gpu and not given.standalone
    evidence = (
        f"{DEVICE_IDLE} in {100 * share:.1f}% of samples ({source}), at most {100 * limit:.0f}%"
    )
    brief = f"{DEVICE_IDLE} in {100 * share:.1f}% of samples, at most {100 * limit:.0f}%"
    if not required:
        evidence += "; a standalone run" if on_gpu else "; CPU only"
        brief += "; a standalone run" if on_gpu else "; CPU only"
    fix = None if ok else (
        "the device sat idle: find the gaps in the report's GPU timeline (data, checkpoints, "
        "a stuck rank); telemetry.idle_action = \"stop\" ends idle runs early"
    )  # fmt: skip
    return [Check("performance", "idle", PASS if ok else FAIL, required, evidence, fix, brief)]


def telemetry(given: CheckInput) -> list[Check]:
    """Host and GPU samples exist (a GPU run must have GPU samples to explain itself)."""
    record = given.record
    required = not given.standalone and given.spec.resources.gpus > 0
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
        return [Check("performance", "telemetry", NOT_RECORDED, required,
                      "no host or GPU samples in telemetry.jsonl",
                      "run through `acceptrun run` (the supervisor samples the machine)")]  # fmt: skip
    parts = [f"{host} host samples"]
    if gpu:
        parts.append(f"{gpu} GPU samples")
    elif absent:
        parts.append(f"no GPU samples ({absent[-1]})")
    if errors:
        parts.append(f"sampler errors: {'; '.join(dict.fromkeys(errors))}")
    evidence = ", ".join(parts)
    if required and not gpu:
        return [Check("performance", "telemetry", FAIL, True, evidence,
                      "GPU telemetry is missing: install nvidia-ml-py and check NVML (nvidia-smi) on the machine")]  # fmt: skip
    return [Check("performance", "telemetry", PASS, required, evidence)]


def black_box_step_time(given: CheckInput) -> list[Check]:
    """A script that wrote no step events: its step time was not checked (information)."""
    what = given.black_box
    if what is None or "step" in given.event_kinds():
        return []
    return [Check("performance", "step time", NOT_RECORDED, False,
                  f"not checked: {what} wrote no step events; set progress.pattern "
                  "(a regex over its step lines) or progress.tensorboard, or call "
                  "run.log(step, loss=...)")]  # fmt: skip
