"""The verdict over the five acceptance tests, on real runs built to fail each one.

Four small runs (plain Python workloads, no torch) are launched at once as real
``acceptrun run`` processes; each test then reads one run's verdict.json and checks
that the right check failed with the right sentence, and that the others did not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.capture.data import snapshot, write_manifest
from acceptrun.verdict.core import GROUPS

PYTHON = sys.executable

WORK = """
import os, sys, time
import acceptrun

run = acceptrun.init()
crash = os.environ.get("CRASH_AT")
for step in run.steps(0, 15):
    with run.data_wait():
        time.sleep(float(os.environ.get("DATA_SLEEP", "0")))
    time.sleep(0.005)
    run.log(step, loss=1.0 / (step + 1), samples=4)
    if crash is not None and step == int(crash):
        raise ValueError("bad batch at step %d" % step)
run.metric("final/loss", 1.0 / 15)
"""


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd, check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def _project(root: Path, name: str, extra: str, env: dict[str, str] | None = None) -> Path:
    proj = root / name
    proj.mkdir()
    (proj / "work.py").write_text(textwrap.dedent(WORK))
    env_line = ""
    if env:
        env_line = "env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }\n"
    spec = f'name = "{name}"\ncommand = ["{PYTHON}", "work.py"]\n{env_line}{textwrap.dedent(extra)}'
    (proj / "spec.toml").write_text(spec)
    return proj


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """name -> {"rc", "verdict": {check name: check}, "out"}; the four runs run at once."""
    root = tmp_path_factory.mktemp("five")
    projects = {
        # setup and performance: first step, throughput and data wait all out of range
        "perf": _project(
            root, "perf",
            """
            [acceptance]
            throughput = [1e9, 2e9]
            throughput_unit = "samples/s"
            max_data_wait = 0.2
            max_first_step = 0.001
            """,
            env={"DATA_SLEEP": "0.22"},  # 15 steps of 0.23 s: enough step time to judge
        ),
        # data: the data changed after its manifest was written
        "data": _project(root, "data", '[data]\npath = "data"\nmanifest = "data.manifest.json"\n'),
        # operations: a crash with no restart allowed, a required drill, a failing clean-up
        "ops": _project(
            root, "ops",
            """
            [limits]
            max_restarts = 0
            [cleanup]
            commands = ["echo cleaning; exit 7"]
            [acceptance]
            drills = ["kill"]
            """,
            env={"CRASH_AT": "2"},
        ),
        # exit: the command's own script is not committed (untracked, so not in git.diff)
        "exit": _project(root, "exit", ""),
    }  # fmt: skip
    data_dir = projects["data"] / "data"
    data_dir.mkdir()
    (data_dir / "train.txt").write_text("the data as it was snapshotted\n")
    write_manifest(projects["data"] / "data.manifest.json", snapshot(data_dir))
    (data_dir / "train.txt").write_text("the data, edited after the snapshot\n")
    exit_proj = projects["exit"]
    _git(exit_proj, "init", "-q")
    _git(exit_proj, "add", "spec.toml")
    _git(exit_proj, "commit", "-qm", "spec only")

    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    procs = {
        name: subprocess.Popen(
            [
                PYTHON,
                "-m",
                "acceptrun",
                "--workspace",
                str(proj / ".acceptrun"),
                "run",
                "-q",
                "spec.toml",
            ],
            cwd=proj,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, proj in projects.items()
    }
    found: dict[str, dict[str, Any]] = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=240)
        (run_dir,) = (projects[name] / ".acceptrun" / "runs").iterdir()
        verdict = json.loads((run_dir / "verdict.json").read_text())
        found[name] = {
            "rc": proc.returncode,
            "out": out,
            "verdict": verdict,
            "checks": {c["name"]: c for c in verdict["checks"]},
            "dir": run_dir,
        }
    return found


def _failed(run: dict[str, Any]) -> set[str]:
    return set(run["verdict"]["failed"])


@pytest.mark.slow
def test_setup_and_performance_failures_name_their_fix(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["perf"]
    assert run["rc"] == 1, run["out"]
    checks = run["checks"]
    assert _failed(run) == {"first step", "throughput", "data wait"}, run["out"]
    first = checks["first step"]
    assert first["group"] == "setup" and first["required"]
    assert "after launch, at most 0.0s" in first["evidence"]
    assert "raise acceptance.max_first_step" in first["fix"]
    thr = checks["throughput"]
    assert thr["group"] == "performance"
    assert "samples/s, expected 1e+09 to 2e+09" in thr["evidence"]
    assert thr["fix"].startswith("find the bottleneck in the report's time breakdown")
    wait = checks["data wait"]
    share = float(wait["evidence"].split("%")[0])
    assert share > 80, wait  # 220 ms of data wait in each ~230 ms step
    assert wait["evidence"].endswith("at most 20%")
    assert wait["fix"].startswith("the loop waits for data: more DataLoader workers")
    # The terminal verdict carries the fix under each failing check.
    assert "fix: find the bottleneck" in run["out"]


@pytest.mark.slow
def test_data_changed_after_its_manifest_is_rejected(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["data"]
    assert run["rc"] == 2, run["out"]  # preflight stopped it: no attempt ran
    check = run["checks"]["data verified"]
    assert (check["status"], check["group"], check["required"]) == ("fail", "data", True)
    assert "does not match its manifest: 1 changed;   changed: train.txt" in check["evidence"]
    assert check["fix"].startswith("restore the data, or refresh the manifest")
    assert "data verified" in _failed(run)


@pytest.mark.slow
def test_crash_without_restarts_and_failed_cleanup_are_operations_failures(
    runs: dict[str, dict[str, Any]],
) -> None:
    run = runs["ops"]
    assert run["rc"] == 1, run["out"]
    checks = run["checks"]
    assert _failed(run) == {"exit", "drill kill", "cleanup"}, run["out"]
    exit_check = checks["exit"]
    assert exit_check["group"] == "operations"
    assert "attempt 1" in exit_check["evidence"]
    assert exit_check["fix"] == "read attempts/1/stderr.log"
    assert checks["restarts"]["status"] == "pass"
    assert checks["restarts"]["evidence"] == "0 of at most 0"
    assert checks["drill kill"]["fix"].startswith("run `acceptrun drill SPEC` once for this spec")
    cleanup = checks["cleanup"]
    assert (
        cleanup["status"] == "fail"
        and "1 of 1 failed: echo cleaning; exit 7" in cleanup["evidence"]
    )
    assert cleanup["fix"].startswith("fix the failing clean-up step")
    stderr = (run["dir"] / "attempts" / "1" / "stderr.log").read_text()
    assert "ValueError: bad batch at step 2" in stderr


@pytest.mark.slow
def test_untracked_script_blocks_the_exit_test(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["exit"]
    assert run["rc"] == 1, run["out"]
    assert _failed(run) == {"portability"}, run["out"]
    check = run["checks"]["portability"]
    assert check["group"] == "exit"
    assert "work.py is untracked: it is neither in commit" in check["evidence"]
    assert check["fix"] == "commit it (`git add work.py && git commit`) and run again"
    # Everything else about the run passed: the five tests in order, results last.
    groups = [c["group"] for c in run["verdict"]["checks"]]
    order = list(GROUPS)
    assert groups == sorted(groups, key=order.index)
    assert {"setup", "performance", "operations", "exit"} <= set(groups)
    wait = run["checks"]["data wait"]  # 15 short steps: too little step time to judge
    assert wait["required"] is False and "s of steps: too little to judge)" in wait["evidence"]
    telemetry = run["checks"]["telemetry"]
    assert telemetry["required"] is False  # a CPU run: information only
    assert telemetry["status"] in ("pass", "not_recorded")


@pytest.mark.slow
def test_portability_cli_on_the_run_exits_1_on_a_blocker(runs: dict[str, dict[str, Any]]) -> None:
    run_dir: Path = runs["exit"]["dir"]
    proc = subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(run_dir.parent.parent), "portability", "--json", run_dir.name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["blockers"] == 1
    (blocker,) = [f for f in report["findings"] if f["severity"] == "blocker"]
    assert (blocker["kind"], blocker["where"], blocker["value"]) == ("code", "command", "work.py")
