"""Eight runs, gc, index rebuild, ls and cost at once in one workspace.

Every run must end with its verdict and be listed with it; gc must never touch a live run
nor the newest verified checkpoint of any run; the SQLite index must pass its integrity
check and equal a fresh rebuild; no command may fail, print a traceback or meet
"database is locked".
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord, Workspace

pytestmark = pytest.mark.slow

PYTHON = sys.executable

# A tiny workload: 12 steps, a checkpoint every third, about a second of work. Its state is
# a numpy array: what is tested is the workspace under concurrency, not torch's state.
WORK = """
import time
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(4, 1))
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 12):
    time.sleep(0.08)
    run.log(step, loss=1.0 / (step + 1))
    if step % 3 == 2:
        run.checkpoint(step, block=True)
run.metric("acc", 0.95)
"""

SPEC = """
name = {name}
command = [{python}, "work.py"]
[checkpoint]
keep_last = 2
[acceptance]
metrics = {{ acc = ">= 0.9" }}
"""

# Each side command: its arguments after `acceptrun --workspace WS`.
SIDE_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("gc", "--apply"),
    ("index", "rebuild"),
    ("ls", "-n", "100"),
    ("cost",),
)


@dataclass
class Outcome:
    """What one process did: its arguments, exit status and output."""

    args: tuple[str, ...]
    returncode: int
    output: str


@dataclass
class Scenario:
    """The result of :func:`run_concurrently`."""

    workspace: Path
    runs: list[Outcome] = field(default_factory=list)
    side: list[Outcome] = field(default_factory=list)


def _cli(workspace: Path, *args: str) -> list[str]:
    return [PYTHON, "-m", "acceptrun", "--workspace", str(workspace), *args]


def run_concurrently(root: Path, n_runs: int = 8, timeout: float = 900) -> Scenario:
    """Start ``n_runs`` runs in one workspace under ``root`` with gc, index rebuild, ls and
    cost looping beside them until the runs end (also used by bench/chaos.py)."""
    workspace = root / ".acceptrun"
    Workspace.create(workspace)
    scenario = Scenario(workspace)
    jobs: list[tuple[Path, subprocess.Popen[str]]] = []
    for i in range(n_runs):
        job = root / f"job{i}"
        job.mkdir()
        (job / "work.py").write_text(textwrap.dedent(WORK))
        (job / "spec.toml").write_text(
            SPEC.format(name=json.dumps(f"conc{i}"), python=json.dumps(PYTHON))
        )
    for i in range(n_runs):
        job = root / f"job{i}"
        proc = subprocess.Popen(
            _cli(workspace, "run", "-q", "spec.toml"),
            cwd=job,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        jobs.append((job, proc))
    done = threading.Event()

    def side_loop(args: tuple[str, ...]) -> None:
        # Each side command runs at least twice, and on until every run has ended.
        count = 0
        while not done.is_set() or count < 2:
            proc = subprocess.run(
                _cli(workspace, *args),
                cwd=root,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            scenario.side.append(Outcome(args, proc.returncode, proc.stdout + proc.stderr))
            count += 1

    threads = [threading.Thread(target=side_loop, args=(a,)) for a in SIDE_COMMANDS]
    for t in threads:
        t.start()
    try:
        for job, proc in jobs:
            out, _ = proc.communicate(timeout=timeout)
            scenario.runs.append(Outcome(("run", str(job)), proc.returncode, out))
    finally:
        done.set()
        for _job, proc in jobs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for t in threads:
            t.join(timeout)
    return scenario


def problems(scenario: Scenario) -> list[str]:
    """Every broken promise of a finished scenario, as sentences (empty when none)."""
    found: list[str] = []
    for o in scenario.runs + scenario.side:
        if o.returncode != 0:
            found.append(f"{' '.join(o.args)} exited {o.returncode}: {o.output[-2000:]}")
        for bad in ("Traceback", "database is locked"):
            if bad in o.output:
                found.append(f"{' '.join(o.args)} printed {bad!r}: {o.output[-2000:]}")
    ws = Workspace(scenario.workspace)
    records = [RunRecord(ws.runs_dir / run_id) for run_id in ws.run_ids()]
    if len(records) != len(scenario.runs):
        found.append(f"{len(records)} run directories for {len(scenario.runs)} runs")
    for record in records:
        state = record.state
        if state.get("verdict") is None or state.get("status") != "finished":
            found.append(
                f"{record.run_id}: status {state.get('status')}, verdict {state.get('verdict')}"
            )
        for name in ("run.json", "spec.toml", "events.jsonl", "verdict.json"):
            if not record.exists(name):
                found.append(f"{record.run_id}: {name} is missing")
        store = CheckpointStore(record.checkpoints_dir)
        steps = [info.step for info in store.list()]
        if 11 not in steps:
            found.append(f"{record.run_id}: newest checkpoint (step 11) gone; on disk {steps}")
        else:
            result = store.verify(11)
            if not result.ok:
                found.append(f"{record.run_id}: checkpoint 11 does not verify: {result.problems}")
    with sqlite3.connect(ws.index_path) as conn:
        check = conn.execute("PRAGMA integrity_check").fetchall()
        indexed = sorted(conn.execute("SELECT * FROM runs").fetchall())
    conn.close()
    if check != [("ok",)]:
        found.append(f"index integrity_check: {check}")
    fresh = Workspace(scenario.workspace)
    fresh.index_path = scenario.workspace / "fresh.sqlite"
    fresh.rebuild_index()
    with sqlite3.connect(fresh.index_path) as conn:
        rebuilt = sorted(conn.execute("SELECT * FROM runs").fetchall())
    conn.close()
    if indexed != rebuilt:
        found.append(f"index differs from a fresh rebuild:\n{indexed}\n!=\n{rebuilt}")
    return found


def test_eight_runs_with_gc_rebuild_ls_and_cost_beside_them(tmp_path: Path) -> None:
    scenario = run_concurrently(tmp_path, n_runs=8)
    assert not problems(scenario), "\n".join(problems(scenario))
    # Every side command ran, more than once, beside the runs.
    ran = {o.args for o in scenario.side}
    assert ran == set(SIDE_COMMANDS)
    # `ls` lists all eight, each with its verdict.
    listing = subprocess.run(
        _cli(scenario.workspace, "ls", "-n", "100"), capture_output=True, text=True, check=True
    ).stdout
    ws = Workspace(scenario.workspace)
    for run_id in ws.run_ids():
        verdict = RunRecord(ws.runs_dir / run_id).state["verdict"]
        line = next((ln for ln in listing.splitlines() if run_id in ln), "")
        assert verdict.upper() in line.upper(), (run_id, verdict, listing)
