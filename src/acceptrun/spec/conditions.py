"""Acceptance thresholds (``">= 0.9"``) and environment patterns (``">=2.1"``, ``"H100"``)."""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "CONDITION_RE",
    "VERSION_PATTERN_HELP",
    "Condition",
    "match_pattern",
    "parse_condition",
    "valid_version_pattern",
    "version_or_none",
]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}

# An operator and a number, e.g. ">= 0.9" or "<1e-3" (also the JSON Schema pattern).
CONDITION_RE = r"^\s*(>=|<=|==|!=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
CONDITION_HELP = 'a threshold such as ">= 0.9", "< 1.5" or "== 1" (operators >= > <= < == !=)'
VERSION_PATTERN_HELP = 'a version pattern such as ">=2.1", "2.13.*", "==12.4" or "12"'


@dataclass(frozen=True, slots=True)
class Condition:
    """A metric threshold such as ``>= 0.9``."""

    op: str
    value: float

    def check(self, found: float) -> bool:
        return _OPS[self.op](found, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


def parse_condition(text: str) -> Condition:
    """``">= 0.9"`` -> ``Condition(">=", 0.9)``; raises ValueError naming the forms accepted."""
    match = re.fullmatch(CONDITION_RE.strip("^$"), text)
    if not match:
        raise ValueError(CONDITION_HELP)
    return Condition(match[1], float(match[2]))


def valid_version_pattern(pattern: str) -> bool:
    """Is ``pattern`` a PEP 440 specifier, a wildcard version or a bare version prefix?"""
    if any(c in pattern for c in "<>=!~"):
        try:
            SpecifierSet(pattern)
        except InvalidSpecifier:
            return False
        return True
    return bool(re.fullmatch(r"[0-9][0-9A-Za-z.+*-]*", pattern.strip()))


def match_pattern(pattern: str, found: str | None, *, kind: str = "version") -> bool:
    """Does ``found`` satisfy a spec pattern?

    Versions: a PEP 440 specifier (``">=2.1,<3"``), a wildcard (``"12.*"``) or a bare
    prefix (``"12"`` matches 12.4; ``"2.13"`` matches 2.13.0+cpu). Names (``kind="name"``,
    GPU models): a case-insensitive glob, or a substring when it has no glob characters.
    """
    if found is None:
        return False
    if kind == "name":
        p, f = pattern.lower(), found.lower()
        return fnmatch.fnmatchcase(f, p) if any(c in p for c in "*?[") else p in f
    if any(c in pattern for c in "<>=!~"):
        try:
            return SpecifierSet(pattern).contains(found, prereleases=True)
        except (InvalidSpecifier, InvalidVersion):
            return False
    if "*" in pattern:
        return fnmatch.fnmatchcase(found, pattern)
    return found == pattern or re.match(re.escape(pattern) + r"(?:[.+]|$)", found) is not None


def version_or_none(text: str) -> Version | None:
    """``Version(text)``, or None when it is not a PEP 440 version."""
    try:
        return Version(text)
    except InvalidVersion:
        return None
