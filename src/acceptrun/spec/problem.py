"""One validation problem: the field path, the bad value and what would be accepted.

The spec loader and the price catalog collect these and raise them together (as a
:class:`~acceptrun.errors.SpecError` or :class:`~acceptrun.errors.UserError`); a
dataclass built directly in code raises the first one (it is a ``ValueError``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["Problem", "key", "require", "show"]


class Problem(ValueError):
    """``limits.max_restarts: -1 is not valid; expected 0 or more``."""

    def __init__(self, path: str, value: Any, accepted: str) -> None:
        super().__init__(f"{path}: {show(value)} is not valid; expected {accepted}")
        self.path = path
        self.value = value
        self.accepted = accepted


def require(ok: bool, path: str, value: Any, accepted: str) -> None:
    """Raise a :class:`Problem` unless ``ok``: for checks that involve several fields."""
    if not ok:
        raise Problem(path, value, accepted)


def show(value: Any) -> str:
    """The value as an error shows it: strings quoted, long values cut at 80 characters."""
    if isinstance(value, str):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def key(name: str) -> str:
    """A table key as TOML writes it in a dotted path: bare, or quoted when it must be."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'
