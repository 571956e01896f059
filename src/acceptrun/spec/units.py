"""Durations in a spec: ``90``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1h30m"``, ``"250ms"``."""

from __future__ import annotations

import math
import re
from typing import Any

from acceptrun._util.units import format_duration  # re-exported: callers import it from here
from acceptrun.spec.problem import Problem, require

__all__ = ["DURATION_RE", "Duration", "format_duration", "parse_duration"]


class Duration(float):
    """Seconds, written in a spec as ``90``, ``"90s"``, ``"10m"``, ``"2h"`` or ``"1h30m"``."""


# One number-and-unit part; a duration is one or more of them ("1h30m"). A part starts
# only where a number does (the lookbehind): without it a search over a long run of
# digits with no unit tried every start again, quadratic in the value's length.
DURATION_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any, path: str = "duration") -> float:
    """``90`` / ``"90s"`` / ``"10m"`` / ``"1h30m"`` / ``"2d"`` -> seconds.

    Raises :class:`~acceptrun.spec.problem.Problem` (a ``ValueError``) naming ``path``.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        require(math.isfinite(value), path, value, "a finite number of seconds")
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        parts = DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNITS[u] for n, u in parts)
    raise Problem(path, value, 'a duration: seconds as a number, or "90s", "10m", "2h", "1h30m"')
