"""tools/suite_cpu.py: the table of where the suite's CPU goes, from a per-test log."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "suite_cpu.py"


def run_tool(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    spec = importlib.util.spec_from_file_location("suite_cpu", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["suite_cpu.py", *args])
    assert module.main() == 0


def test_files_and_tests_are_ranked_by_cpu_with_the_two_core_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "cpu.jsonl"
    rows = [
        {"test": "tests/integration/test_a.py::test_light", "own": 1.0, "children": 2.0, "wall": 4},
        {"test": "tests/integration/test_b.py::test_heavy", "own": 0.5, "children": 59.5, "wall": 30},
        {"test": "tests/integration/test_a.py::test_mid", "own": 7.0, "children": 0.0, "wall": 7},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_tool(monkeypatch, str(log), "--top", "2")
    out = capsys.readouterr().out
    assert "tests 3   CPU 70 s (in pytest 8 s, in children 62 s)   floor on 2 cores 0.6 min" in out
    files = out.split("\n\n")[1].splitlines()
    assert files[1].split()[-1] == "tests/integration/test_b.py"  # 60 s before test_a's 10 s
    assert "85.7%" in files[1] and "14.3%" in files[2]
    tests = out.split("\n\n")[2].splitlines()
    assert tests[1].endswith("test_b.py::test_heavy") and tests[2].endswith("test_a.py::test_mid")
    assert len(tests) == 3  # --top 2


def test_an_empty_or_missing_log_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match="ACCEPTRUN_TEST_CPU_LOG"):
        run_tool(monkeypatch, str(tmp_path / "none.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit, match="holds no test"):
        run_tool(monkeypatch, str(tmp_path / "empty.jsonl"))
