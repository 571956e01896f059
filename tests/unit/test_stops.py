"""Each stop cause of supervisor/stops.py on its own: no process, no supervisor, no sleep.

The causes read real collaborators (an AttemptWatch over an events file, an IdleDetector
fed activity samples, injected faults parsed from their text); the supervisor's actions
(its budget arithmetic, the signal a fault sends) come in as the callables it passes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun.supervisor import stops
from acceptrun.supervisor.stops import PollState, Stop
from acceptrun.supervisor.watch import AttemptWatch
from acceptrun.telemetry.idle import Activity, IdleDetector
from acceptrun.workload import inject


def poll(elapsed: float = 0.0) -> PollState:
    return PollState(attempt=1, elapsed=elapsed)


def test_user_stop_waits_for_a_request_then_stops_gracefully() -> None:
    requested: list[str] = []
    cause = stops.UserStop(lambda: requested[-1] if requested else None)
    assert cause.check(0.0, poll()) is None
    requested.append("signal SIGINT to the supervisor")
    stop = cause.check(0.0, poll())
    assert stop == Stop("user", "stopped", "stopped on request (signal SIGINT to the supervisor)")
    assert stop.graceful and stop.reason is None  # the request's own reason stays
    assert (cause.name, cause.outcome, cause.graceful) == ("user", "stopped", True)


def test_wall_time_stops_at_the_deadline_not_before() -> None:
    cause = stops.WallTime(deadline=1000.0, wall_time=90.0)
    assert cause.check(999.99, poll()) is None
    stop = cause.check(1000.0, poll())
    assert stop is not None
    assert (stop.cause, stop.outcome, stop.graceful) == ("wall_time", "wall_time", True)
    assert stop.reason == "wall time 1m30s reached"
    assert stop.summary == "stopped at the wall-time limit (1m30s)"


def test_wall_time_without_a_limit_never_stops() -> None:
    assert stops.WallTime(deadline=None, wall_time=None).check(1e12, poll()) is None


def test_budget_stops_with_the_reason_the_supervisor_computed() -> None:
    # The supervisor's rule: stop once the bill at the end of the grace period would pass
    # the budget. Here: 1 USD/h, 10 USD budget, 60 s grace.
    def exhausted(attempt: int, *, now_s: float) -> str | None:
        ahead = (now_s + 60.0) / 3600.0
        return None if ahead <= 10.0 else f"budget 10 USD would be passed (attempt {attempt})"

    clock = {"s": 35_000.0}
    cause = stops.Budget(lambda attempt: exhausted(attempt, now_s=clock["s"]))
    assert cause.check(0.0, poll()) is None
    clock["s"] = 35_941.0
    stop = cause.check(0.0, PollState(attempt=2, elapsed=0.0))
    assert stop is not None and (stop.cause, stop.outcome) == ("budget", "budget")
    assert stop.summary == (
        "stopped before the budget ran out (budget 10 USD would be passed (attempt 2))"
    )


def test_idle_stops_once_the_detector_fires_and_records_its_streak() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    detector = IdleDetector(
        threshold=5, window=120, action="stop", attempt=1,
        on_event=lambda kind, fields: events.append((kind, fields)),
    )  # fmt: skip
    cause = stops.Idle(detector)
    detector.observe(1000.0, Activity(0.3, "process"))
    detector.observe(1060.0, Activity(0.2, "process"))
    assert cause.check(0.0, poll()) is None  # 60 s of a 120 s window
    detector.observe(1120.0, Activity(0.4, "process"))
    stop = cause.check(0.0, poll())
    assert stop is not None and (stop.cause, stop.outcome, stop.graceful) == ("idle", "idle", True)
    assert stop.reason is not None and stop.reason.startswith("idle for 2m")
    assert stop.summary == f"stopped: {stop.reason}"
    assert stop.detail["since"] == 1000.0  # the ledger counts the streak as idle time
    assert stop.event == ("idle_stop", {**events[0][1], "reason": stop.reason})


def test_idle_with_action_event_never_stops() -> None:
    detector = IdleDetector(
        threshold=5, window=10, action="event", attempt=1, on_event=lambda k, f: None
    )
    detector.observe(0.0, Activity(0.0, "gpu"))
    detector.observe(20.0, Activity(0.0, "gpu"))
    assert detector.fired is not None
    assert stops.Idle(detector).check(0.0, poll()) is None


def test_serving_done_stops_with_what_the_load_served() -> None:
    finished = threading.Event()
    cause = stops.ServingDone(finished, lambda: "served 1,200 requests (1,200 successful)")
    assert cause.check(0.0, poll()) is None
    finished.set()
    stop = cause.check(0.0, poll())
    assert stop is not None and (stop.cause, stop.outcome) == ("serving", "serving")
    assert stop.reason == "served 1,200 requests (1,200 successful)"
    assert stop.summary == "stopped after the load (served 1,200 requests (1,200 successful))"


def test_timed_faults_fire_when_due_and_never_stop_the_attempt() -> None:
    faults = inject.time_faults(inject.parse_faults("term@time=2s,kill@time=5s"), 1)
    fired: list[str] = []
    cause = stops.TimedFaults(faults, lambda f: fired.append(f.action))
    state = poll(elapsed=1.9)
    assert cause.check(0.0, state) is None and fired == []
    state.elapsed = 2.0
    assert cause.check(0.0, state) is None
    assert fired == ["term"] and state.injected == "term@time=2s"
    state.elapsed = 60.0
    assert cause.check(0.0, state) is None
    assert fired == ["term", "kill"] and state.injected == "kill@time=5s"
    assert cause.check(0.0, state) is None and fired == ["term", "kill"]  # each fires once
    assert cause.after_stop and cause.outcome is None


def _client_watch(tmp_path: Path, *events: dict[str, Any], quiet_s: float) -> AttemptWatch:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"attempt": 1, **e}) + "\n" for e in events))
    watch = AttemptWatch(path, 1, (), os.getpid())
    watch.poll()
    watch._progress_t = time.monotonic() - quiet_s  # the last progress, quiet_s ago
    return watch


@pytest.mark.parametrize(
    ("phase", "kind"),
    [pytest.param("step", "hang", id="hang"), pytest.param("data_wait", "data_stall", id="stall")],
)
def test_hang_kills_without_grace_with_the_watch_evidence(
    tmp_path: Path, phase: str, kind: str
) -> None:
    watch = _client_watch(
        tmp_path,
        {"kind": "workload_start"},
        {"kind": "step", "step": 7},
        {"kind": "heartbeat", "phase": phase, "phase_s": 95.0},
        quiet_s=100.0,
    )
    assert stops.Hang(watch, window=300.0, grace=30.0).check(0.0, poll()) is None
    stop = stops.Hang(watch, window=60.0, grace=30.0).check(0.0, poll())
    assert stop is not None and (stop.cause, stop.outcome, stop.graceful) == (kind, kind, False)
    assert stop.summary == f"killed after no progress for 1m00s ({kind.replace('_', ' ')})"
    assert stop.evidence is not None and stop.evidence.endswith("last step 7")


def test_hang_clock_stops_at_workload_end_and_the_exit_gets_the_grace_period(
    tmp_path: Path,
) -> None:
    watch = _client_watch(
        tmp_path,
        {"kind": "workload_start"},
        {"kind": "step", "step": 19},
        {"kind": "workload_end", "status": "ok"},
        quiet_s=100.0,  # the last step long ago: torch's exit on a busy machine
    )
    assert watch.stalled(60.0) is None
    assert watch.ended_t is not None and watch.end_status == "ok"
    cause = stops.Hang(watch, window=60.0, grace=30.0)
    assert cause.check(watch.ended_t + 29.0, poll()) is None
    stop = cause.check(watch.ended_t + 31.0, poll())
    assert stop is not None and (stop.cause, stop.outcome, stop.graceful) == ("hang", "hang", False)
    assert (
        stop.summary
        == "killed: its process did not exit within 30s after the workload ended (hang)"
    )
    assert stop.evidence == (
        "the workload ended (workload_end, status ok) 31s ago;"
        " its process did not exit within limits.grace_period (30s)"
    )


def test_another_ranks_workload_end_leaves_the_hang_clock_running(tmp_path: Path) -> None:
    watch = _client_watch(
        tmp_path,
        {"kind": "workload_start"},
        {"kind": "step", "step": 7},
        {"kind": "workload_end", "status": "error: RuntimeError: boom", "rank": 1},
        quiet_s=100.0,
    )
    assert watch.ended_t is None
    stall = watch.stalled(60.0)
    assert stall is not None and stall.kind == "hang"


def test_causes_satisfy_the_protocol() -> None:
    causes: list[stops.StopCause] = [
        stops.UserStop(lambda: None),
        stops.Budget(lambda attempt: None),
        stops.WallTime(None, None),
        stops.ServingDone(threading.Event(), lambda: ""),
        stops.TimedFaults([], lambda f: None),
    ]
    names = [c.name for c in causes]
    assert len(set(names)) == len(names)
    assert all(c.check(0.0, poll()) is None for c in causes)
