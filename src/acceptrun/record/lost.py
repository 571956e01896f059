"""Work lost to failures: exact, bounded, or unknown, and never an unknown shown as zero.

One fact, one figure: the supervisor writes each attempt's lost work into its exit record
(``work``: supervisor/outcome.py ``attempt_work``), close sums it into run.json ``work``
with :func:`lost_work`, and every view (the verdict, the ledger, ``show``, the report,
the board) prints :meth:`LostWork.steps_text` / :meth:`LostWork.text` of that sum, or of
one attempt's :meth:`LostWork.of_work`. No view counts lost steps itself.

Steps lost are a range ``[low, high]``:

- exact (``low == high``): the workload logged every step (the client's ``run.steps()``),
  and the newest checkpoint's step is known;
- at most ``high``: counted from a checkpoint whose step is an estimate (never later than
  the state it holds), so fewer may be lost;
- between ``low`` and ``high``: progress is seen every N steps (a progress line or a
  TensorBoard scalar every 500 iterations): up to N - 1 steps may have run after the
  last one seen, and are lost too;
- at least ``low`` (``high`` None): an attempt whose end went unrecorded, counted from
  its events (supervisor/lease.py);
- unknown (``low == 0``, ``high`` None): a script whose progress is not read (a black box
  without ``progress``) or that failed before anything said where it was;
- unknown after step N (``unknown_after``): step lines that could not be ordered were
  dropped from step N on (supervisor/counter.py), so what ran after N is not known.

>>> LostWork(0, 499, 12.0, 12.0).steps_text()
'at most 499 steps'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from acceptrun.spec.model import format_duration

__all__ = ["LostWork", "lost_work"]


@dataclass(frozen=True, slots=True)
class LostWork:
    """Steps lost as a range (``high`` None: no upper bound known) and the time lost.

    ``seconds`` is wall time since the newest checkpoint's step (or the attempt's start),
    ``device_seconds`` that time on every device of the run; ``seconds_at_least`` says the
    time is a lower bound (an end its supervisor could not record), ``seconds_at_most``
    an upper one (timed from the attempt's start: the checkpoint's step was not logged).
    """

    low: int
    high: int | None
    seconds: float
    device_seconds: float
    seconds_at_least: bool = False
    seconds_at_most: bool = False
    # exit.json's own "steps_lost" (the steps counted after the checkpoint), summed: the
    # same word means the same figure in exit.json and run.json; the range says its bounds.
    counted: int = 0
    unknown_after: int | None = None  # the first step after which progress was unknown

    @classmethod
    def of_work(cls, work: Mapping[str, Any] | None) -> LostWork:
        """One attempt's lost work from its exit record's ``work``.

        ``steps_lost_range`` (written since this module exists) is read as it is; an older
        record's flags give the same range: ``lost_at_most`` -> [0, n], ``lost_at_least``
        -> [n, unbounded], neither -> exactly n.
        """
        work = work or {}
        n = _int(work.get("steps_lost"))
        seconds, device = _num(work.get("seconds_lost")), _num(work.get("device_seconds_lost"))
        least = bool(work.get("lost_at_least"))
        most = bool(work.get("seconds_lost_at_most"))
        span = work.get("steps_lost_range")
        after = work.get("steps_unknown_after")
        after = int(after) if isinstance(after, int) and not isinstance(after, bool) else None
        if isinstance(span, list | tuple) and len(span) == 2:
            low, high = _int(span[0]), span[1]
            high = _int(high) if high is not None else None
            return cls(low, high, seconds, device, least, most, n, after)
        if least:
            return cls(n, None, seconds, device, True, counted=n)
        if work.get("lost_at_most"):
            return cls(0, n, seconds, device, False, most, n)
        return cls(n, n, seconds, device, False, most, n)

    @property
    def exact(self) -> bool:
        return self.high is not None and self.low == self.high

    @property
    def known(self) -> bool:
        """Whether anything bounds the steps lost (False: "an unknown number of steps")."""
        return self.high is not None or self.low > 0

    def __add__(self, other: LostWork) -> LostWork:
        high = None if self.high is None or other.high is None else self.high + other.high
        return LostWork(
            self.low + other.low,
            high,
            self.seconds + other.seconds,
            self.device_seconds + other.device_seconds,
            self.seconds_at_least or other.seconds_at_least,
            self.seconds_at_most or other.seconds_at_most,
            self.counted + other.counted,
            min((s for s in (self.unknown_after, other.unknown_after) if s is not None),
                default=None),
        )  # fmt: skip

    def steps_text(self) -> str:
        """ "40 steps", "at most 499 steps", "between 3 and 502 steps", "at least 7 steps",
        "an unknown number of steps", "at least 7 steps (progress unknown after step 40)":
        what every view prints for the steps lost."""
        low, high = self.low, self.high
        if high is None:
            text = f"at least {_steps(low)}" if low else "an unknown number of steps"
            if self.unknown_after is not None:
                text += f" (progress unknown after step {self.unknown_after})"
            return text
        if low == high:
            return _steps(low)
        if low == 0:
            return f"at most {_steps(high)}"
        return f"between {low} and {_steps(high)}"

    def seconds_text(self) -> str:
        """ "1m20s"; "at least 1m20s" for an end that went unrecorded, "at most 1m20s" when
        timed from an attempt's start (both: "about 1m20s")."""
        least, most = self.seconds_at_least, self.seconds_at_most
        bound = "about " if least and most else "at least " if least else "at most " if most else ""
        return bound + format_duration(self.seconds)

    def text(self) -> str:
        """ "at most 499 steps, 1m20s (80.0 device-s)": the steps, then the time."""
        return f"{self.steps_text()}, {self.seconds_text()} ({self.device_seconds:.1f} device-s)"

    def to_dict(self) -> dict[str, Any]:
        """What close writes into run.json ``work``: ``steps_lost`` as each exit.json counts
        it, summed; ``steps_lost_range`` its bounds; ``lost`` the text every view prints."""
        return {
            "steps_lost": self.counted,
            "steps_lost_range": [self.low, self.high],
            "seconds_lost": round(self.seconds, 3),
            "device_seconds_lost": round(self.device_seconds, 3),
            "lost_at_least": self.seconds_at_least,
            "seconds_lost_at_most": self.seconds_at_most,
            **({} if self.unknown_after is None else {"steps_unknown_after": self.unknown_after}),
            "lost": self.text(),
        }


NONE_LOST = LostWork(0, 0, 0.0, 0.0)


def lost_work(attempts: Iterable[Mapping[str, Any]]) -> LostWork:
    """The work every failed attempt lost, summed (an attempt that succeeded lost none)."""
    total = NONE_LOST
    for a in attempts:
        if a.get("outcome") == "success":
            continue
        work = a.get("work")
        total = total + LostWork.of_work(work if isinstance(work, Mapping) else None)
    return total


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and value == value else 0


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
