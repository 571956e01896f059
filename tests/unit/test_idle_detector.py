"""Idle detection's detector: streaks, sources and actions (a real idle run stopped
gracefully: tests/integration/test_idle.py)."""

from __future__ import annotations

from typing import Any

from acceptrun.telemetry.idle import Activity, IdleDetector, activity_of, describe


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
