"""One monotone step from what a step line says: a step, or an epoch and a batch.

Scripts count their progress in many ways. nanoGPT prints a global ``iter 100``; the
ImageNet example prints ``Epoch: [2][ 30/50]``, whose batch counter starts again each
epoch; Keras prints ``Epoch 3/10`` on a line of its own, then a batch bar ``12/100``; the
Trainer prints a fraction of epochs, ``'epoch': 0.5``. A :class:`StepClock` turns each
into one step of the attempt's own counter (the supervisor's :class:`~acceptrun.supervisor.
axis.StepAxis` then offsets a resumed attempt's counter onto the run's axis):

- ``step``: the step as printed;
- ``epoch`` and ``batch`` (alias ``iter``): ``(epoch - progress.first_epoch) * length +
  batch``, the length from a ``total`` group (the ``i/len`` form) or ``progress.epoch_length``;
- ``batch`` alone, or ``step`` with a length: the counter restarts each epoch, and each
  time it goes back an epoch is counted;
- ``epoch`` alone on a line with a value: a fraction of epochs done, ``round(epoch *
  length)``; ``epoch`` alone on a line without one (Keras's ``Epoch 3/10``) sets the epoch
  of the batch lines that follow, and is no step.

A counter that still goes back is never dropped in silence. Back to where it started (at
most one print interval above its first value): the script restarted its count, and the
steps after it are offset to follow the last one, as on a resume, with a warning that
names the key that makes them exact. Anywhere else: the lines cannot be ordered (two
counters, say a train and an eval loop, read by one pattern); they are dropped and
counted, and one warning says which figures are therefore unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["COUNTER_GROUPS", "StepClock"]

# Groups that say where a line is on the step axis; none of them is a value (a metric).
COUNTER_GROUPS = ("step", "epoch", "batch", "iter", "total")


class StepClock:
    """The attempt's script step of each matched line (module docstring)."""

    def __init__(
        self,
        *,
        epoch_length: int | None,
        first_epoch: int,
        warn: Callable[[str, str], Any],
    ) -> None:
        self.epoch_length = epoch_length
        self.first_epoch = first_epoch
        self.warn = warn  # (reason, message): reason is "restarted", "unordered" or "first_epoch"
        self.epoch: float | None = None  # the epoch an epoch-only line set
        self.counted = 0  # epochs counted from a counter going back, when no epoch is printed
        self.offset = 0  # added after a restart: the steps follow the last one
        self.last: int | None = None  # the newest step given out
        self.last_raw: int | None = None  # its counter as composed, before the offset
        self.first_raw: int | None = None  # the first composed counter since the last restart
        self.gap: int | None = None  # the smallest rise between two lines since then
        self.restarts = 0
        self.dropped = 0
        self._said: set[str] = set()

    def read(self, values: dict[str, Any]) -> int | None:
        """The step of a matched line, with the counter groups taken out of ``values``.

        None when the line is no step: an epoch line, or a line dropped as unordered.
        """
        epoch = values.pop("epoch", None)
        batch = values.pop("batch", values.pop("iter", None))
        step = values.pop("step", None)
        total = values.pop("total", None)
        length = _whole(total) or self.epoch_length
        if step is None and batch is None:
            if epoch is None:
                return None
            if not values or length is None:  # Keras's "Epoch 3/10": the epoch of what follows
                self.epoch = epoch
                return None
            raw = round(epoch * length)  # the Trainer's 'epoch': 0.5, a fraction done
        else:
            if epoch is not None:
                self.epoch = epoch
            raw = self._compose(int(step if step is not None else batch), length, step is None)
        return self._order(raw)

    def _compose(self, count: int, length: int | None, is_batch: bool) -> int:
        if length is None:
            return count
        if is_batch and self.epoch is not None:
            index = int(self.epoch) - self.first_epoch
            if index < 0 and "first_epoch" not in self._said:
                self._said.add("first_epoch")
                self.warn("first_epoch", f"progress: epoch {int(self.epoch)} was read, below "
                          f"progress.first_epoch = {self.first_epoch}: set "
                          "progress.first_epoch = 0 if the script counts epochs from 0")  # fmt: skip
            return max(index, 0) * length + count
        # No epoch printed: an epoch passes each time the counter goes back.
        if self.last_raw is not None and count < self.last_raw - self.counted * length:
            self.counted += 1
        return self.counted * length + count

    def _order(self, raw: int) -> int | None:
        if self.last_raw is None or self.first_raw is None:
            self.first_raw = raw
        elif raw > self.last_raw:
            rise = raw - self.last_raw
            self.gap = rise if self.gap is None else min(self.gap, rise)
        elif raw < self.last_raw:
            if raw > self.first_raw + (self.gap or 0):
                self._drop(raw)
                return None
            self._restart(raw)
        step = raw + self.offset
        self.last_raw, self.last = raw, step
        return step

    def _restart(self, raw: int) -> None:
        assert self.last is not None and self.last_raw is not None
        self.restarts += 1
        # Follow the last step: exact when the last line was the count's last step, a
        # lower bound otherwise (the steps between it and the restart are not printed).
        self.offset = self.last + 1 - raw
        if "restarted" not in self._said:
            self._said.add("restarted")
            # The count's span and one print interval: the lines after the last are unseen.
            first = self.first_raw if self.first_raw is not None else 0
            guess = self.last_raw - first + (self.gap or 1)
            self.warn("restarted", f"progress: the step counter went back from {self.last_raw} "
                      f"to {raw} and is read as a count that started again: the steps after "
                      f"it follow step {self.last} (at least their true step); name the "
                      "epoch in progress.pattern with (?P<epoch>\\d+) and (?P<batch>\\d+), "
                      f"or set progress.epoch_length (about {guess} by these lines), to "
                      "make them exact")  # fmt: skip
        self.first_raw, self.gap = raw, None

    def _drop(self, raw: int) -> None:
        self.dropped += 1
        if "unordered" not in self._said:
            self._said.add("unordered")
            self.warn("unordered", f"progress: the step counter went back from {self.last_raw} "
                      f"to {raw}, not to where it started: these lines cannot be ordered (two "
                      "counters read by one pattern?) and are dropped, so the last step, the "
                      "lost work and the step times after step "
                      f"{self.last} are unknown; make progress.pattern match one counter, or "
                      "name its epoch with (?P<epoch>\\d+)")  # fmt: skip


def _whole(value: Any) -> int | None:
    """A positive whole length, or None."""
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 1:
        return int(value)
    return None
