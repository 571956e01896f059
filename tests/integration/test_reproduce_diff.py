"""Reproduce a recorded run from its commit and diff, then compare runs with ``acceptrun diff``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from acceptrun.report.howto import format_howto

PYTHON = sys.executable

# Deterministic and torch-free: the same seed gives the same losses and the same bytes.
WORK = """
import os, random
import acceptrun

RATE = 0.1
rng = random.Random(int(os.environ["SEED"]))
run = acceptrun.init()
w = 0.0
for step in run.steps(0, 30):
    with run.data_wait():
        x = rng.random()
    w += RATE * (x - w)
    run.log(step, loss=(1.0 - w) ** 2, samples=8)
run.metric("final/w", w)
with open("model.txt", "w") as f:
    f.write(repr(w))
run.output("model", "model.txt")
"""


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.stdout.strip()


def _cli(ws: Path, cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A repository whose run was made with uncommitted changes, before a later commit."""
    root = tmp_path_factory.mktemp("repro")
    proj, ws = root / "proj", root / "ws"
    proj.mkdir()
    (proj / "work.py").write_text(textwrap.dedent(WORK))
    (proj / ".gitignore").write_text("model.txt\n")
    spec = 'name = "det"\ncommand = ["{py}", "work.py"]\nenv = {{ SEED = "{seed}" }}\n'
    spec += '[acceptance]\noutputs = ["model"]\ntolerances = {{ loss = 1e-12 }}\n'
    (proj / "spec.toml").write_text(spec.format(py=PYTHON, seed=7))
    (proj / "other.toml").write_text(spec.format(py=PYTHON, seed=8))
    _git(proj, "init", "-q")
    _git(proj, "add", ".")
    _git(proj, "commit", "-qm", "first")
    first = _git(proj, "rev-parse", "HEAD")
    # The original run: with an uncommitted change (RATE 0.1 -> 0.3), so git.diff matters.
    (proj / "work.py").write_text(textwrap.dedent(WORK).replace("RATE = 0.1", "RATE = 0.3"))
    original = _cli(ws, proj, "run", "-q", "spec.toml")
    assert original.returncode == 0, original.stdout + original.stderr
    # Then the code moves on: another rate, committed. HEAD is no longer the run's commit.
    (proj / "work.py").write_text(textwrap.dedent(WORK).replace("RATE = 0.1", "RATE = 0.5"))
    _git(proj, "commit", "-qam", "second")
    (run_id,) = [p.name for p in (ws / "runs").iterdir()]
    return {"proj": proj, "ws": ws, "first": first, "original": run_id}


@pytest.mark.slow
def test_reproduce_rebuilds_the_code_and_diff_says_bitwise(repo: dict[str, Any]) -> None:
    proj, ws, original = repo["proj"], repo["ws"], repo["original"]
    # A different run starts at once, in the checkout, while the reproduction runs in its worktree.
    other = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "other.toml"],
        cwd=proj, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")},
    )  # fmt: skip
    proc = _cli(ws, proj, "reproduce", "-q", original)
    other_out, _ = other.communicate(timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert other.returncode == 0, other_out
    worktree = ws / "worktrees" / original
    assert f"code: worktree {worktree} at {repo['first'][:12]}" in proc.stderr
    assert "the run had uncommitted changes" in proc.stderr
    assert "code: the recorded git.diff applied" in proc.stderr
    assert "RATE = 0.3" in (worktree / "work.py").read_text()  # the code that ran, not HEAD's
    assert _git(worktree, "rev-parse", "HEAD") == repo["first"]

    new_id = proc.stdout.strip().splitlines()[-1].split()[-1]
    new = RunRecord(ws / "runs" / new_id)
    assert new.state["reproduces"] == original
    (mark,) = list(new.events("reproduces"))
    assert mark["of"] == original and mark["diff_applied"] is True
    prov = new.read_json("provenance.json")
    assert prov["git"]["root"] == str(worktree)
    assert (
        prov["git"]["diff_hash"]
        == RunRecord(ws / "runs" / original).read_json("provenance.json")["git"]["diff_hash"]
    )

    diff = _cli(ws, proj, "diff", original, new_id)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    first_line = diff.stdout.splitlines()[0]
    assert first_line == (
        f"{new_id} vs {original}: reproduced within tolerance, bitwise: "
        "1 metric, the loss at 30 steps and 1 output hash exactly equal"
    )
    assert "loss     30 common steps, largest difference 0" in diff.stdout
    assert "git.root:" in diff.stdout  # the environment changed: listed as context

    # The different run (another seed) does not reproduce the original; the diff says why.
    other_id = next(p.name for p in (ws / "runs").iterdir() if p.name not in (original, new_id))
    bad = _cli(ws, proj, "diff", "--json", original, other_id)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    result = json.loads(bad.stdout)
    assert result["reproduced"] is False and result["bitwise"] is False
    diffs = "\n".join(result["differences"])
    assert "metric final/w:" in diffs and "(no tolerance: must match exactly)" in diffs
    assert "loss curve: differs by up to" in diffs and "(tolerance 1e-12)" in diffs
    (output,) = result["outputs"]
    assert output["name"] == "model" and output["same"] is False
    assert {c["path"] for c in result["provenance"]} >= {"git.commit", "git.diff_hash"}


@pytest.mark.slow
def test_howto_lists_the_commands_to_repeat_the_run(repo: dict[str, Any]) -> None:
    record = RunRecord(repo["ws"] / "runs" / repo["original"])
    text = format_howto(record)
    lines = text.splitlines()
    assert f"git checkout --detach {repo['first']}" in lines
    assert f"git apply --binary /tmp/{record.run_id}.git.diff" in lines
    assert any(line.startswith("pip install -r /tmp/") for line in lines)
    assert any(line.startswith("numpy==") for line in lines)  # the recorded versions
    assert "acceptrun run spec.toml" in lines
    assert f"acceptrun diff {record.run_id} latest" in lines
    proc = _cli(repo["ws"], repo["proj"], "howto", record.run_id)
    assert proc.returncode == 0 and proc.stdout.strip() == text
