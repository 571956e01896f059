"""Constraints declared once: validation, the JSON Schema and the docs agree on every one.

The cases are generated from the declaration itself: each field's :class:`Rules` yields one
invalid value per constraint (a bound crossed, a value outside the choices, a string off
the pattern or format, a list of the wrong length). Each must be refused by the loader
(SpecError naming the field), by ``acceptrun spec check`` (exit 2), by the dataclass built
in code, and by the JSON Schema; the same spec with a valid value passes all of them.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
import tomli_w
from hypothesis import given
from hypothesis import strategies as st

from acceptrun.cli.main import main
from acceptrun.cost.catalog import PriceEntry, load_catalog
from acceptrun.errors import SpecError, UserError
from acceptrun.spec.fields import FORMATS, Rules, fields_of, rules_of
from acceptrun.spec.model import RunSpec, parse_spec
from acceptrun.spec.problem import Problem
from acceptrun.spec.schema import json_schema, reference_markdown
from acceptrun.spec.units import Duration

# What a section needs to be valid before one of its fields is made invalid: serving and
# inference sections only take other keys once they describe such a run.
BASE: dict[str, dict[str, Any]] = {
    "serving": {
        "url": "http://127.0.0.1:8000/v1",
        "ready_log": "ready",
        "rate": 1.0,
        "duration": 10,
    },
    "inference": {"input": "items.jsonl"},
}
# What one field needs from its neighbours when its value is valid (rules across fields).
NEIGHBOURS: dict[tuple[str, str], dict[str, Any]] = {
    ("serving", "concurrency"): {"rate": None},  # one of rate and concurrency
    ("serving", "slo_ttft"): {"stream": True},  # token timings come from a stream
    ("serving", "slo_itl"): {"stream": True},
    ("serving", "max_ttft_p99"): {"stream": True},
    ("cost", "billing_increment"): {"price_per_hour": 1.0},
}
TOP = {"name": "job", "command": ["python", "train.py"]}
BOUNDS = ("ge", "gt", "le", "lt")


@dataclasses.dataclass(frozen=True)
class Case:
    section: str  # "" for a top-level field
    name: str
    rule: str  # which constraint the value breaks
    value: Any  # the invalid value, as TOML would hold it
    path: str  # the field path the error must name

    @property
    def id(self) -> str:
        return f"{self.section or 'top'}.{self.name}:{self.rule}"


def _scalar(tp: Any) -> Any:
    """The type of one value: Optional unwrapped, list and table items."""
    if get_origin(tp) in (Union, types.UnionType):
        tp = next(a for a in get_args(tp) if a is not type(None))
    if get_origin(tp) in (list, dict):
        tp = get_args(tp)[-1]
    return tp


def _off_pattern(pattern: str) -> str:
    return next(c for c in (" ", "x", "ftp://x", "") if re.search(pattern, c) is None)


def _bad_scalars(rules: Rules, tp: Any) -> list[tuple[str, Any]]:
    """(constraint, value breaking it) for every constraint on one value."""
    step = 1 if tp is int else 0.5
    out: list[tuple[str, Any]] = []
    for name in BOUNDS:
        bound = getattr(rules, name)
        if bound is not None:
            value = {"ge": bound - step, "gt": bound, "le": bound + step, "lt": bound}[name]
            out.append((name, int(value) if tp is int else float(value)))
    if rules.choices:
        out.append(("choices", "not-a-choice"))
    if rules.format is not None:
        out.append(("format", FORMATS[rules.format].invalid))
    if rules.pattern is not None:
        out.append(("pattern", _off_pattern(rules.pattern)))
    return out


def _good_scalar(rules: Rules, tp: Any) -> Any:
    if tp in (int, float, Duration):
        low = rules.ge if rules.ge is not None else (rules.gt + 1 if rules.gt is not None else 0)
        return int(low) if tp is int else float(low)
    return rules.choices[0] if rules.choices else "x"


def _sections() -> list[tuple[str, type]]:
    hints = typing.get_type_hints(RunSpec)
    nested = [(n, hints[n]) for n in fields_of(RunSpec) if dataclasses.is_dataclass(hints[n])]
    return [("", RunSpec), *nested]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for section, cls in _sections():
        hints = typing.get_type_hints(cls)
        for name, f in fields_of(cls).items():
            rules, tp = rules_of(f), hints[name]
            origin = get_origin(_strip_none(tp))
            path = f"{section}.{name}" if section else name
            count = max(rules.min_items or 1, 1)
            for rule, bad in _bad_scalars(rules, _scalar(tp)):
                if origin is list:
                    cases.append(Case(section, name, rule, [bad] * count, path))
                elif origin is dict:
                    cases.append(Case(section, name, rule, {"k": bad}, f"{path}.k"))
                else:
                    cases.append(Case(section, name, rule, bad, path))
            good = _good_scalar(rules, _scalar(tp))
            if rules.min_items:
                short = rules.min_items - 1
                if not (short == 0 and rules.empty_ok):
                    cases.append(Case(section, name, "min_items", [good] * short, path))
            if rules.max_items is not None:
                cases.append(Case(section, name, "max_items", [good] * (rules.max_items + 1), path))
    return cases


def _strip_none(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        return next(a for a in get_args(tp) if a is not type(None))
    return tp


def _table(section: str, name: str, value: Any) -> dict[str, Any]:
    """The section's keys: its base, what ``name`` needs from its neighbours, ``value``."""
    table = {**BASE.get(section, {}), **NEIGHBOURS.get((section, name), {}), name: value}
    return {k: v for k, v in table.items() if v is not None}


def _raw(section: str, name: str, value: Any) -> dict[str, Any]:
    """A spec as TOML data: valid except ``section.name = value``."""
    raw: dict[str, Any] = dict(TOP)
    if section:
        raw[section] = _table(section, name, value)
    else:
        raw[name] = value
    return raw


CASES = _cases()
SCHEMA = json_schema()
try:  # a full JSON Schema validator when the environment has one (dev extra)
    import jsonschema

    VALIDATOR: Any = jsonschema.Draft202012Validator(
        SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
except ImportError:
    VALIDATOR = None


def _nodes(node: Any) -> list[dict[str, Any]]:
    """Every schema object under ``node``, itself included."""
    if isinstance(node, list):
        return [n for item in node for n in _nodes(item)]
    if not isinstance(node, dict):
        return []
    return [node, *(n for v in node.values() for n in _nodes(v))]


def _schema_states(case: Case) -> bool:
    """Does the field's schema carry the keyword of the constraint the case breaks?"""
    props = SCHEMA["properties"]
    node = props[case.section]["properties"][case.name] if case.section else props[case.name]
    cls = dict(_sections())[case.section]
    rules = rules_of(fields_of(cls)[case.name])
    nodes = _nodes(node)
    patterns = [n["pattern"] for n in nodes if isinstance(n.get("pattern"), str)]
    if case.rule in BOUNDS:
        keyword = {
            "ge": "minimum",
            "gt": "exclusiveMinimum",
            "le": "maximum",
            "lt": "exclusiveMaximum",
        }
        bound = getattr(rules, case.rule)
        return any(n.get(keyword[case.rule]) == bound for n in nodes)
    if case.rule == "choices":
        enums = [n["enum"] for n in nodes if "enum" in n]
        if enums:
            return any(list(rules.choices) == e for e in enums)
        return any(
            all(re.search(p, c) for c in rules.choices) and not re.search(p, "not-a-choice")
            for p in patterns
        )
    if case.rule == "pattern":
        return rules.pattern in patterns
    if case.rule == "format":
        wanted = FORMATS[str(rules.format)].schema
        found = {k: v for n in nodes for k, v in n.items() if k in ("format", "pattern")}
        return all(v == found.get(k) or v in patterns for k, v in wanted.items())
    key = {"min_items": "minItems", "max_items": "maxItems"}[case.rule]
    return any(n.get(key) == getattr(rules, case.rule) for n in nodes)


def test_every_declared_constraint_has_a_case() -> None:
    declared = 0
    for _, cls in _sections():
        for f in fields_of(cls).values():
            r = rules_of(f)
            declared += sum(getattr(r, b) is not None for b in BOUNDS)
            declared += bool(r.choices) + (r.format is not None) + (r.pattern is not None)
            declared += (r.max_items is not None) + bool(
                r.min_items and not (r.min_items == 1 and r.empty_ok)
            )
    assert len(CASES) == declared
    assert len(CASES) >= 88  # the spec has that many; a silent drop would show here
    # Every kind of rule is declared somewhere (notify.budget_fractions brought "lt").
    assert {c.rule for c in CASES} == {*BOUNDS, "choices", "format", "pattern"} | {
        "min_items",
        "max_items",
    }


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_loader_schema_and_dataclass_refuse_the_value(case: Case) -> None:
    raw = _raw(case.section, case.name, case.value)
    with pytest.raises(SpecError) as info:
        parse_spec(tomli_w.dumps(raw), source="spec.toml")
    named = [p for p in info.value.problems if p.startswith(f"{case.path}: ")]
    assert named, info.value.problems
    assert "is not valid; expected " in named[0]
    assert _schema_states(case), f"the schema of {case.path} does not state {case.rule}"
    if VALIDATOR is not None:
        assert not VALIDATOR.is_valid(raw), f"the schema accepts {case.id} = {case.value!r}"


@pytest.mark.parametrize("section", [s for s, _ in _sections()])
def test_the_valid_base_passes_loader_and_schema(section: str) -> None:
    raw: dict[str, Any] = {**TOP, **({section: BASE[section]} if section in BASE else {})}
    parse_spec(tomli_w.dumps(raw))
    if VALIDATOR is not None:
        VALIDATOR.validate(raw)


@pytest.mark.parametrize("case", CASES[::7], ids=[c.id for c in CASES[::7]])
def test_spec_check_exits_2_naming_the_field(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(_raw(case.section, case.name, case.value)), encoding="utf-8")
    rc = main(["--workspace", str(tmp_path / "ws"), "spec", "check", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("SpecError: ") and f"{case.path}: " in err, err


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.section], ids=[c.id for c in CASES if c.section]
)
def test_a_section_built_in_code_obeys_the_same_rules(case: Case) -> None:
    cls = dict(_sections())[case.section]
    kwargs = _table(case.section, case.name, case.value)
    with pytest.raises(Problem) as info:
        cls(**kwargs)
    assert str(info.value).startswith(f"{case.path}: "), info.value


@pytest.mark.parametrize(
    ("section", "name", "typo", "meant"),
    [
        pytest.param("limits", "on_divergence", "rolback", "rollback", id="enum"),
        pytest.param("serving", "method", "pots", "POST", id="any-case"),
        pytest.param("acceptance", "drills", ["restor"], "restore", id="list-item"),
    ],
)
def test_a_typo_in_an_allowed_value_gets_did_you_mean(
    section: str, name: str, typo: Any, meant: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(tomli_w.dumps(_raw(section, name, typo)))
    (problem,) = info.value.problems
    assert problem.startswith(f"{section}.{name}: ") and f"did you mean {meant!r}?" in problem


def test_the_docs_table_shows_each_constraint() -> None:
    doc = reference_markdown()
    rows = {
        line.split("|")[1].strip(" `"): line for line in doc.splitlines() if line.startswith("| `")
    }
    assert ">= 2" in rows["keep_last"]
    assert "`stop`, `rollback`" in rows["on_divergence"]
    assert ">= 0, <= 65535" in rows["prometheus_port"]
    assert "USD per hour" in rows["price_per_hour"]
    assert "version pattern" in rows["python"]


# ---- bounds as properties: loader and schema agree on any number ---------------------------

NUMERIC = [
    (section, name, rules_of(f), typing.get_type_hints(cls)[name])
    for section, cls in _sections()
    for name, f in fields_of(cls).items()
    if rules_of(f).has_bounds and get_origin(_strip_none(typing.get_type_hints(cls)[name])) is None
]


@given(field=st.sampled_from(NUMERIC), x=st.floats(-1e6, 1e6, allow_nan=False))
def test_any_number_is_accepted_by_both_or_refused_by_both(
    field: tuple[str, str, Rules, Any], x: float
) -> None:
    section, name, rules, tp = field
    value: Any = int(x) if _scalar(tp) is int else x
    raw = _raw(section, name, value)
    inside = (
        (rules.ge is None or value >= rules.ge)
        and (rules.gt is None or value > rules.gt)
        and (rules.le is None or value <= rules.le)
        and (rules.lt is None or value < rules.lt)
    )
    try:
        parse_spec(tomli_w.dumps(raw))
        loaded = True
    except SpecError:
        loaded = False
    assert loaded == inside, (section, name, value)
    if VALIDATOR is not None:
        assert VALIDATOR.is_valid(raw) == inside, (section, name, value)


# ---- the price catalog uses the same mechanism -----------------------------------------------

ENTRY = {
    "provider": "lambda",
    "instance": "gpu_1x_h100_sxm5",
    "gpus": 1,
    "gpu": "H100",
    "price_per_hour": 2.5,
    "billing": "per_minute",
    "start_rule": "health_check",
    "storage_per_gib_month": 0.2,
    "source": "our contract",
    "date": "2026-12-01",
}
PRICE_CASES = [
    (name, rule, bad)
    for name, f in fields_of(PriceEntry).items()
    for rule, bad in _bad_scalars(rules_of(f), _scalar(typing.get_type_hints(PriceEntry)[name]))
]


@pytest.mark.parametrize(
    ("name", "rule", "bad"), PRICE_CASES, ids=[f"{n}:{r}" for n, r, _ in PRICE_CASES]
)
def test_a_damaged_price_entry_names_file_entry_field_and_value(
    tmp_path: Path, name: str, rule: str, bad: Any
) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(tomli_w.dumps({"price": [ENTRY, {**ENTRY, name: bad}]}), encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_catalog(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "price[1] " in message and f".{name}: {bad!r} is not valid" in message, message


def test_every_price_field_with_a_rule_has_a_case() -> None:
    ruled = {n for n, f in fields_of(PriceEntry).items() if not rules_of(f).empty}
    assert {n for n, _, _ in PRICE_CASES} == ruled
    assert {"gpus", "price_per_hour", "billing", "start_rule"} <= ruled
