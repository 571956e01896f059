"""record/liveness.py and workload/liveness.py over real lease files and this process."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from acceptrun.record.liveness import (
    STALE_AFTER_S,
    dead_periods,
    interruption,
    last_sign_of_life,
    shown_status,
    status_text,
    supervisor_state,
)
from acceptrun.workload.liveness import SupervisorCheck, supervisor_env

ME = os.getpid()
STARTED = psutil.Process(ME).create_time()


def run_with_lease(
    tmp_path: Path, status: str, lease: dict[str, Any] | None, events: tuple[float, ...] = ()
) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"status": status, "supervisor_pid": ME}))
    if lease is not None:
        (run / "supervisor.json").write_text(json.dumps(lease))
    with open(run / "events.jsonl", "w") as f:
        for t in events:
            f.write(json.dumps({"t": t, "kind": "step"}) + "\n")
    return run


def lease(**changes: Any) -> dict[str, Any]:
    body = {"pid": ME, "started": STARTED, "host": socket.gethostname(),
            "renewed_at": time.time(), "interval_s": 2.0, "ended_at": None}  # fmt: skip
    body.update(changes)
    return body


def test_a_closed_run_has_ended(tmp_path: Path) -> None:
    run = run_with_lease(tmp_path, "finished", lease(pid=1, started=0.0))
    assert supervisor_state(run).state == "ended"
    assert shown_status(run, "finished") == "finished"


def test_the_same_pid_and_start_time_here_is_alive(tmp_path: Path) -> None:
    run = run_with_lease(tmp_path, "running", lease(renewed_at=0.0))  # old renewal: the pid decides
    assert supervisor_state(run).state == "alive"
    assert interruption(run, "running") is None


def test_a_reused_pid_is_gone_and_the_last_event_is_the_last_sign(tmp_path: Path) -> None:
    run = run_with_lease(
        tmp_path, "running", lease(started=STARTED - 3600, renewed_at=100.0), (50.0, 200.0)
    )
    state = supervisor_state(run)
    assert state.state == "gone" and "another process" in state.detail
    assert state.last_sign_of_life == 200.0
    assert shown_status(run, "running") == "interrupted"


def test_the_lease_renewal_counts_as_a_sign_of_life(tmp_path: Path) -> None:
    run = run_with_lease(
        tmp_path, "preflight", lease(started=STARTED - 3600, renewed_at=300.0), (200.0,)
    )
    assert last_sign_of_life(run) == 300.0


@pytest.mark.parametrize(
    ("age", "expected"),
    [pytest.param(1.0, "alive", id="fresh"), pytest.param(STALE_AFTER_S + 5, "gone", id="lapsed")],
)
def test_another_hosts_lease_is_judged_by_its_age(
    tmp_path: Path, age: float, expected: str
) -> None:
    run = run_with_lease(tmp_path, "running", lease(host="elsewhere", renewed_at=time.time() - age))
    assert supervisor_state(run).state == expected


def test_a_lease_ended_without_a_close_is_gone(tmp_path: Path) -> None:
    run = run_with_lease(tmp_path, "closing", lease(ended_at=time.time()))
    assert supervisor_state(run).gone


def test_dead_periods_come_from_the_resume_audit() -> None:
    events = [
        {"t": 10.0, "kind": "run_start"},
        {"t": 90.0, "kind": "audit", "action": "resume", "interrupted": {"attempt": 1, "last_sign_of_life": 40.0}},
        {"t": 95.0, "kind": "audit", "action": "resume", "interrupted": None},
    ]  # fmt: skip
    assert dead_periods(events) == [
        {"attempt": 1, "last_sign_of_life": 40.0, "resumed_at": 90.0, "seconds": 50.0}
    ]


def test_the_workload_sees_its_supervisor_alive_or_gone() -> None:
    alive = SupervisorCheck.from_env(supervisor_env(ME, STARTED))
    assert alive is not None and not alive.gone()
    reused = SupervisorCheck(ME, STARTED - 3600)
    assert reused.gone() and reused.lost_at is not None
    assert SupervisorCheck.from_env({}) is None


def test_reports_say_interrupted_with_the_last_sign_of_life(tmp_path: Path) -> None:
    run = run_with_lease(tmp_path, "running", lease(started=STARTED - 3600, renewed_at=0.0), (1e9,))
    sup = supervisor_state(run).to_dict()
    assert sup["state"] == "gone" and sup["last_sign_of_life"] == 1e9
    text = status_text({"status": "running"}, sup)
    assert text.startswith("interrupted") and sup["last_seen"] in text
    assert status_text({"status": "running"}, {"state": "alive"}) == "running"


def test_a_standalone_runs_lease_names_its_process_not_a_supervisor(tmp_path: Path) -> None:
    run = run_with_lease(
        tmp_path, "running", lease(role="standalone", started=STARTED - 3600, renewed_at=0.0)
    )
    state = supervisor_state(run)
    assert state.gone and state.keeper == "standalone"
    assert state.detail.startswith(f"its process (pid {ME}) is gone")
    text = status_text({"status": "running"}, state.to_dict())
    assert text.startswith("interrupted (its process is gone;")
    (tmp_path / "alive").mkdir()
    alive = run_with_lease(tmp_path / "alive", "running", lease(role="standalone"))
    assert supervisor_state(alive).state == "alive"


def test_the_lease_writer_records_its_role_and_ends(tmp_path: Path) -> None:
    from acceptrun.record.lease import end_lease, start_lease
    from acceptrun.record.workspace import RunRecord

    path = run_with_lease(tmp_path, "running", None)
    record = RunRecord(path)
    start_lease(record, role="standalone")
    try:
        body = json.loads((path / "supervisor.json").read_text())
        assert (body["pid"], body["role"], body["ended_at"]) == (ME, "standalone", None)
        assert supervisor_state(path).state == "alive"
    finally:
        end_lease(record)
    assert json.loads((path / "supervisor.json").read_text())["ended_at"] is not None


def old_standalone(tmp_path: Path, start: dict[str, Any] | None, host: str | None = None) -> Path:
    """A standalone run recorded before such runs held a lease: run.json and events only."""
    run = tmp_path / "run"
    run.mkdir()
    who = f"me@{host or socket.gethostname()}"
    state = {"status": "running", "mode": "standalone", "created_by": who}
    (run / "run.json").write_text(json.dumps(state))
    lines = [] if start is None else [json.dumps({"kind": "workload_start", **start})]
    (run / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


@pytest.mark.parametrize(
    ("start", "host", "expected", "says"),
    [
        pytest.param({"pid": ME, "t": time.time()}, None, "alive", "process pid", id="running"),
        pytest.param(
            {"pid": ME, "t": STARTED - 3600}, None, "gone", "is now another process", id="reused"
        ),
        pytest.param({"pid": ME, "t": 1.0}, "elsewhere", "alive", "host elsewhere", id="remote"),
        pytest.param(None, None, "alive", "no pid recorded yet", id="not-started"),
    ],
)
def test_an_old_standalone_run_is_judged_by_its_workload_start_pid(
    tmp_path: Path, start: dict[str, Any] | None, host: str | None, expected: str, says: str
) -> None:
    state = supervisor_state(old_standalone(tmp_path, start, host))
    assert state.state == expected and says in state.detail
    if expected == "gone":
        assert state.keeper == "standalone" and state.detail.startswith("its process")
