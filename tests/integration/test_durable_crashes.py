"""Durable writes under crashes: SIGKILL during a write, a full disk, concurrent appends, a
forked child's held records (the writers' rules: tests/unit/test_durable.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from acceptrun._util.durable import (
    read_jsonl,
    write_atomic,
)


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
        assert p.wait(timeout=300) == 0
    lines = path.read_bytes().splitlines()
    assert len(lines) == 1200
    records = [json.loads(line) for line in lines]
    for w in range(4):
        assert [r["i"] for r in records if r["w"] == str(w)] == list(range(300))


def test_a_forked_child_does_not_write_its_parents_held_records(tmp_path: Path) -> None:
    from acceptrun._util.durable import AppendLog

    path = tmp_path / "events.jsonl"
    log = AppendLog(path)
    log.FLUSH_S = 3600.0  # held until close(): the flusher thread must not write it first
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
