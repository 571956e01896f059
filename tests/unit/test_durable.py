"""Durable writes: atomic replace under SIGKILL and full disks, torn JSONL lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun._util.durable import (
    append_jsonl,
    read_json,
    read_jsonl,
    write_atomic,
    write_json_atomic,
)
from acceptrun.errors import RecordError
from conftest import wait_for


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"old")
    write_json_atomic(target, {"a": 1})
    assert read_json(target) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_writer_exception_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "model.bin"
    write_atomic(target, b"good")

    def broken(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError):
        write_atomic(target, broken)
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_read_jsonl_skips_torn_and_garbled_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    append_jsonl(path, {"kind": "a"})
    append_jsonl(path, {"kind": "b"}, sync=True)
    with open(path, "ab") as f:
        f.write(b"not json\n")
        f.write(b'{"kind": "torn"')  # a writer died mid-line
    assert [e["kind"] for e in read_jsonl(path)] == ["a", "b"]
    assert list(read_jsonl(tmp_path / "missing.jsonl")) == []


def test_damaged_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text("{broken")
    with pytest.raises(RecordError, match=r"run.json is not valid JSON"):
        read_json(path)


def test_append_log_holds_deferred_records_and_keeps_the_order(tmp_path: Path) -> None:
    from acceptrun._util.durable import AppendLog

    path = tmp_path / "events.jsonl"
    log = AppendLog(path)
    log.FLUSH_S = 3600.0  # nothing is due during this test, however slow the machine
    for step in range(3):
        log.append({"kind": "step", "step": step}, defer=True)
    assert not path.exists() or path.read_text() == ""  # held, not yet written
    log.append({"kind": "stopped"})  # any other record writes the held ones first
    kinds = [(r["kind"], r.get("step")) for r in read_jsonl(path)]
    assert kinds == [("step", 0), ("step", 1), ("step", 2), ("stopped", None)]
    log.append({"kind": "step", "step": 3}, defer=True)
    log.flush()
    assert [r.get("step") for r in read_jsonl(path)][-1] == 3


def test_append_log_writes_held_records_once_due_without_another_append(tmp_path: Path) -> None:
    """A writer that stops appending (blocked in a collective, hung) still shows its steps."""
    from acceptrun._util.durable import AppendLog

    path = tmp_path / "events.jsonl"
    log = AppendLog(path)
    log.append({"step": 0}, defer=True)
    log.append({"step": 1}, defer=True)  # and nothing after: the flusher writes both
    wait_for(
        lambda: path.exists() and [r["step"] for r in read_jsonl(path)] == [0, 1],
        timeout=60,
        what="the held records written by the flusher",
    )
    # The flusher sleeps while nothing is held; a later batch wakes it again, and a batch
    # an append wrote itself (a lifecycle record) leaves it nothing to do.
    log.append({"step": 2}, defer=True)
    wait_for(
        lambda: [r["step"] for r in read_jsonl(path)] == [0, 1, 2],
        timeout=60,
        what="a second batch written by the flusher after it slept",
    )
    log.append({"step": 3}, defer=True)
    log.append({"step": 4})
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2, 3, 4]
