"""The step log (record/steplog.py): every codec round-trips, tears and damage read as such.

Steps are written the one way the run writes them, ``RunRecord.event("step", ...)``, and
read back through :class:`StepLog`; a record of format 1 (steps as JSON lines of
events.jsonl, written by the same :class:`AppendLog` the old writer used) reads through
the same API with the same arrays. The generative test compares both for random steps.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acceptrun._util.durable import AppendLog
from acceptrun.record.steplog import (
    MAGIC,
    MAX_HEADER,
    MISSING_F4,
    MISSING_F8,
    StepLog,
    StepTail,
    repair_torn,
)
from acceptrun.record.stepwriter import StepWriter
from acceptrun.record.workspace import RunRecord

T0 = 1_796_000_000.0


def _record(root: Path, name: str = "r") -> RunRecord:
    record = RunRecord(root / "runs" / name)
    record.path.mkdir(parents=True)
    return record


def _write(record: RunRecord, steps: list[dict[str, Any]]) -> None:
    for i, fields in enumerate(steps):
        fields = {"t": T0 + i, "attempt": 1, "step": i, **fields}
        record.event("step", defer=True, **fields)
    record.flush_events()


def _rows(log: StepLog) -> list[dict[str, Any]]:
    """Every step as (attempt, step, t, {logged value}, constants), from the chunks' arrays."""
    out = []
    for c in log.chunks():
        for i in range(len(c)):
            values = {n: float(c.values[n][i]) for n in c.values if c.present[n][i]}
            out.append({"attempt": c.attempt, "step": int(c.step[i]), "t": float(c.t[i]),
                        "values": values, "constants": dict(c.constants)})  # fmt: skip
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _codecs(log: StepLog) -> list[dict[str, str]]:
    return [dict(s.columns) for s in log.segments]


# ---- codecs -------------------------------------------------------------------------------------


def test_float32_values_stay_float32_and_read_back_exactly(tmp_path: Path) -> None:
    record = _record(tmp_path)
    losses = [float(np.float32(1 / (i + 1))) for i in range(50)]
    _write(record, [{"loss": v, "samples": 8, "step_time": 0.012345} for v in losses])
    log = StepLog(record.path)
    assert _codecs(log) == [{"step": "i8", "t": "f8", "loss": "f4", "samples": "f4",
                             "step_time": "us4"}]  # fmt: skip
    assert log.segments[0].width == 8 + 8 + 4 + 4 + 4
    (chunk,) = log.chunks()
    assert chunk.values["loss"].dtype == np.float64
    assert chunk.values["loss"].tolist() == losses
    assert chunk.values["samples"].tolist() == [8.0] * 50
    assert chunk.values["step_time"].tolist() == [0.012345] * 50  # microseconds, exactly
    assert chunk.step.tolist() == list(range(50))
    assert chunk.t.tolist() == [T0 + i for i in range(50)]
    assert log.count() == 50 and log.torn == [] and log.problems == []


def test_a_value_float32_cannot_hold_widens_to_float64_in_a_new_segment(tmp_path: Path) -> None:
    record = _record(tmp_path)
    _write(record, [{"loss": 0.5}, {"loss": 0.25}, {"loss": 0.1}, {"loss": 0.75}])
    log = StepLog(record.path)
    assert [c["loss"] for c in _codecs(log)] == ["f4", "f8"]
    assert [s.count for s in log.segments] == [2, 2]
    assert [r["values"]["loss"] for r in _rows(log)] == [0.5, 0.25, 0.1, 0.75]


def test_a_step_time_past_4294_s_widens_microseconds_to_float64(tmp_path: Path) -> None:
    record = _record(tmp_path)
    _write(record, [{"step_time": 0.25}, {"step_time": 5000.000001}, {"step_time": 0.5}])
    log = StepLog(record.path)
    assert [c["step_time"] for c in _codecs(log)] == ["us4", "f8"]
    assert [r["values"]["step_time"] for r in _rows(log)] == [0.25, 5000.000001, 0.5]


def test_a_missing_value_is_not_a_logged_nan(tmp_path: Path) -> None:
    record = _record(tmp_path)
    nan = float("nan")
    _write(record, [
        {"loss": 1.0, "step_time": 0.1, "lr": 0.1},
        {"samples": 8},  # nothing else logged at this step
        {"loss": nan, "step_time": 0.1, "lr": nan},
        {"loss": float("inf"), "lr": float("-inf"), "step_time": 0.2},
    ])  # fmt: skip
    log = StepLog(record.path)
    rows = _rows(log)
    present = {n: [n in r["values"] for r in rows] for n in ("loss", "lr", "step_time", "samples")}
    assert present["loss"] == [True, False, True, True]
    assert present["lr"] == [True, False, True, True]
    assert present["step_time"] == [True, False, True, True]
    assert present["samples"] == [False, True, False, False]
    assert "loss" not in rows[1]["values"] and math.isnan(rows[2]["values"]["loss"])
    assert rows[3]["values"]["loss"] == math.inf and rows[3]["values"]["lr"] == -math.inf
    # As events (the compat path): an absent key, and a non-finite value as the float
    # json.loads reads from an event's NaN or Infinity.
    events = log.events()
    assert "loss" not in events[1] and math.isnan(events[2]["loss"])
    assert events[3]["lr"] == -math.inf
    assert math.isnan(MISSING_F4) and math.isnan(MISSING_F8)  # read as absent, never as a value


def test_changed_constants_start_a_new_segment(tmp_path: Path) -> None:
    record = _record(tmp_path)
    _write(record, [
        {"loss": 1.0, "total_steps": 10},
        {"loss": 1.0, "total_steps": 10},
        {"loss": 1.0, "total_steps": 20},
        {"loss": 1.0, "total_steps": 20, "source": "trainer"},
    ])  # fmt: skip
    log = StepLog(record.path)
    assert [s.constants for s in log.segments] == [
        {"total_steps": 10}, {"total_steps": 20}, {"total_steps": 20, "source": "trainer"},
    ]  # fmt: skip
    assert [r["constants"] for r in _rows(log)] == [
        {"total_steps": 10}, {"total_steps": 10}, {"total_steps": 20},
        {"total_steps": 20, "source": "trainer"},
    ]  # fmt: skip
    assert [e["total_steps"] for e in log.events()] == [10, 10, 20, 20]


@pytest.mark.parametrize("step", [1.5, True, "3", None, 2**63])
def test_a_step_that_is_not_an_integer_is_refused_and_kept_as_json(
    tmp_path: Path, step: Any
) -> None:
    record = _record(tmp_path)
    writer = StepWriter(record.path)
    assert writer.append(1, {"t": T0, "kind": "step", "step": step, "loss": 1.0}) is False
    assert writer.records == 0
    record.event("step", attempt=1, step=step, loss=1.0)
    record.flush_events()
    assert StepLog(record.path).segments == []
    (line,) = record.events_path.read_text().splitlines()
    assert json.loads(line)["step"] == step  # in events.jsonl, as before the step log


def test_numpy_scalars_are_written_as_the_numbers_they_hold(tmp_path: Path) -> None:
    record = _record(tmp_path)
    _write(record, [
        {"loss": np.float32(0.5), "tokens": np.int64(7), "lr": np.float64(0.1)},
        {"loss": np.float32(0.25), "tokens": np.int64(9), "lr": np.array(0.1)},
    ])  # fmt: skip
    log = StepLog(record.path)
    assert len(log.segments) == 1 and log.segments[0].constants == {}
    assert [r["values"] for r in _rows(log)] == [
        {"loss": 0.5, "tokens": 7.0, "lr": 0.1}, {"loss": 0.25, "tokens": 9.0, "lr": 0.1},
    ]  # fmt: skip


def test_an_integer_past_float64_stays_json(tmp_path: Path) -> None:
    record = _record(tmp_path)
    record.event("step", attempt=1, step=0, tokens=2**53 + 1)
    record.flush_events()
    assert StepLog(record.path).segments == []
    assert json.loads(record.events_path.read_text())["tokens"] == 2**53 + 1


# ---- tears and damage ---------------------------------------------------------------------------


def test_a_torn_last_record_is_left_out_and_repair_cuts_it(tmp_path: Path) -> None:
    record = _record(tmp_path)
    _write(record, [{"loss": 0.5, "samples": 8} for _ in range(10)])
    (seg,) = StepLog(record.path).segments
    size = seg.path.stat().st_size
    assert size == seg.offset + 10 * seg.width
    with open(seg.path, "r+b") as f:
        f.truncate(size - seg.width // 2)  # the last record half written
    log = StepLog(record.path)
    (torn,) = log.torn
    assert torn.count == 9 and torn.torn == seg.width - seg.width // 2
    assert log.count() == 9
    assert [r["step"] for r in _rows(log)] == list(range(9))
    assert [e["step"] for e in log.tail(3)] == [6, 7, 8]
    assert [len(c) for c in StepTail(record.path, 1).poll()] == [9]
    assert repair_torn(record.path) == [(seg.path, seg.width - seg.width // 2)]
    assert seg.path.stat().st_size == seg.offset + 9 * seg.width
    assert repair_torn(record.path) == []  # nothing left to cut
    assert StepLog(record.path).torn == []
    # The next writer (a resumed attempt) writes a segment of its own after the cut one.
    _write(_reopened(record), [{"loss": 0.25}])
    log = StepLog(record.path)
    assert [s.count for s in log.segments] == [9, 1] and log.torn == []


def _reopened(record: RunRecord) -> RunRecord:
    return RunRecord(record.path)


def _header(columns: list[list[str]]) -> bytes:
    body = json.dumps({"columns": columns, "constants": {}, "attempt": 1}).encode()
    body += b" " * ((-(len(MAGIC) + 4 + len(body))) % 8)
    return MAGIC + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    "blob",
    [
        b"NOTSTEPS" + b"\0" * 20,
        MAGIC[:5],
        MAGIC + struct.pack("<I", MAX_HEADER + 1),
        MAGIC + struct.pack("<I", 8) + b"{not jso",
        MAGIC + struct.pack("<I", 24) + b'{"columns":[["x","q8"]]}',
        MAGIC + struct.pack("<I", 16) + b'{"columns":[]} ',
        _header([["step", "i8"], ["t", "f8"], ["x", "f4"], ["x", "f4"]]) + b"\0" * 48,
        _header([["step", "i8"], ["t", "f8"], ["", "f4"]]) + b"\0" * 40,
    ],
    ids=[
        "magic",
        "short",
        "huge-header",
        "bad-json",
        "bad-codec",
        "no-base-columns",
        "repeated-column",
        "unnamed-column",
    ],
)
def test_a_damaged_header_is_a_problem_not_a_traceback(tmp_path: Path, blob: bytes) -> None:
    record = _record(tmp_path)
    _write(record, [{"loss": 0.5}, {"loss": 0.5}])
    bad = record.path / "attempts" / "1" / "steps" / "000007.steps"
    bad.write_bytes(blob)
    log = StepLog(record.path)
    (problem,) = log.problems
    assert str(bad) in problem
    assert [r["step"] for r in _rows(log)] == [0, 1]  # the sound segment still reads
    assert StepTail(record.path, 1).poll()[0].step.tolist() == [0, 1]


# ---- format 1 -----------------------------------------------------------------------------------


def _format1(root: Path, steps: list[dict[str, Any]], name: str = "f1") -> RunRecord:
    """A record of format 1: its steps as JSON lines of events.jsonl, as the old writer wrote."""
    record = _record(root, name)
    (record.path / "run.json").write_text(json.dumps({"format": 1, "run_id": name}))
    log = AppendLog(record.events_path)
    log.append({"t": T0 - 1, "kind": "run_start"})
    for fields in steps:
        log.append({"kind": "step", **fields})
    log.append({"t": T0 + len(steps), "kind": "verdict", "verdict": "accepted"})
    log.flush()
    return record


def test_a_format_1_record_reads_through_the_same_chunks(tmp_path: Path) -> None:
    steps = [
        {
            "loss": 1 / (i + 1),
            "samples": 8,
            "step_time": round(0.01 + i * 1e-6, 6),
            "total_steps": 30,
        }
        for i in range(30)
    ]
    steps[7] = {"samples": 8, "total_steps": 30}  # nothing else logged
    steps[9]["loss"] = float("nan")
    new = _record(tmp_path)
    _write(new, steps)
    old = _format1(tmp_path, [{"t": T0 + i, "attempt": 1, "step": i, **s}
                              for i, s in enumerate(steps)])  # fmt: skip
    a, b = StepLog(new.path), StepLog(old.path)
    assert b.segments == [] and b.count() == 0
    ca, cb = list(a.chunks()), list(b.chunks())
    assert len(cb) == 1 and cb[0].constants == {"total_steps": 30}
    step_a = np.concatenate([c.step for c in ca])
    assert np.array_equal(step_a, cb[0].step) and np.array_equal(
        np.concatenate([c.t for c in ca]), cb[0].t
    )
    for name in ("loss", "samples", "step_time"):
        va = np.concatenate([c.values[name] for c in ca])
        pa = np.concatenate([c.present[name] for c in ca])
        assert np.array_equal(va, cb[0].values[name], equal_nan=True), name
        assert np.array_equal(pa, cb[0].present[name]), name
    assert a.tail(2) == b.tail(2)
    assert [r["step"] for r in _rows(StepLog(old.path, events=list(_events(old))))] == list(
        range(30)
    )


def _events(record: RunRecord) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.events_path.read_text().splitlines()]


# ---- generative ---------------------------------------------------------------------------------

_RESERVED = {"t", "kind", "attempt", "step", "sync", "defer", "total_steps", "source"}
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_/.", min_size=1, max_size=6).filter(
    lambda s: s not in _RESERVED
)
_values = st.one_of(
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32, allow_nan=False),  # float32-exact values: the f4 codec
    st.sampled_from([0.25, 8, 1e-7]),
)
_timed = st.one_of(
    st.floats(min_value=0, max_value=5000, allow_nan=False).map(lambda v: round(v, 6)),
    st.just(float("nan")),
)


@st.composite
def _step_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(_names, min_size=1, max_size=4, unique=True))
    n = draw(st.integers(min_value=1, max_value=40))
    first = draw(st.integers(min_value=-5, max_value=10**12))
    attempts = sorted(draw(st.lists(st.sampled_from([1, 2, 3]), min_size=n, max_size=n)))
    # Half the runs log every key at every step, as a loop does: the writer's fast path
    # (one shape, packed by a plan) then writes most records, widening when a value asks.
    every = draw(st.booleans())
    events = []
    for i in range(n):
        ev: dict[str, Any] = {"t": T0 + i * 0.5, "attempt": attempts[i], "step": first + i}
        for name in names:
            if every or draw(st.booleans()):  # else missing at this step
                ev[name] = draw(_values)
        for name in ("step_time", "data_wait"):
            if every or draw(st.booleans()):
                ev[name] = draw(_timed)
        if draw(st.booleans()):
            ev["total_steps"] = draw(st.sampled_from([100, 10**9]))
        if draw(st.integers(0, 3)) == 0:
            ev["source"] = draw(st.sampled_from(["trainer", "lightning"]))
        events.append(ev)
    return events


@settings(max_examples=100, deadline=None)
@given(events=_step_events())
def test_random_steps_read_back_as_their_json_reference(
    tmp_path_factory: pytest.TempPathFactory, events: list[dict[str, Any]]
) -> None:
    root = tmp_path_factory.mktemp("gen")
    new = _record(root)
    for ev in events:
        new.event("step", defer=True, **ev)
    new.flush_events()
    assert not new.events_path.exists()  # every one of them became a record
    old = _format1(root, events)
    got, ref = _rows(StepLog(new.path)), _rows(StepLog(old.path))
    assert len(got) == len(ref) == len(events)
    for g, r, ev in zip(got, ref, events, strict=True):
        assert (g["attempt"], g["step"], g["t"]) == (r["attempt"], r["step"], r["t"])
        assert (g["step"], g["t"]) == (ev["step"], ev["t"])
        assert set(g["values"]) == set(r["values"]), (g, r)
        for name, v in r["values"].items():
            assert _same(g["values"][name], v), (name, g["values"][name], v)
            want = float(ev[name])  # ints read as floats
            assert _same(g["values"][name], want), (name, g["values"][name], want)
        assert (
            g["constants"]
            == r["constants"]
            == {k: ev[k] for k in ("total_steps", "source") if k in ev}
        )
