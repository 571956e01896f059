"""Plain-language hints from a run's summary: one sentence each, the figure and the fix.

A hint is written only when the evidence is real: enough steps or samples, and a figure
past its named threshold below. :func:`make_hints` is called by
:func:`acceptrun.telemetry.summary.summarize`; it reads figures, never files.

>>> make_hints(summary, Evidence(restarts=2, steps_redone=120))
['data wait is 34% of step time: raise DataLoader num_workers, enable pin_memory, or prefetch']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acceptrun.record.glossary import DEVICE_IDLE
from acceptrun.spec.model import format_duration

if TYPE_CHECKING:
    from acceptrun.telemetry.summary import Summary

__all__ = [
    "CHECKPOINT_STALL_SHARE",
    "DATA_WAIT_SHARE",
    "DRIFT_CHANGE",
    "FIRST_STEP_SHARE",
    "FIRST_STEP_WAIT_S",
    "IDLE_SHARE",
    "LOW_MFU",
    "MEMORY_PEAK_SHARE",
    "MIN_GPU_SAMPLES",
    "MIN_STEPS",
    "POWER_CAPPED_SHARE",
    "RESTART_COST_S",
    "THROTTLED_SHARE",
    "Evidence",
    "make_hints",
]

MIN_STEPS = 5  # fewer timed steps than this: no hint about step time at all
MIN_GPU_SAMPLES = 5  # fewer GPU samples than this: no hint about the GPU
DATA_WAIT_SHARE = 0.10  # data wait over step time
CHECKPOINT_STALL_SHARE = 0.05  # checkpoint stall over step time
FIRST_STEP_WAIT_S = 60.0  # seconds before the first step of the first attempt ...
FIRST_STEP_SHARE = 0.10  # ... that are also this share of the run's wall time
POWER_CAPPED_SHARE = 0.10  # share of GPU samples with a power-cap clock event
THROTTLED_SHARE = 0.05  # share of GPU samples with a thermal or hardware slowdown
DRIFT_CHANGE = 0.20  # step time grew this much from the first to the last quarter
MEMORY_PEAK_SHARE = 0.50  # GPU memory peak below this share of the GPU's memory
IDLE_SHARE = 0.20  # share of samples below telemetry.idle_threshold
LOW_MFU = 0.20  # MFU below this is worth a profile
RESTART_COST_S = 1.0  # restarts that cost less than this many seconds are not worth a word
GIB = float(1 << 30)


@dataclass(kw_only=True)
class Evidence:
    """What the hints need beyond the summary's own fields."""

    restarts: int = 0
    steps_redone: int = 0
    redone_at_most: bool = False  # a resume from a step that is an estimate: an upper bound
    first_attempt_wait: float | None = None  # seconds, launch to the first step of attempt 1
    step_seconds: float = 0.0  # step time summed over all steps
    idle_threshold: float = 5.0
    idle_source: str | None = None  # "gpu" or "process"
    xids: list[dict[str, Any]] = field(default_factory=list)
    black_box: bool = False  # the script does not use the client: its saves are its own


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def make_hints(summary: Summary, ev: Evidence) -> list[str]:
    """Hints in order of how much time they explain, roughly: data, checkpoints, start-up,
    restarts, idle, GPU limits, drift, memory headroom, MFU."""
    gpus = [g for g in summary.gpus if (g.get("samples") or 0) >= MIN_GPU_SAMPLES]
    hints = _time_hints(summary, ev) + _gpu_limit_hints(gpus, ev)
    return hints + _headroom_hints(summary, gpus)


def _time_hints(summary: Summary, ev: Evidence) -> list[str]:
    """Where the run's time went that it could get back: data, checkpoints, start-up,
    restarts, idle."""
    hints: list[str] = []
    timed = int(summary.step_time["n"]) if summary.step_time else 0
    bd = summary.breakdown
    share = summary.data_wait_share
    if share is not None and timed >= MIN_STEPS and share >= DATA_WAIT_SHARE:
        hints.append(
            f"data wait is {_pct(share)} of step time: raise DataLoader num_workers, "
            "enable pin_memory, or prefetch"
        )
    stall = bd.get("checkpoint_stall", 0.0)
    if ev.step_seconds > 0 and stall / ev.step_seconds >= CHECKPOINT_STALL_SHARE:
        hints.append(
            f"checkpoint stall is {_pct(stall / ev.step_seconds)} of step time "
            f"({format_duration(stall)}): save less often (checkpoint.every, "
            "checkpoint.every_steps) or checkpoint less state"
        )
    wait, wall = ev.first_attempt_wait, summary.wall_s
    if (
        wait is not None
        and wall
        and wait >= FIRST_STEP_WAIT_S
        and wait / wall >= FIRST_STEP_SHARE
        and summary.steps
    ):
        who = "GPU" if summary.gpus else "the run was"
        hints.append(
            f"{who} idle {format_duration(wait)} before the first step "
            f"({_pct(wait / wall)} of the run): startup, imports, restore"
        )
    cost = bd.get("restarts", 0.0)
    if ev.restarts and cost >= RESTART_COST_S:
        plural = "s" if ev.restarts != 1 else ""
        fix = (
            "have the script save more often (checkpoint.watch captures each save)"
            if ev.black_box
            else "checkpoint more often to redo less (checkpoint.every, checkpoint.every_steps)"
        )
        hints.append(
            f"restarts cost {format_duration(cost)} ({ev.restarts} restart{plural}, "
            f"{'at most ' if ev.redone_at_most else ''}"
            f"{ev.steps_redone} step{'' if ev.steps_redone == 1 else 's'} redone): {fix}"
        )
    idle = summary.idle_share
    if idle is not None and idle >= IDLE_SHARE and ev.idle_source is not None:
        what = "GPU utilization" if ev.idle_source == "gpu" else "workload CPU"
        hints.append(
            f"{DEVICE_IDLE} {_pct(idle)} of the sampled time ({what} below {ev.idle_threshold:g}%): "
            "look for waits outside the loop (evaluation, logging, I/O), or set "
            "limits.idle_window to stop idle runs"
        )
    return hints


def _gpu_limit_hints(gpus: list[dict[str, Any]], ev: Evidence) -> list[str]:
    """A GPU held back by its power cap or its temperature, or failing (ECC, Xid)."""
    hints: list[str] = []
    for g in gpus:
        capped, throttled = g.get("power_capped_share"), g.get("throttled_share")
        if capped is not None and capped >= POWER_CAPPED_SHARE:
            hints.append(
                f"GPU {g['index']} power-capped {_pct(capped)} of the time: check the power "
                "limit (nvidia-smi -q -d POWER)"
            )
        if throttled is not None and throttled >= THROTTLED_SHARE:
            hints.append(
                f"GPU {g['index']} thermal or hardware slowdown {_pct(throttled)} of the time "
                f"(max {g.get('temp_max')} °C): check cooling and clocks "
                "(nvidia-smi -q -d PERFORMANCE)"
            )
        ecc = g.get("ecc_uncorrected")
        if ecc:
            hints.append(
                f"GPU {g['index']} reported {ecc:.0f} uncorrected ECC errors: drain the node "
                "and have the GPU checked"
            )
    if ev.xids:
        codes = sorted({str(x.get("xid")) for x in ev.xids})
        hints.append(
            f"NVML reported Xid {', '.join(codes)} during the run: see the xid events and the "
            "driver log (dmesg); repeated Xids mean a faulty GPU or driver"
        )
    return hints


def _headroom_hints(summary: Summary, gpus: list[dict[str, Any]]) -> list[str]:
    """What the run leaves on the table: step time that drifts, memory, MFU."""
    hints: list[str] = []
    timed = int(summary.step_time["n"]) if summary.step_time else 0
    drift = summary.drift
    if drift is not None and drift["change"] >= DRIFT_CHANGE:
        hints.append(
            f"step time grew {_pct(drift['change'])} from the first to the last quarter "
            f"({drift['first_p50'] * 1000:.1f} -> {drift['last_p50'] * 1000:.1f} ms): look "
            "for growing state (memory, caches, logged tensors kept on the GPU)"
        )
    for g in gpus:
        peak, total = g.get("mem_peak"), g.get("mem_total")
        if peak and total and timed >= MIN_STEPS and peak / total < MEMORY_PEAK_SHARE:
            hints.append(
                f"GPU {g['index']} memory peak {_pct(peak / total)} of {total / GIB:.0f} GiB: "
                "a larger batch may raise throughput (acceptrun tune)"
            )
    if summary.mfu is not None and timed >= MIN_STEPS and summary.mfu < LOW_MFU:
        hints.append(
            f"MFU is {100 * summary.mfu:.1f}% of the peak: profile a few steps "
            "(torch.profiler) and try bf16 autocast, torch.compile or a larger batch"
        )
    return hints
