"""Stop requests in the workload: SIGTERM, the agreed step boundary, the exit as stopped.

The supervisor asks for a graceful stop with SIGTERM. Inside :meth:`~acceptrun.workload.loop.StepLoop.steps`
(or after :meth:`StopHandling.handle_stops`, for a framework's own loop) the signal only
sets a flag; the loop ends at the next step boundary, checkpoints what is done, writes a
``stopped`` event and exits with status 143 (:data:`~acceptrun.workload.contract.EXIT_STOPPED`).
"""

from __future__ import annotations

import os
import signal
import sys
import types
from typing import NoReturn

from acceptrun.workload.base import RunBase
from acceptrun.workload.contract import EXIT_STOPPED

__all__ = ["StopHandling"]


class StopHandling(RunBase):
    """Stop requests and the exit they end in (a part of :class:`~acceptrun.workload.run.Run`)."""

    def _stop_agreed(self) -> bool:
        """Whether to stop at this step boundary; in a multi-process run, every rank's answer.

        Ranks get the SIGTERM (forwarded by torchrun's agent) at different steps; each
        boundary they agree (a collective of one number) so that all stop at the same one.
        """
        if self.ranks.distributed and (group := self._rank_group()) is not None:
            self._stop_requested = group.agree(self._stop_signal)
        return self._stop_requested

    def _stop_at(self, step: int) -> None:
        """A stop request at a step boundary: checkpoint what is done, then exit 143."""
        self._in_steps = False
        self._stopping = True
        saved = None
        registered = self._objects or self._per_rank
        if registered and step > 0 and self._last_saved_step != step - 1:
            self.checkpoint(step - 1, block=True)
            saved = step - 1
        elif self._checkpointer is not None:
            self._checkpointer.wait()
            saved = self._last_saved_step
        self.record.event(
            "stopped",
            sync=True,
            attempt=self.attempt,
            step=step,
            checkpoint=saved,
            reason="stop requested",
            **self._rank_field(),
        )
        if self._group is not None:
            # Exit together: torchrun's agent takes a rank that exits first for a failure
            # and would tear the others down in the middle of their exit.
            self._group.barrier()
        raise SystemExit(EXIT_STOPPED)

    @property
    def stop_requested(self) -> bool:
        """True once the supervisor (or a preemption) asked the workload to stop."""
        return self._stop_requested

    def handle_stops(self) -> None:
        """Take SIGTERM as a stop request outside :meth:`steps` too, for a loop run elsewhere.

        A framework's own loop (the Hugging Face Trainer, Lightning) calls this once, then
        polls :attr:`stop_requested` at its step boundaries, saves, and calls
        :meth:`exit_stopped`. Without it SIGTERM outside ``steps()`` keeps its default
        effect (the process dies at once).
        """
        self._loop_stops = True

    def exit_stopped(self, step: int, *, checkpoint: int | None) -> NoReturn:
        """Record a graceful stop after ``step`` (``checkpoint``: the step saved) and exit 143.

        For loops that poll :attr:`stop_requested` (see :meth:`handle_stops`); the state
        must already be saved. Raises ``SystemExit(143)``, the status of a process ended
        by SIGTERM, which the supervisor reads with the ``stopped`` event.
        """
        self._stopping = True
        self.record.event(
            "stopped", sync=True, attempt=self.attempt, step=step, checkpoint=checkpoint,
            reason="stop requested", **self._rank_field(),
        )  # fmt: skip
        raise SystemExit(EXIT_STOPPED)

    def _on_stop_signal(self, signum: int, frame: types.FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked data-loader worker inherited this handler. The main process owns
            # the stop (checkpoint, then exit); a worker that died here would instead
            # crash the loop with "DataLoader worker killed". It ends with its parent.
            return
        if self._stopping:
            # Already checkpointing to exit. The signal comes again when a stop reaches
            # the workload twice: torchrun's agent repeats it, and under Slurm both the
            # job step and the supervisor send it. A second one must not kill the save.
            return
        if not (self._in_steps or self._loop_stops):
            # Not in a loop we control: behave as if we had never installed a handler.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._stop_signal = True
        if not self.ranks.distributed:
            self._stop_requested = True  # one process: no one to agree with
        if self.rank == 0:
            self.record.event(
                "stop_requested", attempt=self.attempt, signal=signal.Signals(signum).name
            )

    def _at_exit(self) -> None:
        if self.finished:
            return
        status = "ok"
        if self._stop_requested:
            status = "stopped"
        elif self._exception is not None:
            status = f"error: {type(self._exception).__name__}: {self._exception}"
        self.finish(status)

    def _excepthook(
        self, tp: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> None:
        self._exception = value
        sys.__excepthook__(tp, value, tb)
