"""What the workload watches in itself: divergence, heartbeats, stacks, injected faults.

Under the supervisor a thread writes a ``heartbeat`` event every ``ACCEPTRUN_HEARTBEAT_S``
seconds with the loop's phase (how a hang is told from a slow step), faulthandler dumps
every thread's stack on SIGUSR2, a NaN/inf loss (or one above ``limits.max_loss``) ends
the process as ``diverged``, and a drill's injected step faults fire.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from acceptrun.workload.base import RunBase
from acceptrun.workload.contract import (
    ENV_HEARTBEAT_S,
    ENV_INJECT,
    ENV_INJECT_RANK,
    EXIT_DIVERGED,
    HEARTBEAT_S,
    STACKS_FILE,
    divergence,
)

__all__ = ["WorkloadWatch"]


class WorkloadWatch(RunBase):
    """Divergence, heartbeats, stacks, faults (a part of :class:`~acceptrun.workload.run.Run`)."""

    def _check_divergence(self, step: int, loss: float) -> None:
        """NaN/inf, or above ``limits.max_loss``: record it and exit, with no checkpoint.

        Saving here would make a diverged state the newest checkpoint, the one every
        restart and rollback would then start from.
        """
        reason = divergence(step, loss, self.spec.limits.max_loss)
        if reason is None:
            return
        self.record.event(
            "diverged", sync=True, attempt=self.attempt, step=step, loss=str(loss), reason=reason,
            **self._rank_field(),
        )  # fmt: skip
        self._in_steps = False
        raise SystemExit(EXIT_DIVERGED)

    def _start_watch_aids(self) -> None:
        """Heartbeats, stack dumps on SIGUSR2, and the faults a drill asked for."""
        adir = self.record.attempt_dir(self.attempt)
        adir.mkdir(parents=True, exist_ok=True)
        if threading.current_thread() is threading.main_thread():
            import faulthandler

            # Before killing a hung attempt the supervisor sends SIGUSR2: every thread's
            # Python stack lands in stacks.txt, written from C, even with the GIL held.
            # One file per rank (torchrun forwards SIGUSR2 to all): interleaved dumps are unreadable.
            name = STACKS_FILE if self.rank == 0 else f"stacks-rank{self.rank}.txt"
            self._stacks_file = open(adir / name, "a")  # noqa: SIM115 - kept open for the handler
            faulthandler.register(signal.SIGUSR2, file=self._stacks_file, all_threads=True)
        if self.rank == 0:
            # Rank 0's heartbeats are enough: a rank stuck anywhere holds rank 0 in the
            # step's next collective, where its phase says "step" (a hang).
            interval = float(os.environ.get(ENV_HEARTBEAT_S) or HEARTBEAT_S)
            threading.Thread(
                target=self._heartbeat, args=(interval,), name="acceptrun-heartbeat", daemon=True
            ).start()
        if os.environ.get(ENV_INJECT) and self.rank == int(os.environ.get(ENV_INJECT_RANK) or 0):
            from acceptrun.workload import inject

            self._faults = inject.faults_for_attempt(os.environ[ENV_INJECT], self.attempt)

    def _heartbeat(self, interval: float) -> None:
        # A thread of its own: it keeps beating while the main thread is inside a C call
        # (a collective, a data-loader wait), which is how a hang is told from a crash.
        while not self.finished:
            time.sleep(interval)
            phase, step, since = self._phase
            try:
                self.record.event(
                    "heartbeat",
                    attempt=self.attempt,
                    phase=phase,
                    step=step,
                    phase_s=round(time.time() - since, 3),
                )
            except Exception:  # the record went away, or the interpreter is shutting down
                return

    def _fire_faults(self, step: int, phase: str) -> None:
        from acceptrun.workload import inject

        inject.fire(self, step, phase)
