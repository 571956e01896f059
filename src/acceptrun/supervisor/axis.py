"""One step axis for a whole run, when a script's own counter starts again after a resume.

Many scripts' ``--resume`` load the weights and count their iterations from 0 again. Read
as they are, the resumed attempt's steps fall below the step it resumed from: a save after
490 would be dated 20, retention would keep an older attempt's checkpoints and delete the
newest, lost work would compare two counters, and the loss curve would fold back on
itself. Each attempt of a black box therefore reads its steps through a
:class:`StepAxis`:

- the first step the attempt reports (a ``progress.pattern`` line, a TensorBoard scalar,
  a watched file's name) decides, once: lower than the step the attempt resumed from
  means the counter started again, and the attempt's steps are then offset by that step
  (the script's step *k* is the run's step *resumed + k*);
- the decision is a ``step_counter_restarted`` event (attempt, resumed-from step, the
  first step seen, the offset, where it was seen), which ``acceptrun show`` names;
- a first step equal to the resumed step is ambiguous by the steps alone; TensorBoard's
  reader tells a restart apart by wall time (:meth:`StepAxis.restarted`);
- a first attempt, or one that resumed from nothing, is never offset.

So the run's steps and its checkpoints' steps are one counter. Where a counter still
goes back unnoticed, the store keeps the order in which checkpoints were committed
(checkpoint/sequence.py): retention and resume follow that, never the steps alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["StepAxis"]


class StepAxis:
    """The run-wide step of each step an attempt reports (module docstring)."""

    def __init__(
        self,
        attempt: int,
        resume_step: int | None,
        on_event: Callable[[str, dict[str, Any]], Any] | None = None,
    ) -> None:
        self.attempt = attempt
        self.resume_step = resume_step
        self.on_event = on_event
        self.offset: int | None = 0 if resume_step is None else None  # None: not decided yet
        self._lock = threading.Lock()  # the progress reader and the watcher's thread

    def run_step(self, step: int, source: str) -> int:
        """``step`` as the script reported it, on the run's axis."""
        offset = self.offset  # once decided it never changes: no lock on every step line
        if offset is not None:
            return step + offset
        with self._lock:
            if self.offset is None:
                assert self.resume_step is not None
                restarted = step < self.resume_step
                self.offset = self.resume_step if restarted else 0
                if restarted and self.on_event is not None:
                    self.on_event(
                        "step_counter_restarted",
                        {
                            "resumed_from": self.resume_step,
                            "first_step": step,
                            "offset": self.offset,
                            "source": source,
                        },
                    )
            return step + self.offset

    def restarted(self, first_step: int, source: str, why: str) -> None:
        """Decide, before the first step is read, that the counter started again.

        For a first step that the steps alone cannot place: equal to the resumed step,
        it may be the script's step after a restart (told apart by wall time, for
        TensorBoard: supervisor/progress.py). No-op once decided.
        """
        with self._lock:
            if self.offset is not None or self.resume_step is None:
                return
            self.offset = self.resume_step
            if self.on_event is not None:
                self.on_event(
                    "step_counter_restarted",
                    {"resumed_from": self.resume_step, "first_step": first_step,
                     "offset": self.offset, "source": source, "why": why},
                )  # fmt: skip
