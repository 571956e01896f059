"""Durations, byte counts and money as people read them, and sizes as people write them.

One formatter per quantity, so a run's report, its verdict, ``acceptrun cost`` and the
board print the same figure the same way::

    format_duration(185.0)      # "3m05s"
    format_bytes(1536)          # "1.5 KiB"  (binary: storage is priced per GiB)
    format_bytes(3_400_000, decimal=True)   # "3.4 MB"  (as disks and object stores say)
    format_bytes_exact(1 << 20)  # "1 MiB"   (message sizes: whole units or bytes)
    format_usd(0.00833)         # "0.0083"
    parse_size("2GiB")          # 2147483648
    duration_seconds("1h30m")   # 5400.0

A spec's durations go through :func:`acceptrun.spec.units.parse_duration`, whose errors
name the spec field; a command line's through :mod:`acceptrun._util.argtypes`. Both read
the one grammar here.
"""

from __future__ import annotations

import math
import re
from typing import Any

from acceptrun.errors import UserError

__all__ = [
    "DURATION_RE",
    "DURATION_UNITS",
    "duration_seconds",
    "finite_number",
    "format_bytes",
    "format_bytes_exact",
    "format_duration",
    "format_latency",
    "format_usd",
    "parse_size",
]

# One number-and-unit part; a duration is one or more of them ("1h30m"). A part starts
# only where a number does (the lookbehind): without it a search over a long run of
# digits with no unit tried every start again, quadratic in the value's length.
DURATION_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}  # seconds

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")
_DECIMAL = ("B", "kB", "MB", "GB", "TB")


def duration_seconds(text: str) -> float | None:
    """``"90s"`` / ``"10m"`` / ``"1h30m"`` / ``"250ms"`` -> seconds; None when it is none.

    The value may be inf for a number with hundreds of digits: callers bound it.
    """
    text = text.strip().lower().replace(" ", "")
    parts = DURATION_RE.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        return sum(float(n) * DURATION_UNITS[u] for n, u in parts)
    return None


def format_duration(seconds: float | None) -> str:
    """Seconds as ``"1h02m"``, ``"3m05s"``, ``"42s"``, ``"4.2s"``, or ``"-"`` for None.

    Under 10 s one decimal is kept; from a minute on, seconds are rounded to whole ones.
    """
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_bytes(n: float, *, decimal: bool = False) -> str:
    """``1536`` -> ``"1.5 KiB"``; with ``decimal=True`` powers of 1000: ``"1.5 kB"``.

    Whole bytes below one unit (``"512 B"``), one decimal above, at most TiB/TB.
    """
    base, units = (1000.0, _DECIMAL) if decimal else (1024.0, _BINARY)
    value = float(n)
    for unit in units[:-1]:
        if abs(value) < base:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= base
    return f"{value:.1f} {units[-1]}"


def format_bytes_exact(n: int) -> str:
    """``1 << 20`` -> ``"1 MiB"``; a count that is no whole number of KiB/MiB/GiB stays bytes.

    For sizes chosen by people (message sizes, buffers), where "1.5 MiB" would hide that
    the value is not a round one.
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def finite_number(value: Any) -> float | None:
    """A finite float, or None (bools, strings, NaN and missing values are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def format_latency(seconds: float) -> str:
    """A latency: ``"850 us"``, ``"12.5 ms"``, ``"11.0 s"``."""
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} us"
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def format_usd(x: float) -> str:
    """USD with cents, or four decimals under a dollar (a CPU minute at 0.50 USD/h: 0.0083).

    No currency sign: callers write ``"$"`` or ``" USD"`` as their sentence needs.
    """
    return f"{x:,.2f}" if abs(x) >= 1 or x == 0 else f"{x:.4f}"


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str, what: str = "size") -> int:
    """``"2GiB"``, ``"1.5G"``, ``"500MB"``, ``"4096"`` -> bytes (K/M/G/T: powers of 1024).

    A bad value raises :class:`UserError` naming ``what`` (an option or field) and examples.
    """
    m = _SIZE_RE.match(text)
    if not m:
        raise UserError(f"{what}: {text!r} is not a size; write e.g. 512MiB, 2GiB or 1073741824")
    scale = 1024 ** ("kmgt".index(m.group(2).lower()) + 1) if m.group(2) else 1
    return int(float(m.group(1)) * scale)
