"""Regular expressions a user wrote (a spec's ``progress.pattern``, ``serving.ready_log``).

They run on RE2 (the google-re2 package), an engine whose time is linear in the input's
length: Python's ``re`` backtracks, and ``(x+x+)+y`` against 40 x's takes hours while it
holds the GIL, which stops every thread of the supervisor (its wall time, its lease).
RE2 releases the GIL while it matches, and never backtracks.

RE2 refuses what it cannot run in linear time: backreferences, lookaround, atomic
groups, possessive quantifiers, conditionals. :func:`pattern_problem` names the
construct and the fix for the spec check (spec/fields.py); :func:`compile_user_pattern`
raises the same words as a :class:`~acceptrun.errors.SpecError`. Patterns written in
the package itself stay on ``re``: tests/integration/test_regex_linear.py tries each on
megabyte inputs.

    >>> rx = compile_user_pattern(r"iter (?P<step>\\d+)", where="progress.pattern")
    >>> m = rx.search("iter 12: loss 0.5")
    >>> m.span(rx.groupindex["step"])
    (5, 7)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol, cast

import re2  # type: ignore[import-untyped]

from acceptrun.errors import SpecError

__all__ = [
    "MAX_PROGRAM",
    "UNSUPPORTED",
    "UserMatch",
    "UserPattern",
    "compile_user_pattern",
    "pattern_problem",
    "program_size",
]

ENGINE = "patterns run on RE2, a linear-time engine"


class UserMatch(Protocol):
    """What callers read of a match: spans by group number (as ``re.Match`` has them)."""

    def span(self, group: int = 0) -> tuple[int, int]: ...


class UserPattern(Protocol):
    """What callers use of a compiled user pattern (an ``re.Pattern`` has it too)."""

    @property
    def pattern(self) -> str: ...

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    def search(self, text: str) -> UserMatch | None: ...


# Constructs RE2 refuses, by the text its error stops at: (that text, the construct's
# name, how to write the pattern without it, a pattern that holds it). The order matters
# where one text starts another ("(?<=" before "(?<").
UNSUPPORTED: tuple[tuple[str, str, str, str], ...] = (
    ("(?<=", "lookbehind (?<=...)", "rewrite it without the lookbehind: match that text too",
     r"(?<=iter )(?P<step>\d+)"),
    ("(?<!", "negative lookbehind (?<!...)", "rewrite it without the lookbehind",
     r"(?<!eval )iter (?P<step>\d+)"),
    ("(?=", "lookahead (?=...)", "rewrite it without the lookahead: match that text too",
     r"iter (?P<step>\d+)(?=:)"),
    ("(?!", "negative lookahead (?!...)", "rewrite it with a class such as [^x] instead",
     r"iter (?P<step>\d+)(?!/)"),
    ("(?>", "atomic group (?>...)", "write a plain group (...): RE2 never backtracks",
     r"iter (?>(?P<step>\d+))"),
    ("(?P=", "backreference (?P=name)", "match the repeated text with its own pattern",
     r"(?P<q>['\"])(?P<step>\d+)(?P=q)"),
    ("(?P>", "recursion (?P>name)", "write the group out in full",
     r"(?P<step>\d+)(?P>step)"),
    ("(?(", "conditional group (?(1)...|...)", "write the alternatives with |",
     r"(<)?iter (?P<step>\d+)(?(1)>|)"),
    ("(?#", "comment group (?#...)", "remove the comment",
     r"iter (?P<step>\d+)(?#the step)"),
    ("\\Z", "\\Z (end of text)", "write \\z, which is what RE2 calls it",
     r"iter (?P<step>\d+)\Z"),
    ("\\G", "\\G (where the last match ended)", "anchor with ^ instead",
     r"\Giter (?P<step>\d+)"),
    ("\\N", "\\N{NAME} (a character by name)", "write the character itself",
     r"iter\N{SPACE}(?P<step>\d+)"),
    ("++", "possessive quantifier ++", "drop the second +: RE2 never backtracks",
     r"iter (?P<step>\d++)"),
    ("*+", "possessive quantifier *+", "drop the +: RE2 never backtracks",
     r"iter *+(?P<step>\d+)"),
    ("?+", "possessive quantifier ?+", "drop the +: RE2 never backtracks",
     r"iter ?+(?P<step>\d+)"),
    ("}+", "possessive quantifier {m,n}+", "drop the +: RE2 never backtracks",
     r"iter (?P<step>\d{1,9}+)"),
)  # fmt: skip
_BACKREF = re.compile(r"\\[1-9][0-9]?")  # \1 .. \99 as RE2's error quotes it
_FLAGS = re.compile(r"\(\?[a-zA-Z-]+")  # an inline flag group, "(?x" as RE2 quotes it
_TOO_LARGE = "pattern too large"
# Instructions of a compiled pattern, at most. Matching is linear in the line's length
# times this, where RE2's DFA gives up for its NFA: at 2,000 a 64 KiB line (progress.py's
# cut) took 1.2 s at worst on a loaded machine ("(?P<step>\d*)(.*x){181}" on x's). "\p{L}"
# alone is 1,200; a step and loss pattern is under 150; "([a-z]+.?){1000}y" is 13,000,
# and 6 s a line.
MAX_PROGRAM = 2000


def _options() -> object:
    options = re2.Options()
    options.log_errors = False  # a refused pattern prints nothing from C++ on stderr
    return options


def pattern_problem(value: str) -> str | None:
    """Why RE2 refuses ``value`` (the construct and the fix), or None when it runs.

    >>> pattern_problem(r"(?<=loss )(?P<loss>\\S+)")
    'lookbehind (?<=...) is not supported: patterns run on RE2, a linear-time engine; rewrite it without the lookbehind: match that text too'
    """
    try:
        compiled = re2.compile(value, _options())
    except re2.error as exc:
        return _explain(value, _message(exc))
    size = program_size(compiled)
    if size is not None and size > MAX_PROGRAM:
        return (
            f"it is too large: RE2 compiles it to {size:,} instructions, over "
            f"{MAX_PROGRAM:,} (the time to match a line grows with them); "
            "repeat its groups fewer times"
        )
    return None


def program_size(compiled: object) -> int | None:
    """Instructions of a compiled pattern (RE2's ``ProgramSize``), None where unknown.

    The package's Python wrapper keeps the RE2 object as ``_regexp``; a release that
    renames it makes this None, and tests/unit/test_user_patterns.py fail.
    """
    size = getattr(getattr(compiled, "_regexp", None), "ProgramSize", None)
    return size() if callable(size) else None


def compile_user_pattern(value: str, *, where: str) -> UserPattern:
    """``value`` compiled on RE2; a :class:`SpecError` naming ``where`` when it is refused."""
    problem = pattern_problem(value)
    if problem is not None:
        raise SpecError(where, [f"{value!r} is not valid: {problem}"])
    return cast(UserPattern, re2.compile(value, _options()))


def _message(exc: Exception) -> str:
    """RE2's own words: its error carries them as bytes (``b'invalid perl operator: (?='``)."""
    arg = exc.args[0] if exc.args else ""
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def _explain(value: str, message: str) -> str:
    """The construct RE2 stopped at, named, with its fix; RE2's words for anything else."""
    _, _, stopped_at = message.partition(": ")
    if stopped_at == "(?P":  # RE2 quotes three characters of (?P=name) and (?P>name)
        stopped_at = next((t for t in ("(?P=", "(?P>") if t in value), stopped_at)
    for text, name, fix, _example in UNSUPPORTED:
        if stopped_at.startswith(text) or stopped_at.endswith(text):
            return f"{name} is not supported: {ENGINE}; {fix}"
    if _BACKREF.fullmatch(stopped_at):
        return (
            f"backreference {stopped_at} is not supported: {ENGINE}; "
            "match the repeated text with its own pattern"
        )
    if _FLAGS.fullmatch(stopped_at):
        return (
            f"the inline flag {stopped_at}) is not supported: {ENGINE}, which knows the "
            "flags i, m, s and U only; remove it"
        )
    if message.startswith(_TOO_LARGE):
        return (
            f"it is too large for RE2 (its compiled program passes 8 MiB): {ENGINE}; "
            "repeat its groups fewer times"
        )
    return f"{message} ({ENGINE}; its syntax: https://github.com/google/re2/wiki/Syntax)"
