"""The training loop's side of a run: steps, step events, timings.

:meth:`StepLoop.steps` yields step numbers like ``range`` and writes each step's event
(the supervisor's heartbeat of progress) when the loop body finishes; :meth:`StepLoop.log`
adds values to it; :meth:`StepLoop.data_wait` times the wait for data.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from acceptrun.workload import standby
from acceptrun.workload.base import RunBase, _number
from acceptrun.workload.contract import ENV_MAX_STEPS
from acceptrun.workload.liveness import check_supervisor

__all__ = ["StepLoop"]

# A step event's own fields: run.log() refuses them as value names.
_RESERVED = frozenset({"t", "kind", "attempt", "step"})


class StepLoop(RunBase):
    """Steps, their events and timings (a part of :class:`~acceptrun.workload.run.Run`)."""

    def steps(self, start_or_total: int, total: int | None = None) -> Iterator[int]:
        """Yield step numbers like ``range``: ``steps(100)`` is 0..99, ``steps(40, 100)`` 40..99.

        Each step is timed and its event (a heartbeat for the supervisor) written when
        the loop body finishes. A stop request (SIGTERM from the supervisor, a
        preemption) ends the loop at the next step boundary: the step in flight
        completes, the state after it is checkpointed when :meth:`restore` registered
        objects, and the process exits with status 143, as one killed by SIGTERM would.
        """
        standby.wait_for_go(self)  # a standby attempt never steps before its turn
        start, total = (0, start_or_total) if total is None else (start_or_total, total)
        cap = os.environ.get(ENV_MAX_STEPS)
        if cap and not self.drill:  # a short measuring run (acceptrun scaling)
            total = min(total, start + int(cap))
        if self.drill and start >= total > 0:
            # A drill of a finished run restores its final checkpoint: still run one step.
            start = total - 1
        self._in_steps = True
        self._total_steps = total  # in each step event: `acceptrun top` shows step/total, ETA
        step = start
        try:
            while step < total:
                check_supervisor(self)  # gone: stop here as for SIGTERM (workload/liveness.py)
                if self._stop_agreed():
                    self._stop_at(step)
                t0 = time.perf_counter()
                self._data_wait = 0.0
                self._phase = ("step", step, time.time())
                try:
                    yield step
                except GeneratorExit:
                    # `break` (or `return`) in the loop body: the step is done, keep its
                    # event. An exception in the body also closes this generator; that
                    # step did not complete and is not recorded.
                    if _closed_by_break():
                        self._end_step(step, time.perf_counter() - t0)
                    raise
                self._end_step(step, time.perf_counter() - t0)
                if self.drill:
                    self._finish_drill(step, time.perf_counter() - t0)
                step += 1
            if self.ranks.distributed and self._checkpointer is not None:
                # The last save's collectives run on acceptrun's own process groups, which
                # the script's destroy_process_group() after the loop would tear down.
                self._checkpointer.wait()
        finally:
            self._in_steps = False

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time spent in this block counts as waiting for data (the data loader's stall)."""
        t0 = time.perf_counter()
        outer = self._phase
        self._phase = ("data_wait", outer[1], time.time())  # seen by the heartbeat thread
        try:
            yield
        finally:
            self._data_wait += time.perf_counter() - t0
            self._phase = outer

    def log(self, step: int, **values: float) -> None:
        """Record values for ``step`` (loss, samples, tokens, lr, ...).

        Inside :meth:`steps` the values join the step's event, written when the step
        ends. Outside it, each call writes a step event timed from the previous call.
        Cost: about 10 us per step (``bench/long_run.py`` prints it); step records are held
        for at most 0.2 s and written together (:class:`~acceptrun.record.stepwriter.StepWriter`).
        On a GPU, the ``.item()`` that produces a loss value is the expensive part (a
        device sync), not this call. The names ``t``, ``kind``, ``attempt`` and ``step`` are
        the event's own and cannot be values.
        """
        for k, v in values.items():  # the kwargs dict is this call's own: cleaned in place
            t = type(v)
            if t is not float and t is not int:
                values[k] = _number(v)
        if not _RESERVED.isdisjoint(values):
            raise ValueError(
                f"run.log: {sorted(_RESERVED.intersection(values))} name the step event's own "
                "fields (t, kind, attempt, step); log the value under another name"
            )
        if self._pending:
            self._pending.update(values)
        else:
            self._pending = values
        if self._in_steps:
            return
        now = time.perf_counter()
        step_time = None if self._last_log is None else now - self._last_log
        self._last_log = now
        self._end_step(step, step_time)  # injected step faults fire in this loop too

    def _end_step(self, step: int, step_time: float | None) -> None:
        """The step is done: its faults (a NaN loss first), its event, then the others."""
        if self._faults:
            self._fire_faults(step, "before_emit")
        self._emit_step(step, step_time)
        if self._faults:
            self._fire_faults(step, "after_step")

    def _emit_step(self, step: int, step_time: float | None) -> None:
        pending = self._pending  # numbers only (log() cleaned them)
        self._pending = {}
        self._last_values, self._last_values_step = pending, step
        if self.drill:
            return  # a drill proves the restore; its step is not part of the run
        event: dict[str, Any] = {
            "t": round(time.time(), 6),
            "kind": "step",
            "attempt": self.attempt,
            "step": step,
        }
        if self._in_steps and self._total_steps is not None:
            event["total_steps"] = self._total_steps
        if step_time is not None:
            event["step_time"] = round(step_time, 6)
        if self._data_wait:
            event["data_wait"] = round(self._data_wait, 6)
        event.update(pending)
        if self.rank == 0:  # one step event per step for the run, not one per rank
            self.record.step_event(event, defer=True)  # written within 0.2 s
        loss = event.get("loss")
        if self.supervised and isinstance(loss, int | float):
            self._check_divergence(step, float(loss))


def _closed_by_break() -> bool:
    """Whether the ``for`` loop over :meth:`Run.steps` ended by ``break``/``return``.

    Called while the generator handles GeneratorExit: the loop's frame is the caller,
    and it is at the POP_TOP that drops the iterator after a ``break`` or ``return``;
    an exception unwinding the loop leaves it at the instruction that raised. (A
    CPython detail: elsewhere, or for a generator closed another way, False.)
    """
    import dis

    frame = sys._getframe(2)  # 0: here, 1: steps(), 2: the loop that closed it
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == dis.opmap["POP_TOP"]
