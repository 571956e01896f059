"""Checkpoint-interval advice on real runs: the verdict's line, ``acceptrun plan`` and
``spec check``'s warnings (docs/checkpoint-interval.md).

A client workload checkpoints a small numpy state every few steps and is killed once
(an injected fault), so its record holds measured save stalls and a measured restart.
"""

from __future__ import annotations

import json
from typing import Any

from acceptrun.cost.interval import daly_interval
from acceptrun.run.launch import launch
from conftest import Project

WORKLOAD = """
import numpy as np
import acceptrun

run = acceptrun.init()
weights = np.random.default_rng(0).normal(size=(64, 64))
start = run.restore(weights=weights)
for step in run.steps(start, 40):
    weights = weights * 0.999
    run.log(step, loss=float(np.abs(weights).mean()))
    run.maybe_checkpoint(step)
"""


def _spec(project: Project, extra: str = "") -> Any:
    return project.spec(
        WORKLOAD,
        name="interval",
        extra=(
            '[checkpoint]\nevery_steps = 5\nmtbf = "2h"\n'
            "[limits]\nrestart_backoff = 0\nmax_restarts = 1\n" + extra
        ),
    )


def _check(record: Any) -> dict[str, Any]:
    verdict = json.loads(record.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "checkpoint interval"]
    return {"verdict": verdict, **row}


def test_the_verdict_says_the_interval_and_its_optimum_from_measured_costs(
    project: Project,
) -> None:
    spec = _spec(project)
    result = launch(spec, workspace=project.workspace, echo=False, inject=["kill@step=23"])
    record = result.record
    row = _check(record)
    assert row["verdict"]["accepted"], row["verdict"]
    assert row["status"] == "pass" and row["required"] is False  # information only
    ev = row["evidence"]
    assert "(measured: " in ev and "checkpoints over the step time)" in ev, ev
    assert "a save blocks" in ev and "the mean stall of" in ev, ev
    assert "a restart costs" in ev and "(measured over 1 restart(s))" in ev, ev
    assert "1 interruption(s); M = 2h00m (checkpoint.mtbf)" in ev, ev
    assert "optimum every" in ev and "(Daly 2006; Young 1974:" in ev, ev
    assert "ETTR" in ev and "measured" in ev and "predicted" in ev, ev

    # `acceptrun plan SPEC` takes the save and restart costs from that run.
    plan = project.cli("plan", str(spec), "--work", "10d", "--json", check_rc=0)
    out = json.loads(plan.stdout)
    inputs = out["inputs"]
    assert inputs["save"]["from"].startswith(f"run {record.run_id}: measured"), inputs
    assert inputs["restart"]["from"] == f"run {record.run_id}: measured over 1 restart(s)"
    assert inputs["mtbf"] == {"seconds": 7200.0, "from": f"{spec}: checkpoint.mtbf"}
    save = inputs["save"]["seconds"]
    assert out["interval_s"] == round(daly_interval(save, 7200.0), 3)
    assert out["current"]["interval_s"] > 0  # every_steps x the recorded step time
    for key in ("interval_s", "ettr", "expected_interruptions", "wall_s", "cost_usd"):
        assert key in out and key in out["current"]

    # spec check: every 5 steps of microseconds is far below the optimum for that save.
    check = project.cli("spec", "check", str(spec), check_rc=0)
    assert "warning: checkpoint interval: checkpoint.every_steps = 5" in check.stderr, check.stderr
    assert "x the optimum" in check.stderr and f"({record.run_id})" in check.stderr


def test_a_minimum_ettr_makes_the_line_a_requirement(project: Project) -> None:
    spec = _spec(project, "[acceptance]\nmin_ettr = 0.999\n")
    record = launch(spec, workspace=project.workspace, echo=False).record
    row = _check(record)
    # A short run is mostly start-up: its ETTR is far below 0.999, and the run is rejected.
    assert row["required"] is True and row["status"] == "fail", row
    assert "(at least 0.999)" in row["evidence"]
    assert not row["verdict"]["accepted"]


def test_plan_from_flags_and_what_it_needs(project: Project) -> None:
    out = json.loads(
        project.cli(
            "plan", "--mtbf", "24h", "--save", "5m", "--restart", "0s", "--work", "10d",
            "--interval", "30m", "--usd-per-hour", "100", "--simulate", "100", "--json",
            check_rc=0,
        ).stdout
    )  # fmt: skip
    assert out["young_interval_s"] == 7200.0  # √(2 x 300 s x 86,400 s)
    assert out["ettr"] > out["current"]["ettr"] > 0
    assert out["cost_usd"] < out["current"]["cost_usd"]
    assert abs(out["simulated"]["optimum"]["ettr"] - out["ettr"]) < 0.01
    text = project.cli("plan", "--gpus", "512", "--save", "40s", "--restart", "10m",
                       "--work", "14d", check_rc=0).stdout  # fmt: skip
    assert "The Llama 3 Herd of Models" in text and "per GPU / 512 GPUs" in text
    assert "(predicted: the model of docs/checkpoint-interval.md, not a measurement)" in text
    missing = project.cli("plan", "--save", "30s", check_rc=2)
    assert '--restart "5m"' in missing.stderr and '--mtbf "6h", or --gpus N' in missing.stderr
    bad = project.cli("plan", "--mtbf", "soon", "--save", "1s", "--restart", "1s",
                      "--work", "1h", check_rc=2)  # fmt: skip
    assert "argument --mtbf: 'soon' is not a duration" in bad.stderr


def test_spec_check_warns_a_long_run_without_an_interval(project: Project) -> None:
    spec = project.spec(WORKLOAD, extra='[limits]\nwall_time = "12h"\n')
    check = project.cli("spec", "check", str(spec), check_rc=0)
    assert "warning: checkpoint interval: a run of up to 12h00m sets none" in check.stderr
    assert "`acceptrun ckpt plan SPEC --save 30s` prints the optimum" in check.stderr


def test_m_comes_from_the_workspaces_history_of_the_spec(project: Project) -> None:
    # No checkpoint.mtbf: a run with three interruptions measures M itself, and the next
    # run of the same spec, interrupted less, takes M from that history.
    spec = project.spec(
        WORKLOAD, name="interval",
        extra="[checkpoint]\nevery_steps = 5\n[limits]\nrestart_backoff = 0\nmax_restarts = 3\n",
    )  # fmt: skip
    kills = ["kill@step=12:attempt=1", "kill@step=22:attempt=2", "kill@step=32:attempt=3"]
    first = launch(spec, workspace=project.workspace, echo=False, inject=kills).record
    assert "M = " in _check(first)["evidence"]
    assert "(measured: 3 interruptions in " in _check(first)["evidence"], _check(first)
    second = launch(spec, workspace=project.workspace, echo=False).record
    ev = _check(second)["evidence"]
    assert "(this workspace's history: 3 interruptions in " in ev, ev
    assert "over the newest 1 run(s) of 'interval')" in ev, ev
