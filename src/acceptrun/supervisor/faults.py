"""Injected faults the supervisor fires itself (``acceptrun run --inject``).

The workload's client fires its own step faults; the supervisor fires those a script
cannot: a time fault (``kill@time=30s``: SIGKILL or SIGTERM once the attempt has run that
long) for any command, and a black box's ``kill``/``term@step=N``, sent when the progress
reader has seen step N (the script may be a step or two further by then) and, for
``:after=checkpoint``, once the attempt's first checkpoint was captured. Each is a
``fault_injected`` event; the signal goes as an outside event would (``signal_stop``: the
command's process, or its group), never as a stop request.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.workload.contract import ENV_INJECT

__all__ = ["black_box_step_faults", "fire_step_faults", "fire_time_fault", "time_faults"]

SignalStop = Callable[[int], None]  # sends a signal to the attempt, as an outside event would


def time_faults(env: Mapping[str, str], attempt: int) -> list[Any]:
    """Injected faults with a time (``kill@time=30s``): fired by the supervisor itself."""
    text = env.get(ENV_INJECT)
    if not text:
        return []
    from acceptrun.workload import inject

    return inject.time_faults(inject.parse_faults(text), attempt)


def black_box_step_faults(env: Mapping[str, str], attempt: int) -> list[Any]:
    """Injected ``kill``/``term`` step faults, which the supervisor fires for a black box."""
    text = env.get(ENV_INJECT)
    if not text:
        return []
    from acceptrun.workload import inject

    return [f for f in inject.faults_for_attempt(text, attempt) if f.action in ("kill", "term")]


def fire_time_fault(record: RunRecord, attempt: int, fault: Any, signal_stop: SignalStop) -> None:
    """A time fault is due: record it and send its signal."""
    record.event(
        "fault_injected", sync=True, attempt=attempt, action=fault.action, after_s=fault.after_s
    )
    signal_stop(_signal_of(fault))


def fire_step_faults(
    record: RunRecord,
    attempt: int,
    faults: list[Any],
    last_step: int | None,
    checkpoint: int | None,
    signal_stop: SignalStop,
) -> str | None:
    """Fire the black box's step faults now due (taken out of ``faults``).

    ``checkpoint`` is the step of the attempt's newest commit, None before one. Returns
    the fault fired (its text, as the attempt's exit reason names it), None for none.
    """
    from acceptrun.workload.inject import due_after_checkpoint

    if last_step is None:
        return None
    fired = None
    for fault in [f for f in faults if due_after_checkpoint(f, last_step, checkpoint)]:
        faults.remove(fault)
        record.event(
            "fault_injected", sync=True, attempt=attempt, action=fault.action,
            step=fault.step, seen_step=last_step, by="supervisor",
        )  # fmt: skip
        signal_stop(_signal_of(fault))
        fired = str(fault).removesuffix(f":attempt={fault.attempt}")
    return fired


def _signal_of(fault: Any) -> int:
    return signal.SIGKILL if fault.action == "kill" else signal.SIGTERM
