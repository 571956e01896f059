"""summarize() and timelines() read the step log: the same run as JSON step events
(record format 1) and as step records (format 2) gives the same figures."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from acceptrun._util.durable import append_jsonl
from acceptrun.record.stepwriter import StepWriter
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.telemetry.summary import SUMMARY_FILE, load_summary, pending_summary, summarize
from acceptrun.telemetry.timelines import CHART_POINTS, timelines

T0 = 1_796_000_000.0


def run_events(seed: int = 7) -> list[dict[str, Any]]:
    """Three attempts; the second and third redo steps; data wait, spans, samples, loss."""
    rng = random.Random(seed)
    t = T0
    events: list[dict[str, Any]] = [{"t": t, "kind": "run_start"}]
    plan = [(1, range(0, 40), "signaled"), (2, range(30, 75), "signaled"), (3, range(70, 160), "success")]  # fmt: skip
    for n, steps, outcome in plan:
        t += 1.5
        if n > 1:
            events.append({"t": t, "kind": "restart", "attempt": n, "after": "signaled", "backoff_s": 1})  # fmt: skip
            t += 1.0
        events.append({"t": t, "kind": "attempt_start", "attempt": n})
        t += 2.0
        for step in steps:
            st = round(rng.uniform(0.05, 0.2) * (8 if step == 100 else 1), 6)
            t = round(t + st, 6)
            ev: dict[str, Any] = {"t": t, "kind": "step", "attempt": n, "step": step, "step_time": st}  # fmt: skip
            if step % 3:
                ev["data_wait"] = round(st * rng.uniform(0, 0.5), 6)
            if step % 7 == 0:
                ev["span"] = 2
            ev["samples"] = 32 if step < 120 else 16
            ev["loss"] = float(np.float32(2.0 / (1 + step)))
            events.append(ev)
            if step % 25 == 0:
                events.append({"t": t, "kind": "checkpoint_stage", "attempt": n, "step": step, "stall_s": 0.01})  # fmt: skip
                events.append({"t": t, "kind": "checkpoint_commit", "attempt": n, "step": step})  # fmt: skip
        t += 0.5
        events.append({"t": t, "kind": "attempt_exit", "attempt": n, "outcome": outcome})
    return events


def new_record(root: Path) -> RunRecord:
    return Workspace.create(root / ".acceptrun").create_run(
        "synth", spec_text='name = "synth"\ncommand = ["true"]\n',
        state={"mode": "supervised", "status": "finished"},
    )  # fmt: skip


def as_format_1(root: Path, events: list[dict[str, Any]]) -> Path:
    record = new_record(root)
    for ev in events:
        append_jsonl(record.events_path, ev)
    return record.path


def as_format_2(root: Path, events: list[dict[str, Any]]) -> Path:
    record = new_record(root)
    for ev in events:
        fields = {k: v for k, v in ev.items() if k != "kind"}
        record.event(ev["kind"], **fields)
    record.flush_events()
    assert not any(json.loads(line)["kind"] == "step" for line in record.events_path.open())
    assert list((record.path / "attempts").glob("*/steps/*.steps"))
    return record.path


def test_the_same_run_in_both_formats_gives_the_same_figures(tmp_path: Path) -> None:
    events = run_events()
    one, two = as_format_1(tmp_path / "a", events), as_format_2(tmp_path / "b", events)
    s1, s2 = summarize(one), summarize(two)
    assert s1.steps == s2.steps == 40 + 45 + 90
    assert s1.step_time == s2.step_time and s1.step_time is not None
    assert s1.breakdown == s2.breakdown
    assert s1.throughput == s2.throughput and list(s1.throughput) == ["samples/s", "steps/s"]
    assert s1.drift == s2.drift and s1.drift is not None
    assert s1.data_wait_share == s2.data_wait_share
    assert s1.first_step_s == s2.first_step_s and s1.wall_s == s2.wall_s
    assert s1.hints == s2.hints
    # 10 records of attempt 1 (30..39) and 5 of attempt 2 (70..74) ran again; 35 and 70
    # stand for 2 steps each (their span), as the verdict's lost steps count them
    assert any("2 restarts, 17 steps redone" in h for h in s1.hints), s1.hints
    # by hand: the steady step times, each attempt's first 3 timed steps left out
    steady = sorted(
        ev["step_time"]
        for n in (1, 2, 3)
        for ev in [e for e in events if e["kind"] == "step" and e["attempt"] == n][3:]
    )
    assert s1.step_time["n"] == len(steady)
    assert s1.step_time["p50"] == pytest.approx(float(np.percentile(steady, 50)), rel=1e-12)
    assert s1.step_time["p99"] == pytest.approx(float(np.percentile(steady, 99)), rel=1e-12)
    t1, t2 = timelines(one), timelines(two)
    assert t1["steps"][0] == t2["steps"][0] and t1["steps"][-1] == t2["steps"][-1]
    assert len(t1["steps"]) == len(t2["steps"]) == s1.steps  # a short run: every step
    assert t1["steps"][-1]["loss"] == pytest.approx(2.0 / 160)
    assert "steps_downsampled" not in t1
    assert t1["marks"] == t2["marks"]


def test_a_spike_among_100k_steps_stays_in_the_chart_series(tmp_path: Path) -> None:
    record = new_record(tmp_path)
    writer = StepWriter(record.path)
    rng = np.random.default_rng(3)
    n, spike = 100_000, 61_234
    times = np.round(rng.uniform(0.01, 0.012, n), 6)
    times[spike] = 2.5  # one stall
    loss = np.linspace(3.0, 1.0, n)
    loss[spike + 7] = 9.0  # one loss spike
    t = T0
    for i in range(n):
        t += float(times[i])
        writer.append(1, {"t": t, "step": i, "step_time": float(times[i]), "loss": float(loss[i])})
    writer.close()
    series = timelines(record.path)
    rows = series["steps"]
    assert series["steps_downsampled"]["of"] == n
    bucket = series["steps_downsampled"]["bucket"]
    assert bucket & (bucket - 1) == 0 and -(-n // bucket) * 2 <= CHART_POINTS
    assert len(rows) <= 3 * CHART_POINTS
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows)
    assert max(r["step_time"] for r in rows) == 2.5
    assert next(r for r in rows if r["step_time"] == 2.5)["step"] == spike
    assert max(r["loss"] for r in rows) == 9.0
    assert rows[0]["step"] == 0 and rows[-1]["step"] == n - 1
    assert timelines(record.path) == series  # deterministic
    s = summarize(record.path)
    assert s.steps == n and s.step_time is not None
    assert s.step_time["p50"] == float(np.median(times[3:]))


def test_the_stored_summary_is_read_while_current_and_computed_once_stale(tmp_path: Path) -> None:
    events = run_events()
    path = as_format_2(tmp_path, events)
    pending_summary(path).write()
    stored = load_summary(path)
    assert stored.stored and stored.summary == summarize(path)
    assert stored.timelines == json.loads(json.dumps(timelines(path)))
    assert stored.steps["steps"] == 175 and stored.steps["last_step"] == 159
    record = RunRecord(path)
    record.event("step", attempt=3, step=160, step_time=0.1, t=T0 + 10_000)
    record.flush_events()
    fresh = load_summary(path)
    assert not fresh.stored and fresh.summary.steps == 176
    pending_summary(path).write()
    record.update_state(status="running")  # a live run is computed, whatever is stored
    assert not load_summary(path).stored
    (path / SUMMARY_FILE).write_text("{not json")
    record.update_state(status="finished")
    assert not load_summary(path).stored and load_summary(path).summary.steps == 176


@pytest.mark.parametrize("odd", [False, True])
def test_whole_microseconds_and_float_seconds_give_the_same_figures(
    tmp_path: Path, odd: bool
) -> None:
    """The steady buffer holds whole microseconds in uint32 while every steady time is
    one; a time that is not (here a step of attempt 1, read last, in a JSON record: the
    step log holds microseconds) switches it to float64. Either way the figures are those
    of the float64 seconds, by hand."""
    events = run_events(seed=11)
    if odd:
        ev = next(e for e in events if e["kind"] == "step" and e["step"] == 20)
        ev["step_time"] += 1e-9  # not whole microseconds
    path = (as_format_1 if odd else as_format_2)(tmp_path, events)
    s = summarize(path)
    steady = np.array(
        [
            ev["step_time"]
            for n in (1, 2, 3)
            for ev in [e for e in events if e["kind"] == "step" and e["attempt"] == n][3:]
        ]
    )
    assert s.step_time is not None and s.step_time["n"] == steady.size
    for q in (50, 90, 99):
        assert s.step_time[f"p{q}"] == pytest.approx(float(np.percentile(steady, q)), rel=1e-15)
    assert s.step_time["mean"] == pytest.approx(math.fsum(steady) / steady.size, rel=1e-15)
    assert s.throughput["steps/s"] == pytest.approx(float(np.median(1 / steady)), rel=1e-12)
    # the median step time of show: every finite step time, warm-ups included
    every = [e["step_time"] for e in events if e["kind"] == "step"]
    median = load_summary(path).steps["median_step_time"]
    assert median == pytest.approx(float(np.median(every)), rel=1e-15)


def messy_events(seed: int) -> list[dict[str, Any]]:
    """Attempts that redo steps, a clock that steps back, a unit constant then varying, one
    constant from a later step on, spans, zero and negative step times."""
    rng = random.Random(seed)
    t = T0
    events: list[dict[str, Any]] = [{"t": t, "kind": "run_start"}]
    step = 0
    for n in (1, 2, 3):
        events.append({"t": t, "kind": "attempt_start", "attempt": n})
        step = max(0, step - rng.randrange(0, 30))
        for _ in range(rng.randrange(120, 400)):
            st = round(rng.choice([0.01, 0.02, 0.03]) * rng.uniform(0.5, 3), 6)
            if rng.random() < 0.02:
                st = rng.choice([0.0, -0.001])
            t = round(t + abs(st) + 0.001, 6)
            if seed % 2 and rng.random() < 0.01:
                t -= 5.0  # the clock stepped back
            ev: dict[str, Any] = {"t": t, "kind": "step", "attempt": n, "step": step, "step_time": st}  # fmt: skip
            ev["samples"] = 8 if step < 150 else rng.choice([4, 8, 16])
            if step > 60:
                ev["tokens"] = 512
            if rng.random() < 0.05:
                ev["span"] = 3
            ev["data_wait"] = round(abs(st) * rng.uniform(0, 0.3), 6)
            events.append(ev)
            step += 1
        events.append({"t": t, "kind": "attempt_exit", "attempt": n, "outcome": "signaled"})
    return events


@pytest.mark.parametrize("seed", range(6))
def test_the_histogram_of_microseconds_gives_the_figures_of_every_float(
    tmp_path: Path, seed: int
) -> None:
    """The steady step times as a histogram of whole microseconds (memory that does not
    grow with steps, and a second read for the drift and the rates) and as a float64
    array of every one give the same figures."""
    from acceptrun.telemetry.inputs import read_run
    from acceptrun.telemetry.summary import _summarize

    path = as_format_2(tmp_path, messy_events(seed))
    hist, hist_facts = _summarize(read_run(path))
    flat, flat_facts = _summarize(read_run(path), whole=False)
    assert hist.step_time is not None and flat.step_time is not None
    for k in ("p50", "p90", "p99", "n"):
        assert hist.step_time[k] == flat.step_time[k]
    assert hist.step_time["mean"] == pytest.approx(flat.step_time["mean"], rel=1e-15)
    assert hist.drift == flat.drift and hist.drift is not None
    assert hist.throughput == flat.throughput
    assert list(hist.throughput) == list(flat.throughput)
    assert hist_facts == flat_facts
    assert hist.breakdown == flat.breakdown


def test_a_histogram_merges_chunks_into_the_exact_multiset() -> None:
    from acceptrun.telemetry.order import Hist, HistOrder, median, quantile

    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 50, 1000), rng.integers(10**6, 10**9, 3000), rng.integers(-5, 5, 10)]
    h = Hist()
    for _ in range(200):  # enough chunks to merge more than once
        for p in parts:
            h.add(p.astype(np.int64))
    every = np.sort(np.concatenate([p for _ in range(200) for p in parts]))
    assert h.n == every.size and h.total() == int(every.sum())
    for r in (0, 1, every.size // 3, every.size // 2, every.size - 1):
        assert h.kth(r) == every[r]
    assert median(HistOrder(h)) == float(np.median(every / 1e6))
    assert quantile(HistOrder(h), 0.99) == pytest.approx(np.percentile(every / 1e6, 99), rel=1e-15)
    assert h.nbytes < every.nbytes  # distinct values, not steps


def _reference_curve(events: list[dict[str, Any]]) -> dict[int, float]:
    """The loss per step the way a JSON record's reader sees it: the last write wins."""
    curve: dict[int, float] = {}
    for ev in events:
        if ev["kind"] == "step" and "loss" in ev:
            curve[int(ev["step"])] = float(ev["loss"])
    return curve


def _reference_compare(a: dict[int, float], b: dict[int, float]) -> tuple[int, float, Any]:
    worst, at = 0.0, None
    for step in sorted(set(a) & set(b)):
        x, y = a[step], b[step]
        same = x == y or (math.isnan(x) and math.isnan(y))
        delta = 0.0 if same else abs(x - y)
        delta = math.inf if math.isnan(delta) else delta
        if delta > worst:
            worst, at = delta, step
    return len(set(a) & set(b)), worst, at


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_diff_reads_the_loss_curve_of_either_format_as_a_per_step_reference(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diff's loss curve (arrays from the step log) equals the per-step reference: the
    redone steps keep their last attempt's loss, a NaN on one side only differs by
    infinity, and the largest difference is found at the first step that has it, in
    blocks of any size (half the seeds compare 7 steps at a time)."""
    from acceptrun.verdict import diff
    from acceptrun.verdict.diff import diff_runs, loss_curve

    if seed % 2:
        monkeypatch.setattr(diff, "BLOCK", 7)

    rng = random.Random(seed)
    a_events, b_events = run_events(seed), run_events(seed)
    for ev in b_events:  # the second run: some losses moved, one NaN, a step missing
        if ev["kind"] == "step" and rng.random() < 0.1:
            ev["loss"] = float(np.float32(ev["loss"] + rng.choice([1e-3, -2e-3, 0.5])))
        if ev["kind"] == "step" and ev["step"] == 50 and ev["attempt"] == 2:
            ev["loss"] = math.nan
    b_events = [e for e in b_events if not (e["kind"] == "step" and e["step"] == 155)]
    ref_a, ref_b = _reference_curve(a_events), _reference_curve(b_events)
    want = _reference_compare(ref_a, ref_b)
    records = {}
    for fmt, write in (("1", as_format_1), ("2", as_format_2)):
        ra = RunRecord(write(tmp_path / f"a{fmt}", a_events))
        rb = RunRecord(write(tmp_path / f"b{fmt}", b_events))
        curve = loss_curve(rb)
        got = dict(zip(curve.steps.tolist(), curve.values.tolist(), strict=True))
        assert got.keys() == ref_b.keys() and list(curve.steps) == sorted(ref_b)
        assert all(got[s] == v or (math.isnan(got[s]) and math.isnan(v)) for s, v in ref_b.items())
        loss = diff_runs(ra, rb).loss
        assert loss is not None
        assert (loss["common_steps"], loss["max_abs_diff"], loss["at_step"]) == want
        assert (loss["only_a"], loss["only_b"]) == (1, 0)
        records[fmt] = loss
    assert records["1"] == records["2"]
    assert want[1] == math.inf and want[2] == 50  # the NaN on one side is the worst
