"""A script's own checkpoints as acceptrun checkpoints: capture, put back, resume flags.

Real ``acceptrun run`` processes over scripts that know nothing of acceptrun: a
nanoGPT-shaped loop that rewrites ``out/ckpt.pt`` in place and resumes with
``--init_from=resume`` (tests/watched_train.py), the same loop saving Hugging Face style
``out/checkpoint-<N>/`` directories, and a writer that holds its file open across long
pauses. Kills come from the test once a capture is recorded, never after a guessed sleep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from blackbox_harness import events as run_events
from blackbox_harness import start

from acceptrun.checkpoint.store import CheckpointStore
from conftest import PYTHON, Project, wait_for

TRAIN = Path(__file__).with_name("watched_train.py")
PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)"
EVERY = 25  # iterations between the script's saves


def _kill_after_commits(project: Project, n: int, attempt: int = 1) -> list[dict[str, Any]]:
    """SIGKILL the attempt's workload once ``n`` watched checkpoints are committed."""

    def commits() -> list[dict[str, Any]] | None:
        found = [
            e
            for e in run_events(project)
            if e["kind"] == "checkpoint_commit"
            and e.get("source") == "watched"
            and e.get("attempt") == attempt
        ]
        return found if len(found) >= n else None

    wait_for(commits, timeout=180, interval=0.05, what=f"{n} watched checkpoint(s)")
    start = next(
        e for e in run_events(project) if e["kind"] == "attempt_start" and e["attempt"] == attempt
    )
    os.kill(start["pid"], signal.SIGKILL)
    return commits() or []


def _iters(log: Path) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^iter (\d+):", log.read_text(), re.M)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The SHA-256 of the weights after an uninterrupted run of the script, shared by the
    tests that resume it (``--hf`` changes only how it saves, not what it trains)."""
    out = tmp_path_factory.mktemp("reference") / "out"
    subprocess.run(
        [PYTHON, str(TRAIN), "--out_dir", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return (out / "weights.sha256").read_text()


def _nanogpt_spec(
    project: Project, *, command: list[str] | str | None = None, extra: str = ""
) -> Path:
    shutil.copy(TRAIN, project.root / "train.py")
    return project.spec(
        command=command or [PYTHON, "train.py", "--sleep", "0.03"],
        extra=f"""
        [checkpoint]
        watch = ["out/ckpt.pt"]
        resume_args = ["--init_from=resume"]
        settle = "0.3s"
        [progress]
        pattern = {json.dumps(PATTERN)}
        [limits]
        restart_backoff = "0s"
        {extra}
        """,
    )


@pytest.mark.slow
def test_killed_script_resumes_from_its_own_checkpoint(project: Project, reference: str) -> None:
    """(a) nanoGPT shape, SIGKILLed: attempt 2 starts from the captured ckpt.pt, bit-exact."""
    spec = _nanogpt_spec(project)
    proc = start(project, spec)
    _kill_after_commits(project, 1)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    rec = project.only_record()
    events = run_events(project)

    starts = {e["attempt"]: e for e in events if e["kind"] == "attempt_start"}
    assert starts[1]["restored"] is None
    assert "--init_from=resume" not in starts[1]["command"]  # a fresh run: no resume args
    assert starts[2]["command"][-1] == "--init_from=resume"
    assert starts[2]["restored"] == str(project.root / "out" / "ckpt.pt")
    resume_step = starts[2]["resume_step"]
    assert f"resuming after step {resume_step} from" in out

    # The script resumed from its own checkpoint, not from scratch.
    log2 = rec.attempt_dir(2) / "stdout.log"
    first = int(re.search(r"resuming from \S+ at iter (\d+)", log2.read_text()).group(1))  # type: ignore[union-attr]
    assert first > 0 and first % EVERY == 0
    assert _iters(log2)[0] == first
    # The capture's step is the newest step reported before the file was written: never
    # later than the state it holds (iter first-1), so lost work is never under-counted.
    assert first - 1 - EVERY < resume_step <= first - 1
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored and restored[0]["step"] == resume_step and restored[0]["source"] == "watched"

    # Lost work: the steps attempt 1 did after the checkpoint it resumed from.
    exit1 = json.loads((rec.attempt_dir(1) / "exit.json").read_text())
    last1 = _iters(rec.attempt_dir(1) / "stdout.log")[-1]
    work = exit1["work"]
    assert exit1["signal"] == "SIGKILL"
    assert work["checkpoint_after"] == resume_step
    assert work["last_step"] == last1
    assert work["steps_lost"] == last1 - resume_step
    assert work["seconds_lost"] > 0
    run = json.loads(rec.file("run.json").read_text())
    assert run["work"]["steps_lost"] == work["steps_lost"]
    assert run["verdict"] == "accepted"

    # Every commit of a watched checkpoint is marked as such, with no stall for the workload.
    commits = [e for e in events if e["kind"] == "checkpoint_commit"]
    assert commits and all(e["source"] == "watched" and e["stall_s"] == 0.0 for e in commits)
    assert all(e["bytes"] > 0 and e["capture_s"] >= 0 for e in commits)
    steps = [e["step"] for e in commits]
    assert steps == sorted(set(steps))  # a step number is never reused
    # At its resume point the script saves the checkpoint it just loaded again (nanoGPT
    # does): the same content under the same step is skipped, not stored twice.
    skipped = [e for e in events if e["kind"] == "checkpoint_capture_skipped"]
    assert [(e["attempt"], e["step"]) for e in skipped] == [(2, resume_step)]

    # Bit for bit the uninterrupted run.
    assert (project.root / "out" / "weights.sha256").read_text() == reference

    # ckpt ls / verify see the captured checkpoints as any other.
    ls = project.cli("ckpt", "ls", rec.run_id, check_rc=0)
    assert "*" in ls.stdout
    project.cli("ckpt", "verify", rec.run_id, check_rc=0)


SLOW_WRITER = """
    import json, os, sys, time

    run_dir = os.environ["ACCEPTRUN_RUN_DIR"]
    os.makedirs("out", exist_ok=True)

    def commits():
        path = os.path.join(run_dir, "events.jsonl")
        n = 0
        for line in open(path):
            if '"checkpoint_commit"' in line:
                n += 1
        return n

    def wait_commits(n):
        deadline = time.monotonic() + 120
        while commits() < n:
            if time.monotonic() > deadline:
                sys.exit("no capture within 120 s")
            time.sleep(0.05)

    def write(tag, pause):
        # In place, held open, in chunks with pauses longer than checkpoint.settle: sizes
        # and mtimes hold still while the file is still half-written.
        with open("out/state.bin", "wb") as f:
            for i in range(4):
                f.write(bytes([tag]) * 65536)
                f.flush()
                time.sleep(pause)

    write(1, 0.8)
    wait_commits(1)
    write(2, 0.8)          # rewritten in place: captured again, whole
    wait_commits(2)
    write(3, 0.0)          # written just before the exit: the final pass takes it
"""


@pytest.mark.slow
def test_slow_writer_is_never_captured_half_written(project: Project, tmp_path: Path) -> None:
    """(b) a file held open across pauses longer than settle is captured only whole."""
    mirror = tmp_path / "mirror"
    spec = project.spec(
        SLOW_WRITER,
        extra=f"""
        [checkpoint]
        watch = ["out/state.bin"]
        settle = "0.3s"
        keep_last = 5
        mirror = {json.dumps(str(mirror))}
        """,
    )
    proc = start(project, spec)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    rec = project.only_record()
    store = CheckpointStore(rec.checkpoints_dir)
    infos = store.list()
    contents = [(i.path / "files" / "out" / "state.bin").read_bytes() for i in infos]
    whole = {bytes([tag]) * 4 * 65536: tag for tag in (1, 2, 3)}
    assert [whole.get(c) for c in contents] == [1, 2, 3], [len(c) for c in contents]
    assert store.latest() is not None and store.latest().step == infos[-1].step  # type: ignore[union-attr]
    # No step was ever reported: the steps are the store's sequence, never reused.
    assert [i.step for i in infos] == [1, 2, 3]
    assert all(i.meta["source"] == "watched" for i in infos)
    # Mirrored as the client's checkpoints are.
    states = json.loads(rec.file("mirror.json").read_text())["steps"]
    assert sorted(int(s) for s in states) == [1, 2, 3]
    assert all(v["state"] == "ok" for v in states.values()), states
    for info in infos:
        assert (mirror / rec.run_id / f"step-{info.step}" / "MANIFEST.json").exists()


@pytest.mark.slow
def test_corrupt_newest_capture_is_quarantined_and_the_one_before_used(
    project: Project, reference: str
) -> None:
    """(c) `acceptrun resume` after a kill: the newest capture fails verification."""
    spec = _nanogpt_spec(project, extra="max_restarts = 0")
    proc = start(project, spec)
    _kill_after_commits(project, 2)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out  # killed, not restarted: rejected
    rec = project.only_record()
    store = CheckpointStore(rec.checkpoints_dir)
    infos = store.list()
    assert len(infos) >= 2
    newest, before = infos[-1], infos[-2]
    blob = newest.path / "files" / "out" / "ckpt.pt"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))

    resumed = project.cli("resume", rec.run_id, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = run_events(project)
    quarantined = [e for e in events if e["kind"] == "checkpoint_quarantine"]
    assert [e["step"] for e in quarantined] == [newest.step]
    start2 = next(e for e in events if e["kind"] == "attempt_start" and e["attempt"] == 2)
    assert start2["resume_step"] == before.step
    assert start2["command"][-1] == "--init_from=resume"
    log2 = (rec.attempt_dir(2) / "stdout.log").read_text()
    first = int(re.search(r"at iter (\d+)", log2).group(1))  # type: ignore[union-attr]
    assert before.step < first <= before.step + EVERY
    assert (project.root / "out" / "weights.sha256").read_text() == reference


@pytest.mark.slow
def test_hugging_face_directories_resume_with_the_restored_path(
    project: Project, reference: str
) -> None:
    """(d) ``out/checkpoint-*`` directories, a string command, --resume_from_checkpoint DIR."""
    shutil.copy(TRAIN, project.root / "train.py")
    spec = project.spec(
        command=f"{PYTHON} train.py --hf --sleep 0.03",
        extra="""
        [checkpoint]
        watch = ["out/checkpoint-*"]
        resume_args = ["--resume_from_checkpoint", "{checkpoint}"]
        settle = "0.3s"
        [limits]
        restart_backoff = "0s"
        """,
    )
    proc = start(project, spec)
    commits = _kill_after_commits(project, 1)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    rec = project.only_record()
    assert commits[0]["step"] % EVERY == 0  # the number in the directory's name
    events = run_events(project)
    start2 = next(e for e in events if e["kind"] == "attempt_start" and e["attempt"] == 2)
    step = start2["resume_step"]
    where = project.root / "out" / f"checkpoint-{step}"
    assert start2["restored"] == str(where)
    assert start2["command"][:2] == ["/bin/sh", "-c"]
    assert start2["command"][2].endswith(f"--resume_from_checkpoint {where}")
    log2 = (rec.attempt_dir(2) / "stdout.log").read_text()
    assert f"resuming from {where}/model.pt at iter {step}" in log2
    assert _iters(rec.attempt_dir(2) / "stdout.log")[0] == step
    info = CheckpointStore(rec.checkpoints_dir).latest()  # step is gone: keep_last = 2
    assert info is not None
    assert sorted(info.files) == [
        f"files/out/checkpoint-{info.step}/model.pt",
        f"files/out/checkpoint-{info.step}/trainer_state.json",
    ]
    assert (project.root / "out" / "weights.sha256").read_text() == reference


def test_resume_args_after_a_pipeline_are_refused_before_launch(project: Project) -> None:
    spec = project.spec(
        "print('hi')\n",
        command=f"{PYTHON} work.py | tee log.txt",
        extra="""
        [checkpoint]
        watch = ["out/ckpt.pt"]
        resume_args = ["--init_from=resume"]
        """,
    )
    proc = project.cli("run", str(spec), check_rc=2)
    assert "checkpoint.resume_args" in proc.stderr + proc.stdout
    assert not project.run_ids()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "captured"),
    [pytest.param(0, True, id="exit-0"), pytest.param(1, False, id="crash")],
)
def test_checkpoint_written_just_before_the_exit(
    project: Project, status: int, captured: bool
) -> None:
    """The final pass takes a file written just before a clean exit, never after a crash.

    ``settle`` is far longer than the script lives, so only the final pass can see it.
    """
    spec = project.spec(
        f"""
        import os, sys
        os.makedirs("out", exist_ok=True)
        with open("out/ckpt.pt", "wb") as f:
            f.write(b"x" * 4096)
        sys.exit({status})
        """,
        extra="""
        [checkpoint]
        watch = ["out/ckpt.pt"]
        settle = "1h"
        [limits]
        max_restarts = 0
        """,
    )
    project.cli("run", "-q", str(spec), timeout=120, check_rc=0 if captured else 1)
    rec = project.only_record()
    infos = CheckpointStore(rec.checkpoints_dir).list()
    events = run_events(project)
    missed = [e for e in events if e["kind"] == "checkpoint_not_captured"]
    if captured:
        assert [i.step for i in infos] == [1] and not missed
        assert (infos[0].path / "files" / "out" / "ckpt.pt").read_bytes() == b"x" * 4096
    else:
        assert infos == []
        assert [Path(e["source_path"]).name for e in missed] == ["ckpt.pt"]
        assert "status 1" in missed[0]["reason"]
