"""Durable writes: atomic replace under SIGKILL and full disks, torn JSONL lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
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


def test_sigkill_during_write_leaves_old_file_whole(tmp_path: Path) -> None:
    """A real process is SIGKILLed while it streams 400 MB through write_atomic."""
    target = tmp_path / "big.bin"
    write_atomic(target, b"the good old content")
    script = textwrap.dedent(
        f"""
        import sys
        from acceptrun._util.durable import write_atomic
        def writer(f):
            chunk = b"x" * (1 << 20)
            for i in range(400):
                f.write(chunk)
                if i == 2:
                    print("writing", flush=True)
        write_atomic({str(target)!r}, writer)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert target.read_bytes() == b"the good old content"


def test_full_disk_keeps_old_file_and_says_so(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes write(2) fail with EFBIG, as a full disk would fail with ENOSPC."""
    target = tmp_path / "ckpt.bin"
    write_atomic(target, b"previous")
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        from acceptrun._util.durable import write_atomic
        from acceptrun.errors import UserError
        try:
            write_atomic({str(target)!r}, b"y" * (1 << 20))
        except UserError as e:
            print(e)
            sys.exit(2)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert f"could not write {target}" in proc.stdout
    assert "previous copy, if any, is intact" in proc.stdout
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_read_jsonl_skips_torn_and_garbled_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    append_jsonl(path, {"kind": "a"})
    append_jsonl(path, {"kind": "b"}, sync=True)
    with open(path, "ab") as f:
        f.write(b"not json\n")
        f.write(b'{"kind": "torn"')  # a writer died mid-line
    assert [e["kind"] for e in read_jsonl(path)] == ["a", "b"]
    assert list(read_jsonl(tmp_path / "missing.jsonl")) == []


def test_concurrent_appends_do_not_interleave(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import sys
        from acceptrun._util.durable import append_jsonl
        for i in range(300):
            append_jsonl({str(path)!r}, {{"w": sys.argv[1], "i": i, "pad": "z" * 2000}})
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(4)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    lines = path.read_bytes().splitlines()
    assert len(lines) == 1200
    records = [json.loads(line) for line in lines]
    for w in range(4):
        assert [r["i"] for r in records if r["w"] == str(w)] == list(range(300))


def test_damaged_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text("{broken")
    with pytest.raises(RecordError, match=r"run.json is not valid JSON"):
        read_json(path)


def test_append_log_holds_deferred_records_and_keeps_the_order(tmp_path: Path) -> None:
    from acceptrun._util.durable import AppendLog

    path = tmp_path / "events.jsonl"
    log = AppendLog(path)
    for step in range(3):
        log.append({"kind": "step", "step": step}, defer=True)
    assert not path.exists() or path.read_text() == ""  # held, not yet written
    log.append({"kind": "stopped"})  # any other record writes the held ones first
    kinds = [(r["kind"], r.get("step")) for r in read_jsonl(path)]
    assert kinds == [("step", 0), ("step", 1), ("step", 2), ("stopped", None)]
    log.append({"kind": "step", "step": 3}, defer=True)
    log.flush()
    assert [r.get("step") for r in read_jsonl(path)][-1] == 3


def test_append_log_writes_held_records_after_its_interval(tmp_path: Path) -> None:
    from acceptrun._util.durable import AppendLog

    path = tmp_path / "events.jsonl"
    log = AppendLog(path)
    log.append({"step": 0}, defer=True)
    time.sleep(AppendLog.FLUSH_S + 0.05)
    log.append({"step": 1}, defer=True)  # the oldest held record is due: both go out
    assert [r["step"] for r in read_jsonl(path)] == [0, 1]


def test_a_forked_child_does_not_write_its_parents_held_records(tmp_path: Path) -> None:
    from acceptrun._util.durable import AppendLog

    path = tmp_path / "events.jsonl"
    log = AppendLog(path)
    log.append({"who": "parent", "step": 0}, defer=True)
    pid = os.fork()
    if pid == 0:  # the child: a data-loader worker, say
        try:
            log.append({"who": "child"})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    log.close()
    assert [r["who"] for r in read_jsonl(path)] == ["child", "parent"]
