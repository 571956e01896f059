"""Idle detection: a real run that stops working is stopped gracefully (checkpoint first) and
its record says it was idle; the detector's streaks, sources and actions."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.run.launch import launch
from acceptrun.telemetry.idle import Activity, IdleDetector, activity_of, describe

# A few real steps, then a wait for something that never comes, with almost no CPU; it
# still looks at stop_requested, as a loop waiting on a queue or a file would.
IDLE_LOOP = """
import time, torch, acceptrun
run = acceptrun.init()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, 100):
    loss = model(torch.ones(2, 4)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(step, loss=loss.item())
    if step >= 3:
        while not run.stop_requested:
            time.sleep(0.05)
"""


@pytest.mark.slow
def test_an_idle_run_is_stopped_gracefully_with_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(IDLE_LOOP))
    (tmp_path / "spec.toml").write_text(
        f'name = "idle"\ncommand = ["{sys.executable}", "train.py"]\n'
        '[limits]\nidle_window = "3s"\n[telemetry]\ninterval = "0.5s"\n'
    )
    result = launch(tmp_path / "spec.toml", workspace=tmp_path / "ws", echo=False)
    record = result.record
    assert result.exit_code == 1  # an idle-stopped run is not accepted
    exit_json = json.loads((record.attempt_dir(1) / "exit.json").read_text())
    assert exit_json["outcome"] == "idle" and exit_json["class"] == "idle"
    assert exit_json["returncode"] == 143  # the client's graceful stop, not a kill
    assert exit_json["reason"].startswith("stopped: idle for ")
    assert "process CPU" in exit_json["reason"] and "< 5%" in exit_json["reason"]
    assert exit_json["work"]["checkpoint_after"] == 3
    assert exit_json["work"]["steps_lost"] == 0
    events = list(record.events())
    kinds = [e["kind"] for e in events]
    assert "kill_sent" not in kinds
    idle = next(e for e in events if e["kind"] == "idle")
    assert idle["source"] == "process" and idle["threshold"] == 5.0
    assert idle["seconds"] >= 3 and idle["activity"] < 5 and idle["attempt"] == 1
    stop = next(e for e in events if e["kind"] == "idle_stop")
    assert stop["reason"] == exit_json["reason"].removeprefix("stopped: ")
    # idle -> idle_stop -> SIGTERM -> the client checkpoints step 3 -> stopped
    order = [
        k for k in kinds if k in ("idle", "idle_stop", "stop_sent", "checkpoint_commit", "stopped")
    ]
    assert order == ["idle", "idle_stop", "stop_sent", "checkpoint_commit", "stopped"]
    assert (record.checkpoints_dir / "step-3" / "MANIFEST.json").exists()
    verdict = json.loads(record.file("verdict.json").read_text())
    (check,) = [c for c in verdict["checks"] if c["name"] == "exit"]
    assert "stopped: idle for" in check["evidence"] and "idle" in check["fix"]
    assert record.state["status"] == "finished"
    # The cost ledger books the idle stretch as idle, not as lost or productive work.
    from acceptrun.cost.ledger import build_ledger

    ledger = build_ledger(record)
    detail = ledger["compute"]["detail_s"]
    assert detail["idle.idle_stop"] >= 3.0
    assert detail["wasted.lost_work"] == 0 and detail["wasted.failed_startup"] == 0


def test_detector_fires_once_per_streak_and_resets_when_active() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    d = IdleDetector(
        threshold=5.0, window=3.5, action="event", attempt=2,
        on_event=lambda kind, fields: events.append((kind, fields)),
    )  # fmt: skip
    d.observe(100.0, Activity(80.0, "process"))
    for t in (101.0, 102.0, 103.0):
        d.observe(t, Activity(1.0, "process"))
    assert events == []  # the streak began at t=100 (samples average the interval before)
    assert d.idle_seconds == 3.0 and d.since == 100.0
    d.observe(104.0, Activity(3.0, "process"))
    assert [k for k, _ in events] == ["idle"]
    assert events[0][1] == {
        "attempt": 2, "since": 100.0, "seconds": 4.0, "activity": 1.5, "threshold": 5.0,
        "source": "process",
    }  # fmt: skip
    d.observe(105.0, Activity(0.0, "process"))
    assert len(events) == 1  # once per streak
    assert d.stop_reason() is None  # action "event": record, never stop
    d.observe(106.0, Activity(50.0, "process"))
    assert d.idle_seconds == 0.0 and d.total_idle_s() == 5.0
    d.observe(107.0, None)  # nothing measurable: the streak is unchanged
    for t in (108.0, 109.0, 110.0, 111.0):
        d.observe(t, Activity(0.0, "process"))
    assert len(events) == 2  # a new streak fires again


def test_detector_with_stop_action_gives_the_reason() -> None:
    d = IdleDetector(threshold=5, window=120, action="stop", attempt=1, on_event=lambda k, f: None)
    for t in range(0, 200, 10):
        d.observe(float(t), Activity(0.3, "gpu"))
    assert d.stop_reason() == "idle for 2m00s (GPU util 0.3% < 5%)"
    assert describe({"seconds": 900, "activity": 0.25, "threshold": 10, "source": "process"}) == (
        "idle for 15m00s (process CPU 0.2% < 10%)"
    )


def test_window_none_tracks_idle_time_but_never_fires() -> None:
    fired: list[str] = []
    d = IdleDetector(
        threshold=5, window=None, action="stop", attempt=1, on_event=lambda k, f: fired.append(k)
    )
    for t in range(10):
        d.observe(float(t), Activity(0.0, "process"))
    assert fired == [] and d.stop_reason() is None and d.idle_seconds == 9.0


def test_activity_uses_the_workloads_gpus_then_the_process() -> None:
    host = {"proc_cpu_pct": 250.0}
    gpus = [
        {"index": 0, "util_pct": 90.0, "procs": {"11": 1 << 30}},
        {"index": 1, "util_pct": 10.0, "procs": {"12": 1 << 30}},
        {"index": 2, "util_pct": None, "procs": None},
    ]
    assert activity_of(host, gpus, {11}) == Activity(90.0, "gpu")
    assert activity_of(host, gpus, {11, 12}) == Activity(50.0, "gpu")
    assert activity_of(host, gpus, {99}) == Activity(50.0, "gpu")  # none of ours: all GPUs
    assert activity_of(host, [gpus[2]], {11}) == Activity(250.0, "process")
    assert activity_of(None, [], set()) is None
