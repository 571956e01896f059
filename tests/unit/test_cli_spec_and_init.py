"""The ``acceptrun`` command in-process: a bad spec refused before any record, ``spec check``
and ``spec schema``, ``init``'s starter (real processes: tests/integration/test_cli.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from conftest import assert_no_run_left, assert_one_message, run_main

PYTHON = sys.executable


# ---- bad input: exit 2, one message, no run record -------------------------------------------


BAD_SPECS = [
    pytest.param(
        "name = 'x'\ncommand = [\"true\"\n[limits]\n",
        "SpecError",
        ["spec.toml", "TOML syntax error", "line 3, column 1"],
        id="toml-syntax",
    ),
    pytest.param(
        f'name = "x"\ncommand = ["{PYTHON}", "-c", "pass"]\n[limits]\nwal_time = "1h"\n',
        "SpecError",
        ["limits.wal_time", "unknown key", "did you mean 'wall_time'"],
        id="unknown-key",
    ),
    pytest.param(
        f'name = "x"\ncommand = ["{PYTHON}", "-c", "pass"]\n[checkpoint]\nevery_steps = -5\n',
        "SpecError",
        ["checkpoint.every_steps", "-5", "positive step count"],
        id="negative-every-steps",
    ),
    pytest.param(
        'name = "x"\ncommand = ["no-such-program-xyz", "--flag"]\n',
        "PreflightError",
        ["command", "'no-such-program-xyz'", "not found on PATH", "install it"],
        id="command-not-found",
    ),
    pytest.param(
        'name = "x"\ncommand = "no-such-program-xyz --flag | cat"\n',
        "PreflightError",
        ["'no-such-program-xyz'", "not found on PATH"],
        id="shell-command-not-found",
    ),
    pytest.param(
        f'name = "x"\ncommand = ["{PYTHON}", "-c", "pass"]\n[data]\npath = "no-data-here"\n',
        "PreflightError",
        ["data.path", "no-data-here", "does not exist", "fix `data.path`"],
        id="data-path-missing",
    ),
    pytest.param(
        f'name = "x"\ncommand = ["{PYTHON}", "-c", "pass"]\n'
        '[data]\npath = "."\nmanifest = "data.manifest.json"\n',
        "PreflightError",
        ["data.manifest", "data.manifest.json", "does not exist", "acceptrun data snapshot"],
        id="manifest-missing",
    ),
]


@pytest.mark.parametrize(("text", "error_type", "needles"), BAD_SPECS)
def test_bad_spec_is_refused_before_any_record(
    project: Any, capsys: pytest.CaptureFixture[str], text: str, error_type: str, needles: list[str]
) -> None:
    spec = project.root / "spec.toml"
    spec.write_text(text)

    code, out, err = run_main(capsys, "--workspace", str(project.workspace), "run", str(spec))

    assert code == 2, (out, err)
    message = assert_one_message(err, error_type)
    for needle in needles:
        assert needle in message, (needle, message)
    assert_no_run_left(project)


# ---- spec tools ---------------------------------------------------------------------------------


def test_spec_check_accepts_a_good_spec(project: Any, capsys: pytest.CaptureFixture[str]) -> None:
    spec = project.spec(command=[PYTHON, "-c", "pass"], extra='[limits]\nwall_time = "2h"\n')

    code, out, err = run_main(capsys, "spec", "check", str(spec))

    assert code == 0, err
    assert out.splitlines()[0] == f"{spec}: ok"
    assert "wall time 2h00m" in out
    assert not project.workspace.exists()  # checking a spec creates nothing


def test_spec_schema_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "spec", "schema")

    assert code == 0
    schema = json.loads(out)
    assert "properties" in schema
    assert {"name", "command", "limits"} <= set(schema["properties"])
    assert "wall_time" in schema["properties"]["limits"]["properties"]


def test_init_writes_a_starter_that_checks_and_refuses_to_overwrite(
    project: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project.root / "acceptrun.toml"
    command = f"{PYTHON} -c pass"

    code, out, err = run_main(capsys, "init", str(path), "--name", "starter", "--command", command)
    assert code == 0, err
    assert path.is_file() and "spec check" in out

    code, out, err = run_main(capsys, "spec", "check", str(path))
    assert code == 0, err
    assert "starter" in out and command in out

    path.write_text(path.read_text() + "# my edits\n")
    code, out, err = run_main(capsys, "init", str(path), "--command", command)
    assert code == 2
    assert "already exists" in err and "--force" in err
    assert path.read_text().endswith("# my edits\n")  # untouched

    code, out, err = run_main(capsys, "init", str(path), "--force", "--command", command)
    assert code == 0, err
    assert "# my edits" not in path.read_text()
