"""Which kinds a campaign tries and at which step: the default campaign or a campaign file.

A campaign file is TOML::

    # campaign.toml: three kinds, the kill at step 12, the others where the campaign puts them
    kinds = ["sigkill", "nan", "ckpt_truncated"]

    [steps]
    sigkill = 12

``kinds`` (default: every kind, :data:`~.kinds.KINDS`) names the kinds to try, in that
order, one run of the spec each. ``[steps]`` places a kind's fault at a step of the
reference run; by default every fault lands halfway from the first checkpoint to the
second (:func:`default_step`), so a restart has a checkpoint to resume from and some
steps are really lost; a kind that damages a checkpoint lands after the second one.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun.errors import UserError
from acceptrun.run.drills.campaign.kinds import KINDS, FaultKind

__all__ = ["Campaign", "default_campaign", "default_step", "load_campaign", "parse_campaign"]

_KEYS = ("kinds", "steps")


@dataclass(frozen=True, slots=True)
class Campaign:
    """The kinds to try, in order, and the steps some of them are pinned to."""

    kinds: list[FaultKind]
    steps: dict[str, int] = field(default_factory=dict)
    source: str = "the default campaign"

    def step_for(self, kind: FaultKind, default: int) -> int:
        return self.steps.get(kind.name, default)


def default_campaign() -> Campaign:
    """Every kind of the registry, each at its default step."""
    return Campaign(list(KINDS))


def default_step(checkpoints: list[int], nth: int = 1) -> int:
    """Halfway from the ``nth`` checkpoint to the next (one step after the last one).

    ``nth`` 2 for a kind that damages the newest checkpoint: an older one is left to fall
    back to.
    """
    c1 = checkpoints[min(nth, len(checkpoints)) - 1]
    c2 = next((c for c in checkpoints if c > c1 + 1), None)
    return c1 + max(1, (c2 - c1) // 2) if c2 is not None else c1 + 1


def load_campaign(path: str | Path) -> Campaign:
    """Read a campaign file; a :class:`UserError` naming the file and the problem otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"campaign file {p}: cannot be read ({exc}); give a TOML file") from None
    return parse_campaign(text, source=str(p))


def parse_campaign(text: str, *, source: str = "<campaign>") -> Campaign:
    """Parse campaign TOML (module docstring); every problem is named with its fix."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"campaign file {source}: TOML syntax error: {exc}") from None
    problems: list[str] = []
    for key in raw:
        if key not in _KEYS:
            problems.append(
                f"{key!r} is not a campaign key{_close(key, _KEYS)}; the keys: kinds, [steps]"
            )
    names = _kinds(raw.get("kinds"), problems)
    steps = _steps(raw.get("steps", {}), problems)
    if problems:
        raise UserError(f"campaign file {source}: " + "; ".join(problems))
    by_name = {k.name: k for k in KINDS}
    kinds = list(KINDS) if names is None else [by_name[n] for n in names]
    return Campaign(kinds, steps, source)


def _kinds(value: Any, problems: list[str]) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        problems.append(
            f'kinds = {value!r}: expected a list of kind names, e.g. ["sigkill", "nan"]'
        )
        return None
    known = [k.name for k in KINDS]
    for name in value:
        if name not in known:
            problems.append(
                f"kinds: {name!r} is not a fault kind{_close(name, known)}; known: {', '.join(known)}"
            )
    dupes = sorted({n for n in value if value.count(n) > 1})
    if dupes:
        problems.append(f"kinds: {', '.join(dupes)} listed twice; list each kind once")
    return [n for n in value if n in known] if not problems else None


def _steps(value: Any, problems: list[str]) -> dict[str, int]:
    if not isinstance(value, dict):
        problems.append(f"steps = {value!r}: expected a table, e.g. [steps] sigkill = 12")
        return {}
    known = [k.name for k in KINDS]
    out: dict[str, int] = {}
    for name, step in value.items():
        if name not in known:
            problems.append(f"steps.{name}: not a fault kind{_close(name, known)}")
        elif isinstance(step, bool) or not isinstance(step, int) or step < 0:
            problems.append(f"steps.{name} = {step!r}: expected a step number, 0 or more")
        else:
            out[name] = step
    return out


def _close(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
