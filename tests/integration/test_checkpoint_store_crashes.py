"""Checkpoint store under crashes: stale staging removed, a full disk keeps the previous
checkpoint, SIGKILL campaigns lose no commit (the protocol itself:
tests/unit/test_checkpoint_store.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ckpt_kill_worker

from acceptrun.checkpoint.sequence import COMMITS
from acceptrun.checkpoint.store import (
    LATEST,
    CheckpointStore,
)
from builders import Events, commit_step, entries


def test_remove_stale_staging(tmp_path: Path) -> None:
    events = Events()
    store = CheckpointStore(tmp_path, on_event=events)
    commit_step(store, 1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [
            tmp_path / f".staging-step-2-{dead.pid}-00aa",
            tmp_path / f".deleting-step-0-{dead.pid}-00bb",
        ]
        for path in stale:
            path.mkdir()
            (path / "model.bin").write_bytes(b"partial")
        temp_latest = tmp_path / f".LATEST.tmp-{dead.pid}-00cc"
        temp_latest.write_text("step-2\n")
        live = tmp_path / f".staging-step-2-{alive.pid}-00dd"
        live.mkdir()
        mine = store.begin(3)  # this store's own open writer
        stranded = tmp_path / f".staging-step-2-{os.getpid()}-00ee"  # our pid, no writer
        stranded.mkdir()

        removed = store.remove_stale_staging()
        assert sorted(removed) == sorted([*stale, temp_latest, stranded])
        assert live.is_dir() and mine.path.is_dir()
        assert [e["path"] for e in events.of("checkpoint_staging_removed")] == [
            str(p) for p in sorted(removed)
        ]
        mine.write_bytes("model.bin", b"ok")
        assert store.commit(mine).step == 3
    finally:
        alive.kill()
        alive.wait()


def test_full_disk_keeps_previous_checkpoint(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes write(2) fail with EFBIG, as a full disk fails with ENOSPC."""
    store = CheckpointStore(tmp_path)
    before = commit_step(store, 1, data=b"good weights")
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from acceptrun.checkpoint.store import CheckpointStore
        from acceptrun.errors import UserError
        store = CheckpointStore({str(tmp_path)!r})
        writer = store.begin(2)
        writer.write_bytes("small.bin", b"fits")
        try:
            with writer.open("model.bin") as f:
                for _ in range(8):
                    f.write(b"w" * (1 << 19))  # 4 MiB in all, over the 1 MiB limit
        except UserError as e:
            print(e)
            sys.exit(2)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert "could not write checkpoint file" in proc.stdout
    assert "File too large" in proc.stdout
    assert "earlier checkpoints are intact" in proc.stdout
    assert entries(tmp_path) == [COMMITS, LATEST, "step-1"]  # the staging dir was removed
    assert (tmp_path / LATEST).read_text() == "step-1\n"
    assert store.latest_verified() == before


def test_kill_campaign(tmp_path: Path) -> None:
    """SIGKILL a real saving process 50+ times at random moments; nothing committed is lost."""
    figures = ckpt_kill_worker.run_campaign(tmp_path / "ckpt", kills=50, seed=1234)
    assert figures["kills"] == 50
    assert figures["corrupt_latest"] == 0, figures["details"]
    assert figures["lost_committed"] == 0, figures["details"]
    assert figures["bad_listed"] == 0, figures["details"]
    assert figures["stale_left"] == 0, figures["details"]
    assert figures["commits"] >= 25  # every other kill waited for a commit: kills among saves
    assert figures["killed_mid_save"] > 0
    assert figures["continued"], figures["details"]
