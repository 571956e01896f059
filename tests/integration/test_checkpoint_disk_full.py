"""The checkpoint directory's file system fills while the workload's client saves.

The checkpoint directory (``[checkpoint] dir``) is a 12 MiB tmpfs where ``mount`` is
allowed (root, as here and in CI's container when it permits mounts): the first
checkpoints (a few KiB) fit, the one of step 14 (a 16 MiB tensor registered at step 10)
meets a real ``ENOSPC``. Where mounting is impossible the workload limits its own file
size (``RLIMIT_FSIZE`` 4 MiB, ``SIGXFSZ`` ignored, as tests/integration/test_storage_faults.py
does for the supervisor), so the same save fails with ``EFBIG``; the run directory stays
writable either way, so the supervisor can record what happened.

One run, read by every test of the module: the workload ends on a
``CheckpointDiskFullError`` naming the directory, the bytes needed and free and the fix
(no raw ``OSError`` in its stderr), the attempt is classified ``disk_full`` and not
retried, the events and the verdict say so, the previous checkpoint is intact and
verifies, and once there is space ``acceptrun resume`` continues from it to ACCEPTED.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.checkpoint.store import CheckpointStore

pytestmark = pytest.mark.slow

PYTHON = sys.executable
TMPFS = "12m"  # preflight's storage probe writes 8 MiB; a 16 MiB checkpoint does not fit

WORK = """
import os, resource, signal
import torch
import acceptrun

if os.path.exists("fsize-limit"):  # no tmpfs here: a file-size limit makes the disk "full"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
blob = torch.zeros(16)
run = acceptrun.init()
start = run.restore(model=model, blob=blob)
for step in run.steps(start, 20):
    run.log(step, loss=1.0 / (step + 1))
    if step == 10:
        run.update_state(blob=torch.zeros(4 << 20))  # 16 MiB: more than the disk holds
    if step % 5 == 4:
        run.checkpoint(step, block=True)
run.metric("acc", 0.95)
"""

SPEC = """
name = "ckfull"
command = [{python}, "work.py"]
[checkpoint]
dir = {ckpt}
keep_last = 2
[limits]
max_restarts = 2
restart_backoff = 0
[acceptance]
metrics = {{ acc = ">= 0.9" }}
"""


def _cli(ws: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


def _mount_tmpfs(path: Path) -> bool:
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


@dataclass
class FullRun:
    tmp: Path
    ws: Path
    ckpt: Path  # the run's own store: checkpoint.dir/<run id>/
    tmpfs: bool
    run_dir: Path
    result: subprocess.CompletedProcess[str]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_jsonl(self.run_dir / "events.jsonl") if e.get("kind") == kind]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullRun]:
    tmp = tmp_path_factory.mktemp("ckfull")
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    tmpfs = _mount_tmpfs(ckpt)
    try:
        if not tmpfs:
            (tmp / "fsize-limit").touch()
        (tmp / "work.py").write_text(textwrap.dedent(WORK))
        (tmp / "spec.toml").write_text(
            SPEC.format(python=json.dumps(PYTHON), ckpt=json.dumps(str(ckpt)))
        )
        ws = tmp / ".acceptrun"
        result = _cli(ws, "run", "-q", "spec.toml", cwd=tmp)
        runs = list((ws / "runs").iterdir())
        assert len(runs) == 1, (runs, result.stderr)
        yield FullRun(tmp, ws, ckpt / runs[0].name, tmpfs, runs[0], result)
    finally:
        if tmpfs:
            subprocess.run(["umount", "-l", str(ckpt)], check=False)


def test_the_workload_ends_on_a_clear_error_naming_directory_bytes_and_fix(full: FullRun) -> None:
    assert full.result.returncode != 0, full.result.stdout
    stderr = (full.run_dir / "attempts" / "1" / "stderr.log").read_text()
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        "acceptrun.checkpoint.saver.CheckpointDiskFullError: the checkpoint of step 14 was "
        "not saved: "
    ), stderr
    assert "[Errno" not in stderr, "a raw OSError reached the user:\n" + stderr
    if full.tmpfs:  # a real full disk: the bytes needed and free
        assert f"{full.ckpt} is full: the checkpoint needs at least 16.0 MiB, " in last, last
        assert " MiB free (No space left on device)" in last, last
        assert "Free at least " in last and f"of space in {full.ckpt}" in last, last
    else:
        assert f"in {full.ckpt} would pass this process's file-size limit of 4.0 MiB" in last
        assert "(File too large)" in last, last
        assert "ulimit -f" in last, last
    assert "step 9, the previous checkpoint, is intact and verified" in last, last
    assert "then `acceptrun resume RUN` continues from step 9." in last, last


def test_the_events_and_the_verdict_say_what_happened(full: FullRun) -> None:
    (failed,) = full.events("checkpoint_failed")
    assert failed["fault"] == "disk full" and failed["directory"] == str(full.ckpt), failed
    assert failed["step"] == 14 and failed["intact_step"] == 9, failed
    assert failed["needed_bytes"] >= 16 << 20, failed
    if full.tmpfs:
        assert failed["free_bytes"] < failed["needed_bytes"], failed
    # The supervisor classified the attempt and did not restart it (max_restarts = 2).
    exits = full.events("attempt_exit")
    assert [(e["attempt"], e["class"]) for e in exits] == [(1, "disk_full")], exits
    assert not full.events("restart")
    verdict = json.loads((full.run_dir / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["checks"]}
    assert verdict["verdict"] == "rejected"
    assert checks["exit"]["status"] == "fail" and "free space" in checks["exit"]["fix"]
    assert "disk_full" in checks["failures"]["evidence"], checks["failures"]
    assert str(full.ckpt) in checks["failures"]["evidence"], checks["failures"]
    assert checks["last checkpoint"]["status"] == "pass", checks["last checkpoint"]


def test_the_previous_checkpoint_is_intact_and_nothing_half_written_is_left(
    full: FullRun,
) -> None:
    store = CheckpointStore(full.ckpt)
    assert [i.step for i in store.list()] == [4, 9]
    assert store.verify(9).ok and store.latest_verified(quarantine=False).step == 9  # type: ignore[union-attr]
    assert not [p.name for p in full.ckpt.iterdir() if p.name.startswith(".")], "staging left"


def test_resume_continues_from_it_once_there_is_space(full: FullRun) -> None:
    if full.tmpfs:
        grown = subprocess.run(
            ["mount", "-o", "remount,size=64m", str(full.ckpt.parent)],
            capture_output=True,
            text=True,
        )
        assert grown.returncode == 0, grown.stderr
    else:
        (full.tmp / "fsize-limit").unlink()
    resumed = _cli(full.ws, "resume", full.run_dir.name, cwd=full.tmp)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "ACCEPTED" in resumed.stdout, resumed.stdout
    restored = [e for e in full.events("restored") if e.get("attempt") == 2]
    assert [e["step"] for e in restored] == [9], restored
