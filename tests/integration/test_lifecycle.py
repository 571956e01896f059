"""stop, kill, resume and logs on real supervisors, workloads and signals.

One training run is stopped mid-way, then resumed three ways: in place, from a copy of
its record in another workspace ("another machine"), and from its mirror after the
copy's checkpoints were deleted. A second run ignores SIGTERM and is killed. Bad input
uses small records made on the spot, and a real ``sleep`` stands in for a reused pid.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.cli.main import main
from acceptrun.record.workspace import RunRecord, Workspace, user_at_host
from conftest import wait_for

TRAIN = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    from torch import nn
    import acceptrun

    torch.manual_seed(0)
    total = int(os.environ.get("TOTAL", "40"))
    pause = float(os.environ.get("STEP_S", "0"))
    hold = int(os.environ.get("HOLD_AT", "-1"))  # attempt 1 waits there for a stop request
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = acceptrun.init()
    if os.environ.get("IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    start = run.restore(model=model, optimizer=opt)
    print(f"attempt {run.attempt} starts at step {start}")
    print(f"attempt {run.attempt} on stderr", file=sys.stderr)
    for step in run.steps(start, total):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(step, loss=loss.item())
        print(f"step {step}")
        run.maybe_checkpoint(step)
        while step == hold and run.attempt == 1 and not run.stop_requested:
            time.sleep(0.01)
        time.sleep(pause)
    run.metric("final/loss", loss.item())
    """
)


def make_job(tmp_path: Path, *, mirror: Path | None = None, grace: str = "300s") -> Path:
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    mirror_line = f"mirror = {json.dumps(str(mirror))}\n" if mirror else ""
    (job / "spec.toml").write_text(
        f'name = "lc"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
        f"[checkpoint]\nevery_steps = 4\nkeep_last = 2\n{mirror_line}"
        # A user's resume is attempt 2; the restarts check counts it (see the report).
        f'[limits]\nmax_restarts = 1\nrestart_backoff = 0\ngrace_period = "{grace}"\n'
    )
    return job


def steps(record: RunRecord, attempt: int | None = None) -> list[int]:
    return [e["step"] for e in record.events("step") if attempt in (None, e.get("attempt"))]


def audits(record: RunRecord) -> list[dict[str, Any]]:
    """Audit events after the run's start (every run begins with its own "run" audit)."""
    found = list(record.events("audit"))
    assert not found or found[0]["action"] == "run"
    return found[1:]


def cli(capsys: pytest.CaptureFixture[str], ws: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--workspace", str(ws), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., tuple[RunRecord, subprocess.Popen[str]]]]:
    """Start ``acceptrun run`` as a real process; wait until its workload logged steps."""
    procs: list[subprocess.Popen[str]] = []

    def start(job: Path, ws: Path, min_steps: int = 6, **env: str) -> tuple[RunRecord, Any]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
            cwd=job, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        procs.append(proc)

        def ready() -> RunRecord | None:
            found = list((ws / "runs").glob("*/events.jsonl")) if (ws / "runs").is_dir() else []
            record = RunRecord(found[0].parent) if found else None
            return record if record and len(steps(record)) >= min_steps else None

        return wait_for(ready, what=f"{min_steps} steps"), proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# ---- stop, then resume three ways ----------------------------------------------------------


def test_stop_then_resume_here_elsewhere_and_from_mirror(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], started: Any
) -> None:
    mirror = tmp_path / "mirror"
    job = make_job(tmp_path, mirror=mirror)
    ws = tmp_path / "ws"
    # Attempt 1 waits at step 10 for the stop: it lands before the last step, however slow
    # the machine is to deliver it.
    record, proc = started(job, ws, TOTAL="40", STEP_S="0.1", HOLD_AT="10")

    code, out, err = cli(capsys, ws, "stop", record.run_id, "--wait", "--reason", "bad lr")

    assert code == 0, err
    assert f"stop sent to run {record.run_id}" in err
    assert "REJECTED" in out  # a stopped run is not accepted
    assert proc.wait(timeout=120) == 1
    exit1 = record.read_json("attempts/1/exit.json")
    assert (
        exit1["outcome"] == "stopped" and f"acceptrun stop by {user_at_host()}" in exit1["reason"]
    )
    last = max(steps(record, 1))
    (stopped,) = record.events("stopped")
    assert stopped["checkpoint"] == last  # the step in flight finished and was saved
    assert CheckpointStore(record.checkpoints_dir).latest().step == last  # type: ignore[union-attr]
    assert last < 39
    (stop_audit,) = audits(record)
    assert stop_audit["action"] == "stop" and stop_audit["by"] == user_at_host()
    assert stop_audit["reason"] == "bad lr"
    (sent,) = record.events("stop_sent")
    assert stop_audit["t"] <= sent["t"]  # audited before the signal
    assert record.state["status"] == "finished" and record.state["verdict"] == "rejected"
    assert not record.exists("control.json") or record.read_json("control.json")["action"] == "stop"
    mirrored = json.loads((record.path / "mirror.json").read_text())["steps"]
    assert mirrored[str(last)]["state"] == "ok"

    # Two copies of the stopped record, as if carried to other machines.
    copies = {}
    for name in ("elsewhere", "mirrored"):
        dest = tmp_path / name / "runs" / record.run_id
        shutil.copytree(record.path, dest)
        copies[name] = RunRecord(dest)
    shutil.rmtree(copies["mirrored"].checkpoints_dir)

    # From the mirror: given its base URL, the run's own root below it is found.
    code, out, err = cli(
        capsys, tmp_path / "mirrored", "resume", record.run_id, "-q", "--mirror", str(mirror)
    )
    assert code == 0, (out, err)
    assert "ACCEPTED" in out and "no local checkpoint verifies" in err
    _assert_resumed(copies["mirrored"], last)
    (fetched,) = copies["mirrored"].events("mirror_fetch")
    assert fetched["step"] == last

    code, out, err = cli(capsys, tmp_path / "elsewhere", "resume", record.run_id, "-q")
    assert code == 0, (out, err)
    _assert_resumed(copies["elsewhere"], last)

    # In place, as a real process, followed by `logs -f` until it closes the run.
    resume = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "resume", "-q", record.run_id],
        env={**os.environ, "STEP_S": "0.02"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: record.state["status"] == "running", what="resume to claim the run")
        code, out, _ = cli(capsys, ws, "logs", "-f", record.run_id)
        assert code == 0
        assert record.state["status"] == "finished"  # -f ended because the run closed
        assert resume.wait(timeout=120) == 0, resume.communicate()
    finally:
        if resume.poll() is None:
            resume.kill()
        resume.communicate()
    assert "[attempt 1] attempt 1 starts at step 0" in out
    assert f"[attempt 2] attempt 2 starts at step {last + 1}" in out
    assert "[attempt 2] step 39" in out and "[attempt 1] attempt 1 on stderr" in out
    _assert_resumed(record, last)
    assert [a["action"] for a in audits(record)] == ["stop", "resume"]

    code, out, _ = cli(capsys, ws, "logs", record.run_id)
    assert "[attempt 1] step 0\n" in out and "[attempt 2] step 39\n" in out
    code, out, _ = cli(capsys, ws, "logs", record.run_id, "--attempt", "2", "--stderr-only")
    assert out == "attempt 2 on stderr\n"

    # Finished ACCEPTED: nothing left to resume.
    code, _, err = cli(capsys, ws, "resume", record.run_id)
    assert code == 2
    assert "finished ACCEPTED: nothing to resume; pass --force" in err


def _assert_resumed(record: RunRecord, last: int) -> None:
    starts = list(record.events("attempt_start"))
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[1]["resume_step"] == last
    assert steps(record, 2) == list(range(last + 1, 40))  # steps continue where they stopped
    assert sorted(steps(record)) == list(range(40))
    assert record.state["status"] == "finished" and record.state["verdict"] == "accepted"
    assert record.read_json("verdict.json")["accepted"] is True
    (resumed,) = [a for a in audits(record) if a["action"] == "resume"]
    assert resumed["from_step"] == last and resumed["attempt"] == 2


# ---- kill ---------------------------------------------------------------------------------


def test_kill_ignores_the_grace_period(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], started: Any
) -> None:
    job = make_job(tmp_path, grace="600s")
    ws = tmp_path / "ws"
    record, proc = started(job, ws, min_steps=3, TOTAL="100000", STEP_S="0.02", IGNORE_TERM="1")

    code, _, err = cli(capsys, ws, "resume", record.run_id)
    assert code == 2
    assert f"run {record.run_id} is running (supervisor pid {proc.pid}); stop it first" in err

    t0 = time.monotonic()
    code, out, err = cli(capsys, ws, "kill", record.run_id, "--wait")
    assert code == 0, err
    assert time.monotonic() - t0 < 300  # far below the 600 s grace period it did not wait
    assert "REJECTED" in out
    (sent,) = record.events("kill_sent")
    assert sent["after_s"] < 60  # at the request: nowhere near the 600 s grace period
    exit1 = record.read_json("attempts/1/exit.json")
    assert "acceptrun kill by" in exit1["reason"]
    (kill,) = audits(record)
    assert kill["action"] == "kill" and kill["by"] == user_at_host()
    assert list(record.events("attempt_start")) and not list(record.events("restart"))
    assert proc.wait(timeout=120) == 1

    code, _, err = cli(capsys, ws, "stop", record.run_id)
    assert code == 2
    assert f"run {record.run_id} is not running: it finished" in err
    assert "REJECTED; nothing to stop" in err


# ---- bad input ----------------------------------------------------------------------------


def fake_run(ws: Path, tmp_path: Path, **state: Any) -> RunRecord:
    """A record whose frozen spec runs `python -c pass`, with the given run.json fields."""
    spec = f'name = "fake"\ncommand = [{json.dumps(sys.executable)}, "-c", "pass"]\n'
    spec += f"workdir = {json.dumps(str(tmp_path))}\n"
    return Workspace.create(ws).create_run("fake", spec_text=spec, state=state)


def test_bad_input_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = tmp_path / "ws"
    finished = fake_run(ws, tmp_path, status="finished", verdict="rejected")

    code, _, err = cli(capsys, ws, "stop", "nope")
    assert code == 2
    assert "no run 'nope'" in err and "`acceptrun ls`" in err and finished.run_id in err

    code, _, err = cli(capsys, ws, "resume", finished.run_id)
    assert code == 2
    assert "has no checkpoint that verifies" in err and "--from-scratch" in err
    code, _, err = cli(capsys, ws, "resume", finished.run_id, "--from-mirror")
    assert code == 2 and "has no checkpoint.mirror; name the mirror with --mirror URL" in err
    with open(finished.file(".resume.lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another resume of this record is in progress
        code, _, err = cli(capsys, ws, "resume", finished.run_id, "--from-scratch")
    assert code == 2 and "is being resumed by another process right now" in err
    # --from-scratch runs it again (rejected: a fake record has no provenance).
    code, out, _ = cli(capsys, ws, "resume", finished.run_id, "--from-scratch", "-q")
    assert code == 1 and "REJECTED" in out
    assert finished.read_json("attempts/1/exit.json")["outcome"] == "success"

    remote = fake_run(ws, tmp_path, status="running", supervisor="ann@gpu-17", supervisor_pid=1)
    code, _, err = cli(capsys, ws, "kill", remote.run_id)
    assert code == 2
    assert "supervised on host gpu-17 (ann@gpu-17)" in err
    assert f"run `acceptrun kill {remote.run_id}` on gpu-17" in err
    code, _, err = cli(capsys, ws, "resume", remote.run_id)
    assert code == 2 and "If that machine is gone" in err and "--force" in err

    early = fake_run(ws, tmp_path, status="preflight")
    code, _, err = cli(capsys, ws, "stop", early.run_id)
    assert code == 2 and "has not recorded its supervisor's pid yet" in err

    failed = fake_run(ws, tmp_path, status="failed_preflight", verdict="rejected")
    code, _, err = cli(capsys, ws, "resume", failed.run_id)
    assert code == 2 and "failed preflight and never launched: nothing to resume" in err

    code, _, err = cli(capsys, ws, "logs", finished.run_id, "--attempt", "7")
    assert code == 2 and "has no attempt 7; its attempts: 1" in err


def test_a_reused_pid_is_never_signalled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = tmp_path / "ws"
    record = fake_run(ws, tmp_path, status="running", supervisor=user_at_host())
    sleep = subprocess.Popen(["sleep", "30"])
    # An acceptrun process, but started after the supervisor last wrote run.json.
    newer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "acceptrun", "run"]
    )
    try:
        record.update_state(supervisor_pid=sleep.pid)
        code, _, err = cli(capsys, ws, "stop", record.run_id)
        assert code == 2
        assert f"pid {sleep.pid} is now another program (sleep 30), not acceptrun" in err
        assert "nothing was signalled" in err and f"acceptrun resume {record.run_id}" in err

        record.update_state(supervisor_pid=newer.pid)
        hour_ago = time.time() - 3600
        os.utime(record.file("run.json"), (hour_ago, hour_ago))
        code, _, err = cli(capsys, ws, "kill", record.run_id)
        assert code == 2 and "is a newer acceptrun process" in err

        time.sleep(0.2)
        assert sleep.poll() is None and newer.poll() is None  # both survived
        assert not audits(record) and not record.exists("control.json")
    finally:
        for p in (sleep, newer):
            p.send_signal(signal.SIGKILL)
            p.wait()
