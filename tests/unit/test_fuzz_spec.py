"""Fuzzing the spec loader: any TOML, any structure, only ever a SpecError.

The generator walks the declared dataclasses of :mod:`acceptrun.spec` so every field gets
right and wrong types, out-of-range numbers, unknown keys, nested junk, huge strings and
control characters. ``parse_spec`` must raise nothing but :class:`SpecError`, and the CLI's
``spec check`` must exit 2 with a message naming the field. Counts go to
``FUZZ_COUNTS`` so ``bench/fuzz_campaign.py`` can print them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import types
import typing
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acceptrun.cli.main import main
from acceptrun.errors import SpecError
from acceptrun.spec import model as spec_model
from acceptrun.spec.model import RunSpec, load_spec, parse_spec

FUZZ_COUNTS: dict[str, int] = {}


def _count(target: str) -> None:
    FUZZ_COUNTS[target] = FUZZ_COUNTS.get(target, 0) + 1


# ---- value strategies ---------------------------------------------------------------------

# Control characters, bidi overrides, NUL, surrogates-free unicode and huge strings.
_NASTY_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8", max_codepoint=0x1F), max_size=20),
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "\x1b[31mred\x1b[0m",
            "\u202eevil",
            "../../etc/passwd",
            "/etc/passwd",
            "<script>alert(1)</script>",
            "[x](javascript:alert(1))",
            "10m",
            "-5s",
            "1e400",
            "nan",
            "inf",
            ">=",
            ">= 0.9",
            "loss:min",
            "eval/loss:max",
            "~/x",
            "s3://b/k",
            "python train.py",
            "'unbalanced",
            "*",
            "[",
            "{}",
            "x" * 5000,
        ]
    ),
    st.integers(min_value=1, max_value=3).map(lambda n: "é" * (10_000 * n)),
)
_NUMBERS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 1, 2, 10**18, -(10**18)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-320, 1e308, math.inf, -math.inf, math.nan]),
)
_SCALARS = st.one_of(
    _NASTY_TEXT,
    _NUMBERS,
    st.booleans(),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 1, 1)),
    st.dates(),
    st.times(),
)
_KEYS = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(["", " ", "\x7f", "a.b", "<b>", "../x", "name", "command", "step"]),
)
# Nested junk: lists and tables of anything, a few levels deep.
_JUNK = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=12,
)


def _valid_ish(tp: Any) -> st.SearchStrategy[Any]:
    """Values of roughly the right type (often out of range) for a declared field type."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return st.one_of(*(_valid_ish(o) for o in options))
    if dataclasses.is_dataclass(tp):
        return st.dictionaries(_KEYS, _JUNK, max_size=3)
    if tp is spec_model.Duration:
        return st.one_of(_NUMBERS, st.sampled_from(["90s", "10m", "1h30m", "0s", "-1m", "2x"]))
    if origin is list:
        (item,) = get_args(tp)
        return st.lists(_valid_ish(item), max_size=4)
    if origin is dict:
        _, item = get_args(tp)
        return st.dictionaries(_KEYS, _valid_ish(item), max_size=4)
    if tp is bool:
        return st.booleans()
    if tp in (int, float):
        return _NUMBERS
    return _NASTY_TEXT


def _field_value(tp: Any) -> st.SearchStrategy[Any]:
    """Mostly values of the declared type, sometimes anything at all."""
    return st.one_of(_valid_ish(tp), _valid_ish(tp), _JUNK)


def _leaves(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every declared field, sections and their fields, as (path, type)."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[tuple[str, ...], Any]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        tp, path = hints[f.name], (*prefix, f.name)
        out.append((path, tp))
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, path)  # type: ignore[arg-type]
    return out


LEAVES = _leaves(RunSpec)


def _value_at(path: tuple[str, ...], tp: Any) -> st.SearchStrategy[Any]:
    if dataclasses.is_dataclass(tp):  # a whole section: junk, or a table of junk keys
        return st.one_of(_JUNK, st.dictionaries(_KEYS, _JUNK, max_size=3))
    return _field_value(tp)


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        nxt = doc.get(part)
        if not isinstance(nxt, dict):
            nxt = doc[part] = {}
        doc = nxt
    doc[path[-1]] = value


def _assemble(picks: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path, value in picks:
        _put(doc, path, value)
    return doc


def _spec_dict() -> st.SearchStrategy[dict[str, Any]]:
    """A spec with a handful of declared fields (any section, any depth) set to fuzz."""
    pick = st.sampled_from(LEAVES).flatmap(
        lambda leaf: _value_at(*leaf).map(lambda v: (leaf[0], v))
    )
    unknown = st.tuples(st.lists(_KEYS, min_size=1, max_size=3).map(tuple), _JUNK)
    base = st.fixed_dictionaries(
        {"name": st.one_of(st.just("t"), _NASTY_TEXT), "command": _field_value(list[str])}
    )
    return st.tuples(base, st.lists(pick, max_size=6), st.lists(unknown, max_size=2)).map(
        lambda t: {**_assemble(t[2] + t[1]), **t[0]}
    )


def _toml(doc: dict[str, Any]) -> str | None:
    try:
        return tomli_w.dumps(doc)
    except (TypeError, ValueError):  # e.g. a key TOML cannot write; not the loader's input
        return None


def _only_spec_error(text: str, source: str = "<fuzz>") -> None:
    try:
        parse_spec(text, source=source, base_dir="/tmp")
    except SpecError as exc:
        assert str(exc).startswith(source), str(exc)
        assert exc.problems and all(p.strip() for p in exc.problems), exc.problems


# ---- properties ---------------------------------------------------------------------------


@given(doc=_spec_dict())
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_any_structure_loads_or_raises_spec_error(doc: dict[str, Any]) -> None:
    _count("spec structures")
    text = _toml(doc)
    if text is not None:
        _only_spec_error(text)


@given(key=st.sampled_from(sorted(spec_model._fields(RunSpec))), value=_JUNK)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_junk_in_every_top_level_key(key: str, value: Any) -> None:
    _count("spec junk per key")
    doc: dict[str, Any] = {"name": "t", "command": ["python", "x.py"], key: value}
    text = _toml(doc)
    if text is not None:
        _only_spec_error(text)


@given(
    text=st.one_of(
        st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace"))
    )
)
def test_any_text_loads_or_raises_spec_error(text: str) -> None:
    _count("spec raw text")
    _only_spec_error(text)


@given(data=st.binary(max_size=400))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_file_bytes_load_or_raise_spec_error(tmp_path: Path, data: bytes) -> None:
    _count("spec file bytes")
    path = tmp_path / "spec.toml"
    path.write_bytes(data)
    try:
        load_spec(path)
    except SpecError as exc:
        assert str(path) in str(exc)


# ---- the CLI: exit 2, the field, the value and what is accepted -----------------------------

# (a spec's lines, the field path the message must name, a fragment of what is accepted)
_BAD = [
    pytest.param('resources.gpus = "two"', "resources.gpus", "whole number", id="wrong-type"),
    pytest.param("resources.gpus = -3", "resources.gpus", "0 or more", id="out-of-range"),
    pytest.param("limits.max_restarts = 1e400", "limits.max_restarts", "whole number", id="inf"),
    pytest.param("telemetry.interval = nan", "telemetry.interval", "finite", id="nan"),
    pytest.param('limits.wall_time = "10 parsecs"', "limits.wall_time", "duration", id="dur"),
    pytest.param("limits.bogus = 1", "limits.bogus", "unknown key", id="unknown-key"),
    pytest.param('acceptance = "x"', "acceptance", "a table", id="section-not-table"),
    pytest.param("env = { A = [1, { b = 2 }] }", "env.A", "a string", id="nested-junk"),
    pytest.param('name = "\\u0000\\u001b[2J"', "name", "control characters", id="control-name"),
    pytest.param(
        'acceptance.metrics = { loss = "about 1" }', "acceptance.metrics.loss", "threshold",
        id="condition",
    ),
    pytest.param(
        'checkpoint.watch = ["../ckpt.pt"]', "checkpoint.watch", "inside the workdir",
        id="watch-outside",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "field", "accepted"), _BAD)
def test_cli_spec_check_exits_2_naming_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, field: str, accepted: str
) -> None:
    path = tmp_path / "spec.toml"
    head = 'name = "t"\ncommand = ["python", "x.py"]\n'
    if lines.startswith("name ="):
        head = 'command = ["python", "x.py"]\n'
    path.write_text(head + lines + "\n")
    rc = main(["--workspace", str(tmp_path / "ws"), "spec", "check", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.startswith("SpecError: "), err
    assert field in err and accepted in err, err
    assert "\x1b" not in err and "\x00" not in err, repr(err)


@given(doc=_spec_dict())
@settings(
    max_examples=max(10, settings.default.max_examples // 4),  # each case runs the whole check
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_cli_spec_check_on_any_structure_exits_0_or_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any]
) -> None:
    """Past the loader too (static preflight, usage detection): 0 or 2, never a traceback."""
    _count("spec check (CLI)")
    text = _toml(doc)
    if text is None:
        return
    path = tmp_path / "spec.toml"
    path.write_text(text, encoding="utf-8")
    rc = main(["--workspace", str(tmp_path / "ws"), "spec", "check", str(path)])
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    if rc == 2:
        assert err.startswith(("SpecError: ", "UserError: ", "PreflightError: ")), err
