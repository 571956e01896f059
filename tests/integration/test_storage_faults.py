"""The run directory's file system fills up, or turns read-only, after preflight.

Disk full is made with RLIMIT_FSIZE, which needs no privilege and works in any
container: once the first checkpoint is committed the supervisor's process tree gets a
file-size limit of 0 bytes (SIGXFSZ ignored, so every write fails with EFBIG, as a full
disk fails with ENOSPC). Read-only is made with a read-only bind mount of the run
directory where ``mount`` is allowed (root outside a locked-down container), else
simulated by the same limit. The progress made must survive (the last committed checkpoint
verifies), the supervisor must say what happened and where, exit non-zero without a
traceback, and the record must stay readable.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from acceptrun.checkpoint.store import CheckpointStore
from conftest import wait_for

pytestmark = pytest.mark.slow

PYTHON = sys.executable

WORK = """
import time
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(4, 1))
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 400):
    time.sleep(0.05)
    run.log(step, loss=1.0 / (step + 1))
    if step % 5 == 4:
        run.checkpoint(step, block=True)
run.metric("acc", 0.95)
"""

SPEC = """
name = "faults"
command = [{python}, "work.py"]
[checkpoint]
keep_last = 2
[limits]
max_restarts = 1
restart_backoff = 0
[acceptance]
metrics = {{ acc = ">= 0.9" }}
"""


def _ignore_sigxfsz() -> None:
    # Without this the kernel kills a process that writes past RLIMIT_FSIZE.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _cli(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _start(tmp_path: Path) -> tuple[Path, subprocess.Popen[str]]:
    (tmp_path / "work.py").write_text(textwrap.dedent(WORK))
    (tmp_path / "spec.toml").write_text(SPEC.format(python=json.dumps(PYTHON)))
    ws = tmp_path / ".acceptrun"
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_ignore_sigxfsz,
    )  # fmt: skip
    return ws, proc


def _run_dir(ws: Path) -> Path:
    def committed() -> Path | None:
        for events in (ws / "runs").glob("*/events.jsonl"):
            if '"checkpoint_commit"' in events.read_text():
                return events.parent
        return None

    found: Path = wait_for(committed, timeout=300, what="the first committed checkpoint")
    return found


def _limit_writes(pid: int) -> None:
    """Every write of the supervisor's tree (and of what it starts later) fails: EFBIG."""
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            resource.prlimit(p.pid, resource.RLIMIT_FSIZE, (0, 0))
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue


def _check_aftermath(ws: Path, run_dir: Path, returncode: int, err: str, says: str) -> None:
    assert returncode != 0, err
    assert "Traceback" not in err, err
    assert any(str(run_dir) in line and says in line for line in err.splitlines()), err
    # Progress is not lost: the newest committed checkpoint verifies.
    store = CheckpointStore(run_dir / "checkpoints")
    latest = store.latest_verified(quarantine=False)
    assert latest is not None and latest.step >= 4, store.list()
    verify = _cli(ws, "ckpt", "verify", run_dir.name)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # The record stays readable; no half-written file replaced a good one.
    for args in (("show", run_dir.name), ("ls",), ("show", "--json", run_dir.name)):
        out = _cli(ws, *args)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr)
    for path in run_dir.rglob("*.json"):
        json.loads(path.read_text())
    assert not [p for p in run_dir.rglob(".*.tmp-*")], "temporary files left behind"


def test_disk_full_mid_run(tmp_path: Path) -> None:
    ws, proc = _start(tmp_path)
    try:
        run_dir = _run_dir(ws)
        _limit_writes(proc.pid)
        _, err = proc.communicate(timeout=300)
        _check_aftermath(ws, run_dir, proc.returncode, err, "disk full")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _can_mount(tmp_path: Path) -> bool:
    probe = tmp_path / "mount-probe"
    probe.mkdir()
    ok = subprocess.run(["mount", "--bind", str(probe), str(probe)], capture_output=True).returncode
    if ok == 0:
        subprocess.run(["umount", str(probe)], check=True)
    return ok == 0


@pytest.fixture
def read_only_bind() -> Iterator[list[Path]]:
    mounted: list[Path] = []
    yield mounted
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_read_only_after_preflight(tmp_path: Path, read_only_bind: list[Path]) -> None:
    mount = _can_mount(tmp_path)
    ws, proc = _start(tmp_path)
    try:
        run_dir = _run_dir(ws)
        if mount:
            # New files under the run directory fail with EROFS from here on.
            subprocess.run(["mount", "--bind", str(run_dir), str(run_dir)], check=True)
            read_only_bind.append(run_dir)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(run_dir)], check=True)
            says = "read-only"
        else:  # no mount in this container: the same limit as a full disk
            _limit_writes(proc.pid)
            says = "disk full"
        _, err = proc.communicate(timeout=300)
        if mount:
            subprocess.run(["umount", str(run_dir)], check=True)
            read_only_bind.remove(run_dir)
        _check_aftermath(ws, run_dir, proc.returncode, err, says)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
