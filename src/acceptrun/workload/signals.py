"""Stop requests in the workload: SIGTERM, the agreed step boundary, the exit as stopped.

The supervisor asks for a graceful stop with SIGTERM. Inside :meth:`~acceptrun.workload.loop.StepLoop.steps`
(or after :meth:`StopHandling.handle_stops`, for a framework's own loop) the signal only
sets a flag; the loop ends at the next step boundary, checkpoints what is done, writes a
``stopped`` event and exits with status 143 (:data:`~acceptrun.workload.contract.EXIT_STOPPED`).

In a run of several processes the ranks get the signal at different steps. They decide
together, at a boundary every rank reaches the same number of times: ``steps()`` at the
top of each step, a loop of its own (a framework's) through :meth:`StopHandling.should_stop`,
called once per step on every rank. Either is one collective (an all_reduce on a gloo
group of acceptrun's own) that carries the step number, so ranks that call it at
different points get an error naming the steps instead of a stop that reaches some
ranks only. :attr:`StopHandling.stop_requested` is the decision of the last such call.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from typing import NoReturn

from acceptrun.errors import UserError
from acceptrun.workload.base import RunBase
from acceptrun.workload.contract import EXIT_STOPPED

__all__ = ["StopHandling"]

# The point steps() gives the agreement: no step a loop of the script's own can pass, so
# a rank in steps()' agreement and one in should_stop() never pass for the same point.
_STEPS_LOOP = -(2**62)
# A rank waiting this long in one stop agreement says so on stderr (the attempt's
# stderr.log): another rank may never come (the contract of should_stop() broken), or be
# slow (rank 0 copying a large checkpoint). Seconds; checked every _WAIT_POLL_S.
STOP_WAIT_WARN_S = 120.0
_WAIT_POLL_S = 5.0


class StopHandling(RunBase):
    """Stop requests and the exit they end in (a part of :class:`~acceptrun.workload.run.Run`)."""

    _wait_watch: threading.Thread | None = None  # says when a stop agreement waits long

    def _stop_agreed(self) -> bool:
        """Whether to stop at this step boundary of ``steps()``; every rank's answer."""
        return self._decide_stop(_STEPS_LOOP)

    def should_stop(self, step: int) -> bool:
        """Whether to stop now, after ``step``: the same answer on every rank.

        For a loop that is not :meth:`steps` (a framework's, your own): call it once per
        step, at the same point of the step, on every rank, and when it returns True save
        the state after ``step`` and call :meth:`exit_stopped`. It also takes SIGTERM as
        a stop request from now on, as :meth:`handle_stops` does (call that before the
        loop, so that a stop before the first boundary waits for it too).

        One process: reads the flag the signal set (under 1 us). Several (torchrun): one
        all_reduce of three numbers on acceptrun's own gloo group (CPU, no GPU sync; 0.7 ms
        on 2 ranks of a loaded 2-core machine, bench/stop_agreement.py), so the ranks,
        which get the signal at different steps, all stop after the same one. It is a
        collective: a rank that does not call it leaves the others waiting (a rank that
        waits 120 s in it says so on stderr; with ``limits.hang_window`` the supervisor
        names the phase ``stop_agreement``), and ranks that call it with different ``step`` values (one
        calls it twice a step, or from another hook) raise :class:`~acceptrun.errors.UserError`
        on every rank, naming the steps. Needs ``torch.distributed.init_process_group()``
        first; without it each rank answers for its own signal. ::

            run.handle_stops()
            for step in range(start, total):
                train_step()
                if run.should_stop(step):
                    run.checkpoint(step, block=True)
                    run.exit_stopped(step, checkpoint=step)
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < -1:
            raise UserError(
                f"run.should_stop(step={step!r}): step must be the number of the step just "
                "finished, an int >= 0 (or -1 before the first step)"
            )
        self._loop_stops = True
        return self._decide_stop(step)

    def _decide_stop(self, point: int) -> bool:
        """Whether to stop at ``point``; in a multi-process run, decided by all ranks at once.

        Ranks get the SIGTERM (forwarded by torchrun's agent) at different steps; at each
        boundary they agree (an all_reduce, MAX, of the flag and of the point and its
        negation: every rank learns whether any was asked to stop, and the highest and
        lowest point the ranks called from, which must be the same).
        """
        if not self.ranks.distributed:
            return self._stop_requested  # set by the signal handler: no one to agree with
        group = self._rank_group()
        if group is None:  # no torch.distributed: each rank stops on its own signal
            self._stop_requested = self._stop_requested or self._stop_signal
            return self._stop_requested
        import torch
        import torch.distributed as dist

        if self._wait_watch is None:
            self._wait_watch = threading.Thread(
                target=self._watch_stop_wait, name="acceptrun-stop-wait", daemon=True
            )
            self._wait_watch.start()
        outer = self._phase
        # What the heartbeat says while a rank waits here for the others: a rank that
        # never comes (a contract broken) shows as a hang in phase "stop_agreement".
        self._phase = ("stop_agreement", None if point == _STEPS_LOOP else point, time.time())
        try:
            value = torch.tensor([int(self._stop_signal), point, -point], dtype=torch.int64)
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group.main)
        finally:
            self._phase = outer
        flag, high, neg_low = value.tolist()
        low = -neg_low
        if high != low:
            raise UserError(_mismatch(point, low, high, self.rank))
        self._stop_requested = bool(flag)
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

    def _watch_stop_wait(self) -> None:
        """Say on stderr, once per wait, that this rank waits long in a stop agreement."""
        warned = None
        while not self.finished:
            time.sleep(_WAIT_POLL_S)  # seconds; reads one tuple, costs the loop nothing
            phase, step, since = self._phase
            waited = time.time() - since
            if phase == "stop_agreement" and since != warned and waited >= STOP_WAIT_WARN_S:
                warned = since
                print(_waiting(self.rank, step, waited), file=sys.stderr, flush=True)

    @property
    def stop_requested(self) -> bool:
        """True once the workload is to stop: the supervisor (or a preemption) asked for it.

        One process: True as soon as SIGTERM arrives. Several: True on every rank at
        once, from the boundary (:meth:`steps`' or :meth:`should_stop`'s) where the ranks
        agreed to stop, so acting on it cannot split the ranks; a rank's own signal alone
        does not set it. A loop of its own polls :meth:`should_stop`, not this.
        """
        return self._stop_requested

    def handle_stops(self) -> None:
        """Take SIGTERM as a stop request outside :meth:`steps` too, for a loop run elsewhere.

        A framework's own loop (the Hugging Face Trainer, Lightning) calls this once, then
        asks :meth:`should_stop` at its step boundaries, saves, and calls
        :meth:`exit_stopped`. Without it SIGTERM outside ``steps()`` keeps its default
        effect (the process dies at once).
        """
        self._loop_stops = True

    def exit_stopped(self, step: int, *, checkpoint: int | None) -> NoReturn:
        """Record a graceful stop after ``step`` (``checkpoint``: the step saved) and exit 143.

        For loops that ask :meth:`should_stop` (see :meth:`handle_stops`); the state
        must already be saved. Raises ``SystemExit(143)``, the status of a process ended
        by SIGTERM, which the supervisor reads with the ``stopped`` event. In a run of
        several processes every rank calls it after the same :meth:`should_stop`: they
        meet at a barrier first (rank 0 may still be writing the checkpoint) and exit
        together.
        """
        self._stopping = True
        if self._checkpointer is not None:
            self._checkpointer.wait()  # a run.checkpoint() of the script's still in flight
        self.record.event(
            "stopped", sync=True, attempt=self.attempt, step=step, checkpoint=checkpoint,
            reason="stop requested", **self._rank_field(),
        )  # fmt: skip
        if self._group is not None:
            # Exit together: torchrun's agent takes a rank that exits first for a failure
            # and would tear the others down in the middle of their exit (or their save).
            self._group.barrier()
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

    def _before_shutdown(self) -> None:
        """The last save committed and the mirror drained, as the interpreter starts to exit.

        This runs among threading's exit hooks, before concurrent.futures refuses new work
        and before atexit's handlers: s3fs (aiobotocore) resolves names and reads files in a
        thread pool, so a mirror drained later, in :meth:`_at_exit`, failed every upload
        with "cannot schedule new futures after interpreter shutdown" and the run's last
        checkpoint never left the machine. It also runs before the interpreter joins the
        script's own non-daemon threads: a save such a thread makes after the main thread
        has returned is not mirrored; it stays pending in mirror.json, which the verdict's
        mirror check reports.
        """
        if self.finished or os.getpid() != self._pid:
            return
        self._close_checkpoints_once()  # finish() records a failure as the status

    def _at_exit(self) -> None:
        if self.finished or os.getpid() != self._pid:
            return  # a forked child's exit is not the workload's end (nor its record's)
        status = "ok"
        if self._stop_requested or self._stopping:  # _stopping: exit_stopped() or the loop's stop
            status = "stopped"
        elif self._exception is not None:
            status = f"error: {type(self._exception).__name__}: {self._exception}"
        self.finish(status)

    def _excepthook(
        self, tp: type[BaseException], value: BaseException, tb: types.TracebackType | None
    ) -> None:
        self._exception = value
        sys.__excepthook__(tp, value, tb)


def _mismatch(point: int, low: int, high: int, rank: int) -> str:
    """The error when ranks met in one stop agreement from different points of their loops."""
    here = "run.steps()" if point == _STEPS_LOOP else f"run.should_stop({point})"
    if low == _STEPS_LOOP:
        there = f"one rank was in run.steps() and another called run.should_stop({high})"
    else:
        there = f"the ranks called run.should_stop() with steps from {low} to {high}"
    return (
        f"the ranks disagree on where they decide a stop ({there}; rank {rank} was in "
        f"{here}): every rank must call run.should_stop(step) once per step, at the same "
        "point of the loop, and not inside run.steps(), which decides by itself"
    )


def _waiting(rank: int, step: int | None, waited: float) -> str:
    """The line a rank prints when it has waited long in one stop agreement."""
    where = "at a step boundary of run.steps()" if step is None else f"in run.should_stop({step})"
    return (
        f"acceptrun: rank {rank} has waited {waited:.0f} s {where} for the other ranks; "
        "if one of them does not call it at this point (once per step, every rank), this "
        "is a deadlock (docs/multi-process.md, 'Loops of their own')"
    )
