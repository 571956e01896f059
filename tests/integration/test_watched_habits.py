"""Watched checkpoints under the habits of public scripts: a snapshot rewritten far more
often than ``settle``, a save finished just before a kill, a file rewritten too often to
ever settle in a format that proves nothing.

Real ``acceptrun run`` processes over scripts that know nothing of acceptrun. A script
that must be killed blocks at a known point, and the test kills it once the record shows
what it waits for: nothing here depends on the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Any

import numpy as np
import pytest
from blackbox_harness import events as run_events
from blackbox_harness import kill_when, start, workload_pid

from acceptrun.checkpoint.store import CheckpointStore
from conftest import PYTHON, Project, wait_for

PATTERN = r"epoch (?P<step>\d+): loss (?P<loss>[0-9.]+)"

# Shaped like a DDP tutorial's snapshot loop: the whole state rewritten in place after
# every epoch (here about every 0.05 s), loaded at start whenever the file exists.
SNAPSHOT = """
import json, os, sys, time
os.makedirs("out", exist_ok=True)
start = 0
if os.path.exists("out/snapshot.json"):
    start = json.load(open("out/snapshot.json"))["epoch"] + 1
    print(f"resuming from snapshot at epoch {start - 1}", flush=True)
for epoch in range(start, 40):
    time.sleep(0.05)
    print(f"epoch {epoch}: loss {1.0 / (epoch + 1):.4f}", flush=True)
    with open("out/snapshot.json", "w") as f:
        json.dump({"epoch": epoch, "weights": [epoch] * 2000}, f)
    if start == 0 and epoch == 19:
        time.sleep(3600)  # the first attempt waits here to be killed
"""


def test_a_snapshot_rewritten_far_more_often_than_settle_is_captured(project: Project) -> None:
    spec = project.spec(
        SNAPSHOT,
        extra=f"""
        [checkpoint]
        watch = ["out/snapshot.json"]
        settle = "2s"
        [progress]
        pattern = {json.dumps(PATTERN)}
        [limits]
        restart_backoff = "0s"
        """,
    )
    proc = start(project, spec)

    def captured_19() -> dict[str, Any] | None:
        """The capture that holds epoch 19's snapshot (where the script then waits)."""
        runs = project.run_ids()
        for e in run_events(project):
            if e["kind"] != "checkpoint_captured" or not runs:
                continue
            kept = project.runs_dir / runs[0] / "checkpoints" / f"step-{e['step']}"
            snap = kept / "files" / "out" / "snapshot.json"
            try:
                if json.loads(snap.read_text())["epoch"] == 19:
                    return e
            except (OSError, ValueError):
                continue  # not committed yet, or a step retention removed
        return None

    first = wait_for(captured_19, timeout=180, what="the snapshot of epoch 19 captured")
    assert first["complete_by"] == "json: parses; no process held it open for writing"
    os.kill(workload_pid(project), signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    rec = project.only_record()
    # The restart put the captured snapshot back, and the script resumed from it.
    log = (rec.path / "attempts" / "2" / "stdout.log").read_text()
    assert "resuming from snapshot at epoch 19" in log, log[-2000:]
    assert "epoch 20:" in log and "epoch 39:" in log
    verdict = json.loads(rec.file("verdict.json").read_text())
    assert verdict["accepted"], verdict
    # Saves were captured in attempt 1 before the one it was killed at, never waiting
    # for a file that never held still for 2 s.
    caps = [e for e in run_events(project) if e["kind"] == "checkpoint_captured"]
    assert len([e for e in caps if e["attempt"] == 1]) >= 1
    assert not [e for e in run_events(project) if e["kind"] == "checkpoint_not_settling"]


NPY_SAVE = """
import os, sys, time
import numpy as np
os.makedirs("out", exist_ok=True)
w = np.arange(50_000, dtype=np.float64)
if sys.argv[1] == "whole":
    f = open("out/model.npy", "wb")  # held open for writing from the first byte...
    np.save(f, w)  # ...written whole, and never closed (a slow close)
    f.flush()
else:
    f = open("out/model.npy", "wb")  # killed mid-save: the header and half the data
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(w))
    f.write(w[: w.size // 2].tobytes())
    f.flush()
open("out/saved", "w").close()
time.sleep(3600)
"""


@pytest.mark.parametrize("state", ["whole", "torn"])
def test_a_save_finished_just_before_a_kill_is_kept_and_a_torn_one_is_not(
    project: Project, state: str
) -> None:
    """``settle`` is far longer than the script lives and the file stays open for writing:
    only the final pass, after the kill, can take it, and trusts it only when its format
    proves it whole (a live pass leaves a file a process holds open for writing alone)."""
    (project.root / "save.py").write_text(NPY_SAVE)
    spec = project.spec(
        command=[PYTHON, "save.py", state],
        extra="""
        [checkpoint]
        watch = ["out/model.npy"]
        settle = "1h"
        [limits]
        max_restarts = 0
        """,
    )
    proc = start(project, spec)
    pid = workload_pid(project)
    wait_for(lambda: (project.root / "out" / "saved").exists(), timeout=120, what="the save")
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out  # killed, never restarted: a failed run
    rec = project.only_record()
    infos = CheckpointStore(rec.checkpoints_dir).list()
    events = run_events(project)
    if state == "whole":
        (cap,) = [e for e in events if e["kind"] == "checkpoint_captured"]
        assert cap["complete_by"] == (
            "npy: header and array bytes match the size; the attempt's processes had exited"
        )
        assert len(infos) == 1
        kept = np.load(infos[0].path / "files" / "out" / "model.npy")
        assert np.array_equal(kept, np.arange(50_000, dtype=np.float64))
    else:
        assert infos == []
        (missed,) = [e for e in events if e["kind"] == "checkpoint_not_captured"]
        assert "format does not prove it whole" in missed["reason"]


def test_a_file_that_never_settles_in_an_unknown_format_is_said(project: Project) -> None:
    spec = project.spec(
        """
        import os, time
        os.makedirs("out", exist_ok=True)
        n = 0
        while not os.path.exists("stop"):
            with open("out/state.bin", "wb") as f:
                f.write(bytes([n % 256]) * 4096)
            n += 1
            time.sleep(0.05)
        """,
        extra="""
        [checkpoint]
        watch = ["out/state.bin"]
        settle = "0.4s"
        """,
    )
    proc = start(project, spec)
    said = wait_for(
        lambda: next((e for e in run_events(project) if e["kind"] == "checkpoint_not_settling"), None),
        timeout=180, what="checkpoint_not_settling",
    )  # fmt: skip
    (project.root / "stop").touch()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert said["source_path"].endswith("out/state.bin") and said["rewrites"] >= 3
    assert said["every_s"] < said["settle_s"] == 0.4
    assert "set checkpoint.settle below" in said["reason"]
    assert "save atomically" in said["reason"]
    said_again = [e for e in run_events(project) if e["kind"] == "checkpoint_not_settling"]
    assert len(said_again) == 1  # once per path, not once per poll


# Shaped like scripts whose --resume loads the weights and counts iterations from 1 again:
# the state holds the iterations trained in all, the truth the test checks steps against.
RESTARTED_COUNTER = """
import json, os, signal, sys
os.makedirs("out", exist_ok=True)
trained = 0
if "--resume" in sys.argv:
    trained = json.load(open(sys.argv[sys.argv.index("--resume") + 1]))["trained"]
    print(f"resumed with {trained} iterations trained", flush=True)
for it in range(1, 31 if trained else 61):
    trained += 1
    print(f"iter {it}: loss {1.0 / trained:.5f}", flush=True)
    if it % 10 == 0:
        with open("out/tmp.json", "w") as f:
            json.dump({"trained": trained}, f)
        os.replace("out/tmp.json", f"out/ckpt_{it}.json")
    if trained == 50:
        open("out/saved-50", "w").close()
        signal.pause()  # the first attempt waits here for the test's SIGKILL
"""


ITER = r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+)"


def test_a_counter_that_restarts_after_a_resume_stays_on_one_step_axis(project: Project) -> None:
    spec = project.spec(
        RESTARTED_COUNTER,
        extra=f"""
        [checkpoint]
        watch = ["out/ckpt_*.json"]
        resume_args = ["--resume", "{{checkpoint}}"]
        keep_last = 2
        [progress]
        pattern = {json.dumps(ITER)}
        [limits]
        restart_backoff = "0s"
        """,
    )
    rc, out = kill_when(
        project, spec, lambda e: e["kind"] == "checkpoint_captured" and e["step"] == 50,
        "the save of iteration 50 captured",
    )  # fmt: skip
    assert rc == 0, out
    rec = project.only_record()
    events = run_events(project)
    log = (rec.path / "attempts" / "2" / "stdout.log").read_text()
    assert "resumed with 50 iterations trained" in log, log[-2000:]
    (restarted,) = [e for e in events if e["kind"] == "step_counter_restarted"]
    assert (restarted["attempt"], restarted["resumed_from"]) == (2, 50)
    assert (restarted["first_step"], restarted["offset"]) == (1, 50)
    # Every checkpoint holds the state of its step, on the run's one axis.
    caps = [e for e in events if e["kind"] == "checkpoint_captured"]
    assert [e["step"] for e in caps if e["attempt"] == 2] == [60, 70, 80]
    infos = CheckpointStore(rec.checkpoints_dir).list()
    assert [i.step for i in infos] == [70, 80]  # the newest two, attempt 2's
    for info in infos:
        (held,) = (info.path / "files" / "out").iterdir()
        assert json.loads(held.read_text())["trained"] == info.step
    # The attempt's steps continue the run's counter: one rising loss curve.
    from acceptrun.record.steplog import StepLog

    steps = [int(s) for chunk in StepLog(rec.path).chunks() for s in chunk.step]
    assert steps == sorted(steps) and steps[-1] == 80
    show = subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "show", rec.run_id],
        cwd=project.root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "attempt 2's step counter started again at 1 after resuming from step 50" in show


LOADS_WHAT_IT_FINDS = """
import json, os
os.makedirs("out", exist_ok=True)
start = 0
if os.path.exists("out/snapshot.json"):
    start = json.load(open("out/snapshot.json"))["epoch"] + 1
    print(f"resuming from snapshot at epoch {start - 1}", flush=True)
for epoch in range(start, 40):
    print(f"epoch {epoch}: loss {1.0 / (epoch + 1):.4f}", flush=True)
    with open("out/snapshot.json", "w") as f:
        json.dump({"epoch": epoch}, f)
"""


@pytest.mark.parametrize("existing", ["refuse", "move", "start"])
def test_a_watched_file_left_by_an_earlier_run_is_named_before_the_first_attempt(
    project: Project, existing: str
) -> None:
    (project.root / "out").mkdir()
    leftover = project.root / "out" / "snapshot.json"
    leftover.write_text(json.dumps({"epoch": 30}))
    before = leftover.read_bytes()
    spec = project.spec(
        LOADS_WHAT_IT_FINDS,
        extra=f"""
        [checkpoint]
        watch = ["out/snapshot.json"]
        existing = "{existing}"
        [progress]
        pattern = {json.dumps(PATTERN)}
        """,
    )
    check = subprocess.run(
        [PYTHON, "-m", "acceptrun", "spec", "check", str(spec)],
        cwd=project.root, capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "already there: out/snapshot.json (" in check.stdout
    assert f"checkpoint.existing = {existing!r}" in check.stdout
    proc = start(project, spec)
    out, _ = proc.communicate(timeout=300)
    rec = project.only_record()
    prov = json.loads(rec.file("provenance.json").read_text())
    (named,) = prov["watched_existing"]["files"]
    assert named["path"] == "out/snapshot.json" and named["bytes"] == len(before)
    assert named["hash"].startswith("xxh3_128:") and named["mtime"].endswith("Z")
    verdict = json.loads(rec.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "watched files"]
    assert "out/snapshot.json" in row["evidence"]
    if existing == "refuse":
        assert proc.returncode != 0, out
        assert not verdict["accepted"] and row["status"] == "fail"
        assert 'checkpoint.existing = "move"' in row["evidence"]
        assert not (rec.path / "attempts" / "1" / "stdout.log").exists()  # never started
        assert leftover.read_bytes() == before  # untouched
        return
    assert proc.returncode == 0, out
    log = (rec.path / "attempts" / "1" / "stdout.log").read_text()
    if existing == "move":
        assert (rec.path / "leftovers" / "out" / "snapshot.json").read_bytes() == before
        assert "resuming" not in log and "epoch 0:" in log
        assert "moved aside" in row["evidence"]
    else:
        assert "resuming from snapshot at epoch 30" in log and "epoch 0:" not in log
        assert "begins from files it did not write" in row["evidence"]


# Shaped like a script that reports only to TensorBoard (torch's SummaryWriter, its
# defaults) every few steps and saves its state in place every few more. It waits for each
# save to be stored as its step before it saves again (a file rewritten before it is seen
# is not a save that can be kept); attempt 1 waits to be killed once step 30 is.
TENSORBOARD_ONLY = """
import json, os, signal, time
from torch.utils.tensorboard import SummaryWriter
os.makedirs("out", exist_ok=True)
start = 0
if os.path.exists("out/ckpt.json"):
    start = json.load(open("out/ckpt.json"))["step"]
    print(f"resuming at step {start}", flush=True)
writer = SummaryWriter("tb")
events = os.path.join(os.environ["ACCEPTRUN_RUN_DIR"], "events.jsonl")

def stored(step):
    for line in open(events):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("kind") == "checkpoint_commit" and ev.get("step") == step:
            return True
    return False

def apart():
    # A real save takes milliseconds at least; this one takes none. A scalar and a file
    # written within the same millisecond cannot be ordered by their times (a file's
    # mtime and a scalar's wall time come from clocks of different resolution), so each
    # is written once the clock has moved on by 10 ms: a wait on the clock, not on speed.
    t = time.time()
    while time.time() < t + 0.01:
        pass

for step in range(start + 1, 51):
    if step % 5 == 0:
        writer.add_scalar("train/loss", 1.0 / step, step)
        apart()
    if step % 10 == 0:
        with open("out/ckpt.json", "w") as f:
            json.dump({"step": step}, f)
        apart()
    if step % 10 == 5 and step > 10:
        # Five steps after a save (logged: its step is proven), it is stored as its step
        # before the next save rewrites the file.
        while not stored(step - 5):
            time.sleep(0.05)
        if start == 0 and step == 35:
            signal.pause()  # killed here
writer.close()
"""


def test_tensorboard_only_progress_dates_each_save_by_its_step(project: Project) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")  # the script's SummaryWriter is torch's
    spec = project.spec(
        TENSORBOARD_ONLY,
        extra="""
        [checkpoint]
        watch = ["out/ckpt.json"]
        keep_last = 5
        [progress]
        tensorboard = "tb"
        [limits]
        restart_backoff = "0s"
        """,
    )
    rc, out = kill_when(
        project, spec, lambda e: e["kind"] == "checkpoint_commit" and e["step"] == 30,
        "the save of step 30 stored as step 30",
    )  # fmt: skip
    assert rc == 0, out
    rec = project.only_record()
    log = (rec.path / "attempts" / "2" / "stdout.log").read_text()
    assert "resuming at step 30" in log, log[-2000:]
    events = run_events(project)
    (start2,) = [e for e in events if e["kind"] == "attempt_start" and e["attempt"] == 2]
    assert start2["resume_step"] == 30
    # Every stored checkpoint holds the state of the step it is stored as; each saved one
    # is there (a capture dated before TensorBoard's step was read is dated again).
    infos = CheckpointStore(rec.checkpoints_dir).list()
    for info in infos:
        held = json.loads((info.path / "files" / "out" / "ckpt.json").read_text())
        assert held["step"] == info.step, (info.step, held)
    assert [i.step for i in infos] == [10, 20, 30, 40, 50]
    # Steps are logged every 5 and saved every 10: a save dated by step 10 (logged before
    # it) and 15 (after) may hold any of steps 10 to 14, and says so. The last save has
    # no step logged after it.
    for info in infos[:-1]:
        reason = info.meta["dated"].get("estimate", "")
        assert f"holds one of steps {info.step} to {info.step + 4}" in reason, info.meta
    assert "no step logged after" in infos[-1].meta["dated"].get("estimate", ""), infos[-1].meta
    ls = subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(project.workspace), "ckpt", "ls",
         rec.run_id], cwd=project.root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "     50*~ " in ls and "     40~  " in ls, ls
    assert "step 50: an estimate (the newest step reported before it was written;" in ls, ls
    verdict = json.loads(rec.file("verdict.json").read_text())
    assert verdict["accepted"], verdict
    from acceptrun.record.steplog import StepLog

    steps = {int(s) for chunk in StepLog(rec.path).chunks(attempt=1) for s in chunk.step}
    assert {30, 35} <= steps  # TensorBoard's steps reached the record, the newest too
