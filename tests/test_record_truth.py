"""The record tells the truth: diff, workspace discovery and its .gitignore, provenance,
mirror retention, the ledger of CPU and failed-preflight runs, git-ignored data.

Real files, real git repositories and real ``acceptrun`` processes in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acceptrun.diff import diff_runs, format_run_diff
from acceptrun.workspace import RunRecord, Workspace

PYTHON = sys.executable


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.stdout.strip()


def _acceptrun(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", *args],
        cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


# ---- 1. diff says what it compared ---------------------------------------------------------


def _record(ws: Workspace, name: str, events: list[dict[str, Any]], data_root: str | None) -> RunRecord:
    record = ws.create_run(name, spec_text=f'name = "{name}"\ncommand = ["true"]\n', state={})
    for ev in events:
        fields = dict(ev)
        record.event(fields.pop("kind"), **fields)
    record.flush_events()
    if data_root is not None:
        details = {"expected_root_hash": data_root, "root_hash": data_root, "verified": True}
        record.write_json("preflight.json", {"checks": [{"name": "data", "details": details}]})
    return record


def test_diff_of_runs_with_nothing_in_common_is_neither_reproduced_nor_bitwise(
    tmp_path: Path,
) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    # Same data, but no metric, no loss and no output: nothing about the result was compared.
    a = _record(ws, "a", [], data_root="xxh3_128:aa")
    b = _record(ws, "b", [], data_root="xxh3_128:aa")
    d = diff_runs(a, b)
    assert d.reproduced is False and d.bitwise is False
    text = format_run_diff(d)
    first = text.splitlines()[0]
    assert "bitwise" not in first and "reproduced within" not in first
    assert "nothing to compare" in first
    assert "not compared: metrics" in text and "loss curve" in text and "output hashes" in text


def test_diff_names_what_was_and_was_not_compared(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    steps = [{"kind": "step", "step": s, "loss": 1.0 / (s + 1)} for s in range(5)]
    a = _record(ws, "a", [*steps, {"kind": "metric", "name": "acc", "value": 0.5}], None)
    b = _record(ws, "b", [*steps, {"kind": "metric", "name": "acc", "value": 0.5}], None)
    d = diff_runs(a, b)
    assert d.reproduced is True and d.bitwise is True
    first = format_run_diff(d).splitlines()[0]
    assert "1 metric and the loss at 5 steps exactly equal" in first
    assert d.to_dict()["compared"] == {"data": False, "metrics": 1, "loss_steps": 5, "outputs": 0}
    assert "output hashes (neither run registered an output)" in d.to_dict()["not_compared"]
    assert "  not compared: output hashes" in format_run_diff(d)

    # Equal metrics alone: reproduced within tolerance, but "bitwise" needs bytes or losses.
    m = {"kind": "metric", "name": "acc", "value": 0.5}
    only_metrics = diff_runs(_record(ws, "m1", [m], None), _record(ws, "m2", [m], None))
    assert only_metrics.reproduced and not only_metrics.bitwise
    assert only_metrics.conclusion == "reproduced within tolerance: compared 1 metric"

    # Losses only in one run each, no common step: compared nothing, reproduced nothing.
    c = _record(ws, "c", [{"kind": "step", "step": 9, "loss": 0.1}], None)
    e = diff_runs(c, _record(ws, "e", [{"kind": "step", "step": 10, "loss": 0.1}], None))
    assert not e.reproduced and not e.bitwise
    assert "nothing to compare" in e.conclusion


def test_diff_says_bitwise_only_over_output_hashes_and_the_loss(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    out = {"kind": "output", "name": "model", "hash": "xxh3_128:11", "path": "m", "size": 1}
    steps = [{"kind": "step", "step": s, "loss": 0.5} for s in range(3)]
    a = _record(ws, "a", [*steps, dict(out)], None)
    b = _record(ws, "b", [*steps, dict(out)], None)
    d = diff_runs(a, b)
    assert d.reproduced and d.bitwise
    first = format_run_diff(d).splitlines()[0]
    assert "bitwise" in first and "1 output hash" in first and "the loss at 3 steps" in first
