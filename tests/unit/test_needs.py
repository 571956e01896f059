"""Preflight's dependencies check: each feature's package where the feature runs."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from acceptrun.capture.needs import check_needs, needs_of
from acceptrun.spec.model import parse_spec

BASE = 'name = "n"\ncommand = ["python", "train.py"]\n'


def here(module: str) -> bool:
    """Whether this interpreter (acceptrun's, in the check) has ``module``."""
    return importlib.util.find_spec(module) is not None


def prov(*names: str) -> dict[str, Any]:
    return {"packages": {"list": {n: "1.0" for n in names}}}


def test_a_plain_spec_needs_nothing_beyond_acceptrun() -> None:
    spec = parse_spec(BASE)
    assert needs_of(spec) == []
    ok, message, _ = check_needs(spec, prov("torch"), sys.executable)
    assert ok and "nothing beyond" in message


@pytest.mark.parametrize("url", ["/data/mirror", "file:///data/mirror", "memory://m"])
def test_a_local_or_builtin_mirror_needs_no_package(url: str) -> None:
    spec = parse_spec(BASE + f'[checkpoint]\nmirror = "{url}"\n')
    assert needs_of(spec) == []


def test_an_s3_mirror_missing_in_the_workload_interpreter_is_refused_with_the_extra() -> None:
    spec = parse_spec(BASE + '[checkpoint]\nmirror = "s3://bucket/ckpt"\n')
    (need,) = needs_of(spec)
    assert need.module == "s3fs" and need.where == ("acceptrun", "workload")
    ok, message, details = check_needs(spec, prov("torch", "numpy"), "/venv/bin/python")
    assert not ok
    assert "checkpoint.mirror = 's3://bucket/ckpt' needs s3fs" in message
    assert "the workload's interpreter (/venv/bin/python)" in message
    assert "pip install 'acceptrun[s3]' (with /venv/bin/python -m pip)" in details["fix"]
    how = 'the command\'s "python", found on PATH'
    ok, message, _ = check_needs(spec, prov("torch"), "/venv/bin/python", how)
    assert f"the workload's interpreter (/venv/bin/python, {how})" in message  # and how found
    ok, message, details = check_needs(spec, prov("torch", "s3fs"), "/venv/bin/python")
    assert ok == here("s3fs"), message  # acceptrun's own interpreter is asked too
    assert {c["where"] for c in details["checked"]} == {"acceptrun", "workload"}


def test_a_command_that_is_not_python_is_asked_nothing_of_its_interpreter() -> None:
    spec = parse_spec(BASE + '[checkpoint]\nmirror = "s3://bucket/ckpt"\n')
    ok, _message, details = check_needs(spec, prov(), None)
    assert ok == here("s3fs") and {c["where"] for c in details["checked"]} == {"acceptrun"}


def test_tensorboard_progress_needs_tensorboard_in_acceptrun_s_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = parse_spec(BASE + '[progress]\ntensorboard = "runs"\n')
    (need,) = needs_of(spec)
    assert need.where == ("acceptrun",)
    assert check_needs(spec, prov(), sys.executable)[0] == here("tensorboard")
    real = importlib.util.find_spec  # then as where it is not installed
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    ok, message, details = check_needs(spec, prov(), sys.executable)
    assert not ok and "progress.tensorboard needs tensorboard" in message
    assert details["fix"] == "pip install 'acceptrun[tensorboard]'"
