"""Declared fields: a docstring and the constraints of each field, read by everything.

A spec section (and a price catalog entry) is a dataclass whose fields are made by
:func:`acceptrun.spec.model.doc`. Each field carries its one-line docstring and its
:class:`Rules`: bounds, allowed values, a pattern or a named format (regex, version
pattern, threshold, path, glob), list lengths, a unit. From that one declaration:

* :func:`build` turns a TOML table into the dataclass and :func:`check_value` enforces the
  rules, collecting every problem with its field path, the value and what is accepted;
* a path field declares its reach: a ``workdir-glob`` stays in the workdir (refused here
  when absolute, with ``..`` or naming the workspace, and again at run time by
  :mod:`acceptrun._util.paths`); a ``path`` field may lead elsewhere and says why in
  ``reach`` (read only, or a store acceptrun owns), which the docs table shows;
* ``__post_init__`` calls :func:`check_fields`, so a dataclass built in code obeys the
  same rules (cross-field rules stay in ``__post_init__``, written by hand);
* :func:`schema_rules` gives the JSON Schema keywords and :func:`rules_text` the words of
  the docs table, so the schema, ``docs/spec.md`` and validation cannot disagree.

Example::

    keep_last: int = doc("Keep the newest N checkpoints.", 2, ge=2)
    on_divergence: str = doc('"stop" or "rollback".', "stop", choices=("stop", "rollback"))
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from acceptrun._util.controls import control_named
from acceptrun._util.paths import lexical_problem
from acceptrun._util.userregex import pattern_problem
from acceptrun.spec.conditions import (
    CONDITION_RE,
    VERSION_PATTERN_HELP,
    parse_condition,
    valid_version_pattern,
)
from acceptrun.spec.problem import Problem, key, require, show
from acceptrun.spec.units import Duration, parse_duration

__all__ = [
    "FORMATS",
    "Format",
    "Rules",
    "build",
    "check_fields",
    "check_value",
    "fields_of",
    "rules_of",
    "rules_text",
    "schema_rules",
    "to_plain",
]


@dataclass(frozen=True)
class Format:
    """A named string format: how to check it, how the schema and the docs show it.

    ``reach`` is set on a path format: "workdir" (confined: relative, inside the workdir,
    checked here and again at run time by :mod:`acceptrun._util.paths`) or "anywhere"
    (a field of that format must say why in its :attr:`Rules.reach`).
    """

    accepts: str  # what an error says is accepted
    check: Callable[[str], str | None]  # None when valid, else a detail for the error
    schema: dict[str, Any]  # JSON Schema keywords
    invalid: str  # a value that is not valid, for the tests
    words: str  # how the docs table names it
    reach: str | None = None  # a path format: "workdir" or "anywhere"


def _condition_error(value: str) -> str | None:
    try:
        parse_condition(value)
    except ValueError:
        return ""
    return None


def _no_nul(value: str) -> str | None:
    return "" if "\x00" in value else None


def _control_error(value: str) -> str | None:
    """C0 controls (newline, tab, ESC, NUL, ...), DEL, C1 and the bidirectional controls
    (U+202E ...): they break out of a line (a Slurm #SBATCH header, a hand-written YAML
    scalar), act on a terminal or reorder what a browser shows (_util/controls.py), and
    no real name or path holds them."""
    found = control_named(value)
    return None if found is None else f"it holds {found}; remove it"


def _outside_workdir(value: str) -> str | None:
    """Why a path or glob may lead out of the workdir, or None (symlinks: _util.paths)."""
    return _control_error(value) or lexical_problem(value)


_NO_NUL = "^[^\\u0000]*$"  # JSON Schema (ECMA-262) and Python both read \u0000 as NUL
# What _control_error refuses, for JSON Schema.
_CONTROL_CLASS = "\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
_NO_CONTROL = f"^[^{_CONTROL_CLASS}]*$"
# No leading "/" or "~", no ".." or ".acceptrun" part, no control character: what
# _outside_workdir accepts, for JSON Schema.
_IN_WORKDIR = f"^(?![/~])(?!(?:.*/)?(?:\\.\\.|\\.acceptrun)(?:/|$))[^{_CONTROL_CLASS}]*$"

FORMATS: dict[str, Format] = {
    "regex": Format(
        "a regular expression RE2 accepts",
        pattern_problem,  # user patterns run on RE2, in linear time (_util/userregex.py)
        {"format": "regex"},
        invalid="(unclosed",
        words="RE2 regular expression",
    ),
    "version-pattern": Format(
        VERSION_PATTERN_HELP,
        lambda v: None if valid_version_pattern(v) else "",
        {"format": "version-pattern", "pattern": r"^\s*[0-9<>=!~]"},
        invalid="latest",
        words="version pattern",
    ),
    "cuda-pattern": Format(
        VERSION_PATTERN_HELP + ', or "none" for a CPU build of torch',
        lambda v: None if v == "none" or valid_version_pattern(v) else "",
        {"format": "version-pattern", "pattern": r"^(none$|\s*[0-9<>=!~])"},
        invalid="latest",
        words='version pattern or "none"',
    ),
    "path": Format(
        "a path or URL without control characters (newline, tab, NUL)",
        _control_error,
        {"pattern": _NO_CONTROL},
        invalid="a\nb",
        words="path",
        reach="anywhere",
    ),
    "workdir-glob": Format(
        'a path or glob inside the workdir, relative to it, e.g. "out/model.pt" or '
        '"output/checkpoint-*" (not absolute, no "..", not the .acceptrun workspace): name '
        "what the run writes under its workdir, or set workdir to the folder that holds it",
        _outside_workdir,
        {"pattern": _IN_WORKDIR},
        invalid="../x",
        words="path or glob inside the workdir",
        reach="workdir",
    ),
    "line": Format(
        "one line of text: no newline, tab, NUL or other control character (it is written "
        "into a #SBATCH header line)",
        _control_error,
        {"pattern": _NO_CONTROL},
        invalid="a\n#SBATCH --wrap=x",
        words="one line of text",
    ),
    "name": Format(
        "a name on one line, without control characters (newline, tab, ESC, NUL, C1) or "
        "bidirectional controls such as U+202E (they act on a terminal or reorder the text "
        "a page shows)",
        _control_error,
        {"pattern": _NO_CONTROL},
        invalid="bert\u202etxt.exe",
        words="text without control characters",
    ),
    "arg": Format(
        "text without NUL characters (the OS refuses them in arguments and the environment)",
        _no_nul,
        {"pattern": _NO_NUL},
        invalid="a\x00b",
        words="text without NUL",
    ),
    "condition": Format(
        'a threshold such as ">= 0.9", "< 1.5" or "== 1" (operators >= > <= < == !=)',
        _condition_error,
        {"pattern": CONDITION_RE},
        invalid="at least 0.9",
        words='threshold such as ">= 0.9"',
    ),
}


@dataclass(frozen=True, kw_only=True)
class Rules:
    """The constraints of one field. On a list or a table they apply to each item.

    ``None`` (an unset optional field) always passes; the bounds are inclusive (``ge``,
    ``le``) or exclusive (``gt``, ``lt``); ``pattern`` is searched in the value as JSON
    Schema does (anchor it with ``^...$``); ``accepts`` replaces the derived words of an
    error when the rule deserves a reason ("2 or more: the newest may still be saving").
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    any_case: bool = False  # choices compared case-insensitively
    pattern: str | None = None
    format: str | None = None  # a name in FORMATS
    min_items: int | None = None
    max_items: int | None = None
    empty_ok: bool = False  # an empty list means "not set" and escapes min_items
    unit: str | None = None  # e.g. "USD per hour", "GiB", "%"
    accepts: str | None = None
    # Why a path field of a format that may reach outside the workdir needs to (what is
    # done there: read, or written to a store acceptrun owns); shown in the docs.
    reach: str | None = None
    # The whole value is a secret (a webhook URL): learned by the redactor whenever a spec
    # is parsed (spec/load.py), so it is hidden in every record, report, log and output.
    secret: bool = False
    # The value names an environment variable that holds a secret (smtp_password_env =
    # "DB_PASSWORD"): the redactor learns the variable's value, never its name.
    secret_env: bool = False

    def __post_init__(self) -> None:
        # Declaration bugs, caught at import: an unknown format; a path field that may
        # reach outside the workdir without saying why; a reason on a confined field.
        assert self.format is None or self.format in FORMATS, self.format
        where = FORMATS[self.format].reach if self.format else None
        assert (where == "anywhere") == bool(self.reach), (self.format, self.reach)

    @property
    def empty(self) -> bool:
        return self == Rules(unit=self.unit, secret=self.secret, secret_env=self.secret_env)

    @property
    def has_bounds(self) -> bool:
        return any(b is not None for b in (self.ge, self.gt, self.le, self.lt))


def fields_of(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The declared fields of a dataclass by name, without the internal ones."""
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A spec dataclass's resolved annotations, resolved once per process (classes are fixed)."""
    return typing.get_type_hints(cls)


def rules_of(f: dataclasses.Field[Any]) -> Rules:
    """The rules a field declares (none for a field made without :func:`doc`)."""
    rules = f.metadata.get("rules")
    return rules if isinstance(rules, Rules) else Rules()


# ---- validation ------------------------------------------------------------------------------


def check_value(rules: Rules, value: Any, path: str) -> list[Problem]:
    """Every way ``value`` breaks ``rules``; a list's items share its path, a table's do not."""
    if value is None or rules.empty:
        return []
    if isinstance(value, list):
        problems: list[Problem] = []
        count = len(value)
        too_few = rules.min_items is not None and count < rules.min_items
        too_many = rules.max_items is not None and count > rules.max_items
        if (too_few and not (rules.empty_ok and count == 0)) or too_many:
            problems.append(Problem(path, value, rules.accepts or _items_text(rules)))
        for item in value:
            problems.extend(_check_one(rules, item, path))
        return problems
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _check_one(rules, v, f"{path}.{key(k)}")]
    return _check_one(rules, value, path)


def _check_one(rules: Rules, value: Any, path: str) -> list[Problem]:
    if isinstance(value, str):
        if rules.format is not None:
            fmt = FORMATS[rules.format]
            detail = fmt.check(value)
            if detail is not None:
                return [
                    Problem(path, value, f"{fmt.accepts} ({detail})" if detail else fmt.accepts)
                ]
        if rules.choices:
            found = value.lower() if rules.any_case else value
            allowed = [c.lower() if rules.any_case else c for c in rules.choices]
            if found not in allowed:
                close = difflib.get_close_matches(found, list(allowed), n=1, cutoff=0.6)
                hint = (
                    f"; did you mean {rules.choices[allowed.index(close[0])]!r}?" if close else ""
                )
                return [Problem(path, value, _accepted(rules) + hint)]
        if rules.pattern is not None and re.search(rules.pattern, value) is None:
            return [Problem(path, value, _accepted(rules))]
        return []
    if isinstance(value, int | float) and not isinstance(value, bool):
        ok = (
            (rules.ge is None or value >= rules.ge)
            and (rules.gt is None or value > rules.gt)
            and (rules.le is None or value <= rules.le)
            and (rules.lt is None or value < rules.lt)
        )
        return (
            []
            if ok
            else [Problem(path, value, _accepted(rules, duration=isinstance(value, Duration)))]
        )
    return []


def check_fields(obj: Any, section: str) -> None:
    """Raise the first :class:`Problem` of a built dataclass (from its ``__post_init__``)."""
    prefix = f"{section}." if section else ""
    for name, f in fields_of(type(obj)).items():
        problems = check_value(rules_of(f), getattr(obj, name), prefix + name)
        if problems:
            raise problems[0]


def _num(x: float) -> str:
    return f"{x:g}"


def _bounds_text(rules: Rules) -> str:
    low = f">= {_num(rules.ge)}" if rules.ge is not None else None
    low = f"> {_num(rules.gt)}" if rules.gt is not None else low
    high = f"<= {_num(rules.le)}" if rules.le is not None else None
    high = f"< {_num(rules.lt)}" if rules.lt is not None else high
    return ", ".join(b for b in (low, high) if b)


def _accepted(rules: Rules, *, duration: bool = False) -> str:
    """The words an error uses for what a field accepts."""
    if rules.accepts:
        return rules.accepts
    if rules.choices:
        return f"one of {', '.join(rules.choices)}" + (" (any case)" if rules.any_case else "")
    if rules.pattern is not None:
        return f"text matching {rules.pattern}"
    unit = f" {rules.unit}" if rules.unit else ""
    if duration:
        if rules.gt == 0 and rules.le is None and rules.lt is None:
            return 'a positive duration such as "10m"'
        return f'a duration {_bounds_text(rules)} seconds, such as "2s"'
    if rules.ge is not None and rules.le is not None:
        return f"from {_num(rules.ge)} to {_num(rules.le)}{unit}"
    if rules.gt == 0 and rules.le is None and rules.lt is None:
        return f"a positive number{unit}"
    if rules.ge is not None and rules.le is None and rules.lt is None:
        return f"{_num(rules.ge)} or more{unit}"
    return f"a number {_bounds_text(rules)}{unit}"


def _items_text(rules: Rules) -> str:
    if rules.min_items is not None and rules.min_items == rules.max_items:
        return f"a list of {rules.min_items}" + (" or none" if rules.empty_ok else "")
    if rules.max_items is None:
        return f"a list of {rules.min_items} or more"
    return f"a list of {rules.min_items or 0} to {rules.max_items}"


# ---- building from TOML ----------------------------------------------------------------------


def build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    """Convert a TOML table into dataclass ``cls``, appending problems instead of raising.

    Unknown keys get a "did you mean"; missing required keys their docstring; each value
    its type and its :class:`Rules`. Returns None when anything was wrong.
    """
    where = prefix.rstrip(".") or "the spec"
    if not isinstance(raw, dict):
        problems.append(f"{where}: {show(raw)} is not valid; expected a table ([{where}])")
        return None
    fields = fields_of(cls)
    hints = _type_hints(cls)
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for name, value in raw.items():
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            )
            # Reported, but not blocking: the section's own checks still run.
            problems.append(f"{prefix}{key(name)}: unknown key{hint}")
            before += 1
            continue
        f, path = fields[name], f"{prefix}{name}"
        try:
            from_string = f.metadata.get("from_string")
            if from_string is not None and isinstance(value, str):
                kwargs[name] = from_string(value, path)
            else:
                kwargs[name] = _convert(hints[name], value, path, problems, f.metadata)
        except Problem as exc:
            problems.append(str(exc))
            continue
        problems.extend(str(p) for p in check_value(rules_of(f), kwargs[name], path))
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in raw:
            problems.append(f"{prefix}{name}: missing; {f.metadata['doc']}")
    if len(problems) > before:
        # Sibling sections are still validated, so one pass reports everything.
        return None
    try:
        return cls(**kwargs)
    except Problem as exc:
        problems.append(str(exc))
        return None


def _convert(
    tp: Any, value: Any, path: str, problems: list[str], meta: typing.Mapping[str, Any]
) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return _convert(options[0], value, path, problems, meta)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path + ".", problems)  # type: ignore[arg-type]
    if tp is Duration:
        return Duration(parse_duration(value, path))
    if origin is list:
        (item,) = get_args(tp)
        example = meta.get("example", '["a", "b"]')
        require(isinstance(value, list), path, value, f"a list, e.g. {example}")
        return [_convert(item, v, f"{path}[{i}]", problems, {}) for i, v in enumerate(value)]
    if origin is dict:
        _, item = get_args(tp)
        example = meta.get("example", '{ name = "value" }')
        require(isinstance(value, dict), path, value, f"a table, e.g. {example}")
        return {k: _convert(item, v, f"{path}.{key(k)}", problems, {}) for k, v in value.items()}
    if tp is bool:
        require(isinstance(value, bool), path, value, "true or false")
        return value
    if tp is int:
        require(
            isinstance(value, int) and not isinstance(value, bool), path, value, "a whole number"
        )
        return value
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        require(ok, path, value, "a number")
        return float(value)
    if tp is str:
        require(isinstance(value, str), path, value, "a string")
        return value
    raise TypeError(f"field {path} has unsupported type {tp!r}")  # internal invariant


def to_plain(obj: Any) -> Any:
    """A dataclass as plain data for TOML: durations as seconds, unset (None) values left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if f.metadata.get("internal"):
                continue
            value = to_plain(getattr(obj, f.name))
            if value is not None:  # TOML has no null: absent means default
                out[f.name] = value
        return out
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, Duration):
        return float(obj)
    return obj


# ---- schema and docs -------------------------------------------------------------------------


def schema_rules(rules: Rules, kind: str) -> dict[str, Any]:
    """JSON Schema keywords of ``rules`` for one value of ``kind`` ("number" or "string").

    Bounds go on numbers (for a duration: on its number form), the rest on strings.
    """
    out: dict[str, Any] = {}
    if kind == "number":
        for name, bound in (
            ("minimum", rules.ge),
            ("exclusiveMinimum", rules.gt),
            ("maximum", rules.le),
            ("exclusiveMaximum", rules.lt),
        ):
            if bound is not None:
                out[name] = bound
        return out
    if rules.secret:
        out["writeOnly"] = True  # a secret: read by acceptrun, never shown back
    if rules.format is not None:
        out.update(FORMATS[rules.format].schema)
    if rules.choices and not rules.any_case:
        out["enum"] = list(rules.choices)
    elif rules.choices:
        # JSON Schema has no case-insensitive enum: [Pp][Oo][Ss][Tt]
        spelled = [
            "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in w)
            for w in rules.choices
        ]
        out["pattern"] = f"^(?:{'|'.join(spelled)})$"
    if rules.pattern is not None:
        if "pattern" in out:  # both must hold: the format's and the field's own
            out["allOf"] = [{"pattern": out.pop("pattern")}, {"pattern": rules.pattern}]
        else:
            out["pattern"] = rules.pattern
    return out


def rules_text(rules: Rules) -> str:
    """The constraints in the words of the docs table, e.g. ``>= 2`` or ``one of: stop, rollback``."""
    parts: list[str] = []
    if rules.has_bounds:
        parts.append(_bounds_text(rules))
    if rules.choices:
        parts.append("one of: " + ", ".join(f"`{c}`" for c in rules.choices))
        if rules.any_case:
            parts[-1] += " (any case)"
    if rules.format is not None:
        parts.append(FORMATS[rules.format].words)
    if rules.reach:
        parts.append(f"may be outside the workdir: {rules.reach}")
    if rules.pattern is not None:
        parts.append(f"matches `{rules.pattern}`")
    if rules.min_items is not None or rules.max_items is not None:
        parts.append(_items_text(rules).replace("a list of", "items:"))
    if rules.unit:
        parts.append(rules.unit)
    if rules.secret:
        parts.append("a secret: never shown or recorded")
    return "; ".join(parts)
