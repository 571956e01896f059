"""Documents derived from the spec's dataclasses: JSON Schema, reference, starter spec.

``acceptrun spec schema`` (for editors), ``acceptrun spec docs`` (docs/spec.md, kept in
sync by a test) and ``acceptrun init`` (a commented starter that always validates) all
read the one declaration in :mod:`acceptrun.spec.model`, so they cannot drift from it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import types
import typing
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

from acceptrun.spec.fields import Rules, fields_of, rules_of, rules_text, schema_rules, to_plain
from acceptrun.spec.model import RunSpec
from acceptrun.spec.units import DURATION_RE, Duration

__all__ = ["json_schema", "reference_markdown", "starter_spec"]


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the spec, for editors (e.g. taplo, Even Better TOML)."""
    schema = _schema_for(RunSpec)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "acceptrun run spec",
        **schema,
    }


def _schema_for(tp: Any, rules: Rules | None = None) -> dict[str, Any]:
    """The schema of a value of type ``tp``; ``rules`` (a field's) go on its scalar values."""
    rules = rules or Rules()
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _schema_for(next(a for a in get_args(tp) if a is not type(None)), rules)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        props: dict[str, Any] = {}
        required: list[str] = []
        for name, f in fields_of(tp).items():  # type: ignore[arg-type]
            field_rules = rules_of(f)
            props[name] = {
                "description": f.metadata["doc"],
                **_schema_for(hints[name], field_rules),
            }
            if field_rules.unit:
                props[name]["x-unit"] = field_rules.unit
            if f.metadata.get("from_string") is not None:  # command: a string or a list
                props[name] = {
                    "description": f.metadata["doc"],
                    "oneOf": [
                        {"type": "string", "minLength": 1},
                        _schema_for(hints[name], field_rules),
                    ],
                }
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(name)
            elif f.default is not dataclasses.MISSING and f.default is not None:
                props[name]["default"] = f.default
        out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
        if tp.__doc__:
            out["description"] = tp.__doc__.strip().splitlines()[0]
        if required:
            out["required"] = required
        return out
    if tp is Duration:
        number = {"type": "number", "minimum": 0, **schema_rules(rules, "number")}
        if "exclusiveMinimum" in number:
            del number["minimum"]
        return {
            "oneOf": [
                number,
                {"type": "string", "pattern": DURATION_RE.pattern.join(["^(", ")+$"])},
            ]
        }
    if origin is list:
        array: dict[str, Any] = {"type": "array", "items": _schema_for(get_args(tp)[0], rules)}
        length: dict[str, Any] = {}
        if rules.min_items is not None:
            length["minItems"] = rules.min_items
        if rules.max_items is not None:
            length["maxItems"] = rules.max_items
        if length and rules.empty_ok:  # [] means "not set"
            array["anyOf"] = [{"maxItems": 0}, length]
        else:
            array.update(length)
        return array
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_for(get_args(tp)[1], rules)}
    if tp is bool:
        return {"type": "boolean"}
    if tp in (int, float):
        return {"type": "integer" if tp is int else "number", **schema_rules(rules, "number")}
    if tp is str:
        return {"type": "string", **schema_rules(rules, "string")}
    raise TypeError(f"no schema for {tp!r}")  # internal invariant: a new field type


def reference_markdown() -> str:
    """The spec reference of docs/spec.md, derived from the dataclasses (a test keeps it in sync)."""
    lines = [
        "# Run spec reference",
        "",
        "Generated from `src/acceptrun/spec/model.py` by `acceptrun spec docs`; a test keeps the two in",
        'sync. Durations are seconds as a number, or strings such as `"90s"`, `"10m"`,',
        '`"2h"`, `"1h30m"`. Relative paths are relative to the spec file. The type column',
        "shows each field's constraints (bounds, allowed values, formats, units): `acceptrun",
        "spec check` enforces them and `acceptrun spec schema` states them. Regular",
        "expressions run on RE2, in time linear in the line: lookaround, backreferences and",
        "possessive quantifiers are refused, `\\d` and `\\w` are ASCII only (docs/own-script.md).",
        'Names, one-line fields and paths ("text without control characters", "one line of',
        'text", "path") refuse control characters (C0 with newline and tab, DEL, C1) and',
        "bidirectional controls (U+202A to U+202E, U+2066 to U+2069, U+200E, U+200F, U+061C),",
        "which act on a terminal or reorder what a page shows: `acceptrun spec check` names the",
        "field and the character, e.g. `name: ... (it holds U+202E RIGHT-TO-LEFT OVERRIDE;",
        "remove it)`. Whatever a workload prints is shown with them escaped (docs/ui.md).",
        "",
    ]

    def table(cls: Any, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        lines.extend(["| key | type | default | meaning |", "|---|---|---|---|"])
        nested = []
        for name, f in fields_of(cls).items():
            tp = hints[name]
            if dataclasses.is_dataclass(tp):
                nested.append((name, tp))
                continue
            if f.default is not dataclasses.MISSING:
                default = (
                    "-" if f.default is None else f"`{to_plain(f.default)!r}`".replace("'", '"')
                )
            elif f.default_factory is not dataclasses.MISSING:
                default = f"`{to_plain(f.default_factory())!r}`".replace("'", '"')
            else:
                default = "required"
            kind = _type_name(tp).replace("|", "or")
            constraints = rules_text(rules_of(f))
            if constraints:  # a "|" inside a pattern would end the table cell
                kind += "; " + constraints.replace("|", "\\|")
            lines.append(f"| `{prefix}{name}` | {kind} | {default} | {f.metadata['doc']} |")
        for name, tp in nested:
            lines.extend(["", f"## [{name}]", "", (tp.__doc__ or "").strip().splitlines()[0], ""])
            table(tp, "")

    lines.extend(["## Top level", ""])
    table(RunSpec, "")
    return "\n".join(lines) + "\n"


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if tp is Duration:
        return "duration"
    if origin is list:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"table of {_type_name(get_args(tp)[1])}"
    return {bool: "bool", int: "integer", float: "number", str: "string"}.get(tp, str(tp))


def starter_spec(
    name: str = "my-run",
    command: str = "python train.py",
    file: str = "acceptrun.toml",
    *,
    watch: str | None = None,
    resume_args: Sequence[str] = (),
) -> str:
    """The commented starter spec that ``acceptrun init`` writes to ``file`` (its comments
    name that file). ``watch``: the checkpoint a script saves itself (a path or glob in the
    workdir), which adds ``checkpoint.watch``, ``resume_args`` (commented when not given:
    only the user knows the flag) and a commented ``[progress]`` pattern to fill in."""
    from importlib.resources import files

    text = files("acceptrun").joinpath("spec/templates/spec.toml").read_text(encoding="utf-8")
    # JSON string syntax is valid TOML basic-string syntax: quotes and backslashes escaped.
    text = text.replace("{file}", shlex.quote(file))  # in comments only: shell words
    text = text.replace("{name}", json.dumps(name)).replace("{command}", json.dumps(command))
    # Last: a path or argument that holds "{name}" is not a placeholder.
    own, progress = _own_checkpoint_lines(watch, resume_args) if watch else ("", "")
    return text.replace("{own_checkpoints}", own, 1).replace("{progress}", progress, 1)


def _own_checkpoint_lines(watch: str, resume_args: Sequence[str]) -> tuple[str, str]:
    """The [checkpoint] lines and the [progress] block of a script that saves its own."""
    own = (
        "# The script saves its own checkpoints: each complete one is captured, and a\n"
        "# restart puts the newest back (docs/own-script.md).\n"
        f"watch = [{json.dumps(watch)}]\n"
    )
    if resume_args:
        own += f"resume_args = [{', '.join(json.dumps(a) for a in resume_args)}]\n"
    else:
        # A directory of checkpoints (checkpoint-500/) is how the Trainer saves: its flag.
        example = (
            '["--resume_from_checkpoint", "{checkpoint}"]' if "*" in watch or watch.endswith("/")
            else '["--resume", "{checkpoint}"]'
        )  # fmt: skip
        own += (
            "# Fill in the flag your script resumes with ({checkpoint}: the restored path);\n"
            "# without it a restart starts the script from the beginning.\n"
            f"# resume_args = {example}\n"
        )
    progress = (
        "[progress]                         # steps for lost work and each capture's step\n"
        "# Fill in a regular expression over your script's step line, e.g. for\n"
        "# `iter 200: loss 1.234`:\n"
        "# pattern = 'iter (?P<step>\\d+): loss (?P<loss>[0-9.eE+-]+)'\n"
        '# tensorboard = "runs"           # or: the folder of its TensorBoard event files\n\n'
    )
    return own, progress
