"""One meaning per word: the names every view gives a figure, and whether it is good or bad.

docs/report.md ("Glossary") defines each word; the ledger, the verdict's checks, the
terminal, the HTML report and the board take their labels and colours from here, so
the same word never names two figures and the same part never wears two colours.

- **productive**: billed time in steps that were kept;
- **wasted**: billed time whose work was thrown away (a failure's lost time, a failed
  attempt's start-up);
- **no step**: billed time in which no step ran (launch, start-up, backoff, the tail,
  rounding): the ledger's ``idle`` key, never called idle on screen;
- **device idle**: the share of telemetry samples with the GPU (or the workload's CPU)
  below ``telemetry.idle_threshold``: the verdict's ``idle`` check;
- **lost**: the steps and wall time failures threw away (record/lost.py);
- **model throughput**: samples (or tokens) per second while stepping, the median over
  the steps;
- **wall throughput**: items per second over the attempts' wall time (batch inference).
"""

from __future__ import annotations

__all__ = [
    "DEVICE_IDLE",
    "MODEL_THROUGHPUT",
    "WALL_THROUGHPUT",
    "colour",
    "label",
    "tone",
]

DEVICE_IDLE = "device idle"
MODEL_THROUGHPUT = "model throughput"
WALL_THROUGHPUT = "wall throughput"

# What a part of a split (the ledger's billed time, the summary's wall time) is called.
_LABELS = {
    "idle": "no step",
    "checkpoint_stall": "checkpoint stall",
    "data_wait": "data wait",
    "before_first_step": "to each first step",
}

# Whether more of a part is good (the work itself), bad (work thrown away), or a cost to
# watch (time that did no step), or neither (the rest, storage).
_TONES = {
    "productive": "good",
    "compute": "good",
    "wasted": "bad",
    "restarts": "bad",
    "idle": "watch",
    "checkpoint_stall": "watch",
    "data_wait": "watch",
    "before_first_step": "watch",
    "other": "neutral",
    "storage": "neutral",
}

_COLOURS = {"good": "#059669", "bad": "#dc2626", "watch": "#d97706", "neutral": "#6b7280"}


def label(part: str) -> str:
    """The name a view prints for a part: ``idle`` -> ``no step``, ``data_wait`` -> ``data wait``."""
    return _LABELS.get(part, part.replace("_", " "))


def tone(part: str) -> str:
    """``good``, ``bad``, ``watch`` or ``neutral``: the one judgement every view colours by."""
    return _TONES.get(part, "neutral")


def colour(part: str) -> str | None:
    """The colour of a part's tone, or None for a part this glossary does not name (a
    chart's own palette then)."""
    return _COLOURS[_TONES[part]] if part in _TONES else None
