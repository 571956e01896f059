"""Typed ``type=`` validators for argparse: every flag's value is checked for its range
when the command line is parsed, before a command reads a file or starts anything.

argparse calls ``type(text)``; an :class:`argparse.ArgumentTypeError` becomes its own
usage error, naming the flag, with exit code 2::

    acceptrun plan: error: argument --gpus: a 23-digit number is out of range; expected 1 to 1,000,000

    p.add_argument("--gpus", type=positive_int(most=1_000_000), metavar="N")
    p.add_argument("--weibull", type=finite_float(above=0.0, most=100.0), metavar="K")
    p.add_argument("--save", type=duration(), metavar="DURATION")   # seconds, a float
    p.add_argument("--name", type=text())                           # no control characters
    p.add_argument("-o", "--output", type=path_arg)                 # a path a kernel takes
    p.add_argument("spec", type=file_arg)                           # and no FIFO or device

Messages quote at most :data:`SHOWN` characters of the value, escaped (``repr``), so a
100,000-character or a terminal-escape value is neither echoed whole nor interpreted.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from collections.abc import Callable

from acceptrun._util.controls import control_named
from acceptrun._util.units import duration_seconds, format_duration

__all__ = [
    "MAX_DURATION_S",
    "MAX_STEP",
    "MAX_TEXT",
    "PATH_MAX",
    "SHOWN",
    "count",
    "dir_arg",
    "duration",
    "file_arg",
    "finite_float",
    "fraction",
    "integer",
    "path_arg",
    "port",
    "positive_int",
    "seed",
    "text",
    "usd",
]

SHOWN = 40  # characters of a bad value quoted back in a message
MAX_TEXT = 1024  # characters of a name, a note, a reason: a line, not a document
PATH_MAX = 4096  # bytes of a path, Linux's PATH_MAX (limits.h); a longer one fails in open(2)
NAME_MAX = 255  # bytes of one path component (limits.h NAME_MAX)
_NUMBER_CHARS = 40  # characters of a number as people write one ("1e-3", "1,000,000" is not)
# A whole century of seconds: longer than any run, interval or timeout anyone means, and
# far below where float sums lose whole seconds (2**53 s).
# A step, an attempt or a job id: 10^12 is past any run's (a million steps a second would
# take 12 days), and far inside an int64 column of SQLite or a JSON reader's exact range.
MAX_STEP = 10**12
_YEAR_S = 365 * 86400.0
MAX_DURATION_S = 100 * _YEAR_S


def _shown(value: str) -> str:
    """``value`` quoted for a message: escaped, and cut at :data:`SHOWN` characters."""
    if len(value) <= SHOWN:
        return repr(value)
    return f"{value[:SHOWN]!r}... ({len(value):,} characters)"


def _number(x: float) -> str:
    """A bound as people read it: ``1,000,000,000``, ``0.1``."""
    return f"{x:,.0f}" if x == int(x) else f"{x:g}"


def _control(value: str) -> str | None:
    """The first control or bidi character of ``value`` (C0, DEL, C1, U+202E ...:
    :func:`~acceptrun._util.controls.control_named`) as ``\\u202e (U+202E RIGHT-TO-LEFT
    OVERRIDE)``, or None."""
    named = control_named(value)
    if named is None:
        return None
    char = chr(int(named.split(" ", 1)[0][2:], 16))
    return f"{repr(char)[1:-1]} ({named})"


def _named(check: Callable[[str], object], name: str) -> None:
    # argparse's fallback message ("invalid <name> value") uses the type's __name__.
    check.__name__ = name


def integer(least: int, most: int, *, example: str = "") -> Callable[[str], int]:
    """A whole number from ``least`` to ``most`` inclusive."""
    span = f"expected {least:,} to {most:,}" + (f", e.g. {example}" if example else "")

    def check(value: str) -> int:
        digits = value.strip().lstrip("+-").lstrip("0")
        if digits.isdigit() and len(digits) > len(str(max(abs(least), abs(most)))):
            raise argparse.ArgumentTypeError(
                f"a {len(digits)}-digit number is out of range; {span}"
            )
        if len(value) > _NUMBER_CHARS:
            raise argparse.ArgumentTypeError(
                f"a {len(value):,}-character value is not a number; {span}"
            )
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{_shown(value)} is not a whole number; {span}"
            ) from None
        if not least <= number <= most:
            raise argparse.ArgumentTypeError(f"{_shown(value)} is out of range; {span}")
        return number

    _named(check, "integer")
    return check


def positive_int(most: int, *, example: str = "") -> Callable[[str], int]:
    """A count of things there must be one of at least (GPUs, steps, slots), up to ``most``."""
    return integer(1, most, example=example)


def count(most: int, *, example: str = "") -> Callable[[str], int]:
    """A count that may be 0 (warmup steps, retries), up to ``most``."""
    return integer(0, most, example=example)


# A TCP port: 0 would be one the kernel picks, which nobody could then be told to reach.
port = integer(1, 65535, example="8765")

# numpy's default_rng and random.seed take any int, but a seed is written down to be typed
# again: 32 bits keeps it one that every tool (torch.manual_seed included) accepts.
seed = integer(0, 2**32 - 1, example="0")


def finite_float(
    *,
    least: float | None = None,
    above: float | None = None,
    most: float | None = None,
    example: str = "",
) -> Callable[[str], float]:
    """A finite number, >= ``least`` or > ``above``, and <= ``most`` (each optional)."""
    parts = []
    if least is not None:
        parts.append(f">= {_number(least)}")
    if above is not None:
        parts.append(f"> {_number(above)}")
    if most is not None:
        parts.append(f"<= {_number(most)}")
    span = "expected a finite number" + (" " + " and ".join(parts) if parts else "")
    span += f", e.g. {example}" if example else ""

    def check(value: str) -> float:
        if len(value) > _NUMBER_CHARS:
            raise argparse.ArgumentTypeError(
                f"a {len(value):,}-character value is not a number; {span}"
            )
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(value)} is not a number; {span}") from None
        if (
            not math.isfinite(number)
            or (least is not None and number < least)
            or (above is not None and number <= above)
            or (most is not None and number > most)
        ):
            raise argparse.ArgumentTypeError(f"{_shown(value)} is out of range; {span}")
        return number

    _named(check, "number")
    return check


fraction = finite_float(least=0.0, most=1.0, example="0.05")
# USD (per hour, per minute of a person, per switch): a price is never negative, and a
# billion is past any one job's; a typo of ten digits is caught rather than printed.
usd = finite_float(least=0.0, most=1e9, example="12.50")


def duration(
    *, zero_ok: bool = False, most: float = MAX_DURATION_S, example: str = "30s"
) -> Callable[[str], float]:
    """A duration (``"90s"``, ``"10m"``, ``"1h30m"``, ``"250ms"``, or plain seconds) -> seconds.

    Positive unless ``zero_ok``; at most ``most`` seconds (default a century).
    """
    least = "0 or more" if zero_ok else "more than 0"
    top = f"{most / _YEAR_S:g} years" if most >= _YEAR_S else format_duration(most)
    span = f"expected a duration {least}, up to {top}, e.g. {example}"

    def check(value: str) -> float:
        if len(value) > _NUMBER_CHARS:
            raise argparse.ArgumentTypeError(
                f"a {len(value):,}-character value is not a duration; {span}"
            )
        seconds = duration_seconds(value)
        if seconds is None:
            try:
                seconds = float(value)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f'{_shown(value)} is not a duration; {span} ("90s", "10m", "2h", "1h30m")'
                ) from None
        if (
            not math.isfinite(seconds)
            or seconds < 0
            or seconds > most
            or (seconds == 0 and not zero_ok)
        ):
            raise argparse.ArgumentTypeError(f"{_shown(value)} is out of range; {span}")
        return seconds

    _named(check, "duration")
    return check


def text(*, most: int = MAX_TEXT, empty_ok: bool = False) -> Callable[[str], str]:
    """A line of text (a name, a note, a reason): no control characters, <= ``most`` chars."""

    def check(value: str) -> str:
        if not value.strip() and not empty_ok:
            raise argparse.ArgumentTypeError(f"{_shown(value)} is empty; give a value")
        if len(value) > most:
            raise argparse.ArgumentTypeError(
                f"a {len(value):,}-character value is too long; give at most {most:,}"
            )
        bad = _control(value)
        if bad is not None:
            raise argparse.ArgumentTypeError(
                f"{_shown(value)} holds the control character {bad}; give plain text"
            )
        return value

    _named(check, "text")
    return check


def path_arg(value: str) -> str:
    """A path the kernel accepts: not empty, no control characters (NUL included), at most
    :data:`PATH_MAX` bytes and :data:`NAME_MAX` bytes a component."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"{_shown(value)} is empty; give a path")
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > PATH_MAX:
        raise argparse.ArgumentTypeError(
            f"a {size:,}-byte path is too long; the limit is {PATH_MAX:,} bytes (PATH_MAX)"
        )
    longest = max(len(part.encode("utf-8", "surrogateescape")) for part in value.split("/"))
    if longest > NAME_MAX:
        raise argparse.ArgumentTypeError(
            f"{_shown(value)} has a {longest:,}-byte name; the limit is {NAME_MAX} bytes a "
            "name (NAME_MAX)"
        )
    bad = _control(value)
    if bad is not None:
        raise argparse.ArgumentTypeError(
            f"{_shown(value)} holds the control character {bad}; rename the file or give "
            "another path"
        )
    return value


def file_arg(value: str) -> str:
    """:func:`path_arg`, and when it exists a regular file: a spec to read or an output to
    write (a FIFO blocks a read or a write forever, a device such as /dev/zero never ends,
    a folder is no file). A missing one is the command's to name, or to create."""
    path = path_arg(value)
    try:
        mode = os.stat(path).st_mode  # follows a symlink: what open(2) would read
    except OSError:
        return path  # missing or unreadable: the command says so, naming what it needed
    if not stat.S_ISREG(mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise argparse.ArgumentTypeError(f"{_shown(value)} is {kind}; give a regular file")
    return path


def dir_arg(value: str) -> str:
    """:func:`path_arg`, and when it exists a folder (``-o DIR`` of ``export wheel``)."""
    path = path_arg(value)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{_shown(value)} is not a folder; give a folder")
    return path


_named(path_arg, "path")
_named(file_arg, "file")
_named(dir_arg, "folder")
