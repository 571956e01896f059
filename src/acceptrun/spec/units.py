"""Durations in a spec: ``90``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1h30m"``, ``"250ms"``."""

from __future__ import annotations

import math
from typing import Any

# Re-exported: callers import them from here. The grammar itself lives in _util, where the
# command line's validators (acceptrun._util.argtypes) read it too.
from acceptrun._util.units import DURATION_RE, duration_seconds, format_duration
from acceptrun.spec.problem import Problem, require

__all__ = ["DURATION_RE", "Duration", "format_duration", "parse_duration"]


class Duration(float):
    """Seconds, written in a spec as ``90``, ``"90s"``, ``"10m"``, ``"2h"`` or ``"1h30m"``."""


def parse_duration(value: Any, path: str = "duration") -> float:
    """``90`` / ``"90s"`` / ``"10m"`` / ``"1h30m"`` / ``"2d"`` -> seconds.

    Raises :class:`~acceptrun.spec.problem.Problem` (a ``ValueError``) naming ``path``.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        require(math.isfinite(value), path, value, "a finite number of seconds")
        return float(value)
    if isinstance(value, str) and (seconds := duration_seconds(value)) is not None:
        return seconds
    raise Problem(path, value, 'a duration: seconds as a number, or "90s", "10m", "2h", "1h30m"')
