"""The warm restart's parts that need no process: the backoff by failure class, why a run
keeps no standby, and a restart's mode read back from a record written as files.

The standby itself (a real process taking over a killed attempt) is
tests/integration/test_warm_restart.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acceptrun.record.recovery import restarts
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.spec.model import CheckpointSpec, LimitsSpec, ResourcesSpec, RunSpec
from acceptrun.supervisor.classify import Classification
from acceptrun.supervisor.outcome import AttemptResult
from acceptrun.supervisor.restarts import NO_BACKOFF, RestartPolicy
from acceptrun.supervisor.standby import StandbyKeeper


def _spec(**limits: object) -> RunSpec:
    return RunSpec(name="w", command=["python", "x.py"], limits=LimitsSpec(**limits))  # type: ignore[arg-type]


def _record(tmp_path: Path) -> RunRecord:
    return Workspace.create(tmp_path / "ws").create_run("w", spec_text="", state={})


def _failed(name: str) -> AttemptResult:
    res = AttemptResult(1, "signaled", None, "SIGKILL", "", "", 1.0, "ended")
    res.failure = Classification(name, [], True, "why")
    return res


@pytest.mark.parametrize("name", sorted(NO_BACKOFF))
def test_nothing_to_wait_for_restarts_at_once(tmp_path: Path, name: str) -> None:
    policy = RestartPolicy(_record(tmp_path), _spec(restart_backoff=5), lambda n: None)  # type: ignore[arg-type,return-value]
    assert policy.backoff(_failed(name), 2, 300.0) == 0.0


@pytest.mark.parametrize(
    "name", ["killed", "distributed", "node_lost", "gpu_fault", "host_oom", "failed"]
)
def test_a_failure_that_may_pass_waits_the_doubled_backoff(tmp_path: Path, name: str) -> None:
    policy = RestartPolicy(_record(tmp_path), _spec(restart_backoff=5), lambda n: None)  # type: ignore[arg-type,return-value]
    assert [policy.backoff(_failed(name), n, 300.0) for n in (0, 1, 2)] == [5.0, 10.0, 20.0]
    assert policy.backoff(_failed(name), 10, 300.0) == 300.0  # capped


@pytest.mark.parametrize(
    ("spec", "client", "expected"),
    [
        pytest.param(_spec(), True, "limits.warm_restart = false", id="off"),
        pytest.param(_spec(warm_restart=True), False, "a black box", id="black-box"),
        pytest.param(
            RunSpec(
                name="w",
                command=["python", "x.py"],
                limits=LimitsSpec(warm_restart=True),
                resources=ResourcesSpec(processes=2),
            ),
            True,
            "resources.processes > 1",
            id="torchrun",
        ),
        pytest.param(
            RunSpec(
                name="w",
                command=["python", "x.py"],
                limits=LimitsSpec(warm_restart=True),
                checkpoint=CheckpointSpec(watch=["out/*.pt"]),
            ),
            True,
            "checkpoint.watch",
            id="watched-files",
        ),
        pytest.param(_spec(warm_restart=True), True, None, id="on"),
    ],
)
def test_which_runs_keep_a_standby(
    tmp_path: Path, spec: RunSpec, client: bool, expected: str | None
) -> None:
    keeper = StandbyKeeper(
        _record(tmp_path), spec, client=client, launch=lambda n: ([], {}), echo=False
    )
    if expected is None:
        assert keeper.never is None
    else:
        assert keeper.never is not None and keeper.never.startswith(expected)
        assert keeper.take(2) is None and keeper.why_cold == keeper.never


def test_a_restart_names_its_mode_and_why_it_was_cold(tmp_path: Path) -> None:
    record = _record(tmp_path)
    lines = [
        {"t": 100.0, "kind": "attempt_start", "attempt": 1, "pid": 1, "start_mode": "cold"},
        {"t": 110.0, "kind": "fault_injected", "attempt": 1, "action": "kill", "step": 9},
        {"t": 110.1, "kind": "attempt_exit", "attempt": 1, "started_at": "x"},
        {
            "t": 110.2,
            "kind": "attempt_start",
            "attempt": 2,
            "pid": 2,
            "start_mode": "warm",
            "standby_ready_s": 1.5,
        },
        {"t": 120.0, "kind": "attempt_exit", "attempt": 2, "started_at": "x"},
        {
            "t": 121.0,
            "kind": "attempt_start",
            "attempt": 3,
            "pid": 3,
            "start_mode": "cold",
            "cold_why": "attempt 2 ended before its first step",
        },
        {"t": 130.0, "kind": "attempt_start_old", "attempt": 4},
    ]
    with open(record.events_path, "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in lines)
    first, second = restarts(record)
    assert (first.mode, first.cold_why) == ("warm", None)
    assert (second.mode, second.cold_why) == ("cold", "attempt 2 ended before its first step")
