"""A graceful stop reaches every rank of a loop that is not ``run.steps()``, under torchrun.

Two real gloo ranks on CPU under ``acceptrun run`` (``resources.processes = 2``): a plain
loop that polls ``run.should_stop(step)`` after ``run.handle_stops()``
(framework_stop_plain.py), and an Accelerate loop through ``track(accelerator)``
(framework_stop_accelerate.py). Each is run once uninterrupted, and once held at step
``HOLD`` until ``acceptrun stop`` has reached rank 0 (a gate file, so the stop lands at
the same step however fast the machine is), then resumed with ``acceptrun resume``
(the uninterrupted run runs meanwhile):
both ranks must write ``stopped`` at the agreed step, exit 143, leave the checkpoint of
that step, and the resumed run must end ACCEPTED with weights bitwise equal to the
uninterrupted run's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import acceptrun_cmd, acceptrun_in, clean_env, only_record_in, step_losses, wait_for

HERE = Path(__file__).resolve().parent
HOLD = 6  # the step after which attempt 1 waits for the stop (between saves: every 4)
TOTAL = 12
SPEC = """\
name = "{name}"
command = [{python}, "{script}"]
env = {{ TOTAL = "{total}", HOLD_AT = "{hold}"{env} }}
[resources]
processes = 2
[checkpoint]
every_steps = 4
keep_last = 3
[limits]
max_restarts = 0
grace_period = "300s"
"""


def make_job(root: Path, script: str, *, hold: int, env: str = "") -> Path:
    """A directory holding the worker and a spec that runs it on 2 ranks (``env``: more TOML)."""
    root.mkdir(parents=True)
    shutil.copy(HERE / script, root / script)
    (root / "spec.toml").write_text(
        SPEC.format(
            name=Path(script).stem.replace("_", "-"), python=json.dumps(sys.executable),
            script=script, total=TOTAL, hold=hold, env=env,
        )
    )  # fmt: skip
    return root


def reference_and_stopped(root: Path, script: str) -> tuple[dict[str, Any], Path, RunRecord]:
    """The uninterrupted run, started first and run while the other one is held and resumed.

    Returns the reference's final weights hash and losses, and the stopped run's job and record.
    """
    ref_job = make_job(root / "ref", script, hold=-1)
    ref = subprocess.Popen(
        acceptrun_cmd(ref_job, "run", "-q", "spec.toml"), cwd=ref_job, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        job, record = stopped_and_resumed(root / "stop", script)
        out, err = ref.communicate(timeout=600)
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()
    assert ref.returncode == 0, out + err
    reference = {
        "hash": (ref_job / "weights.sha256").read_text(),
        "losses": step_losses(only_record_in(ref_job / "ws")),
    }
    return reference, job, record


def stopped_and_resumed(root: Path, script: str) -> tuple[Path, RunRecord]:
    """Attempt 1 held after step HOLD; `acceptrun stop`; the gate opens; then resume."""
    job = make_job(root, script, hold=HOLD)
    run = subprocess.Popen(
        acceptrun_cmd(job, "run", "-q", "spec.toml"), cwd=job, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def held() -> bool:
            assert run.poll() is None, run.communicate()  # still running while we wait
            return (job / "held-0").exists() and (job / "held-1").exists()

        wait_for(held, timeout=300, what=f"both ranks held after step {HOLD}")
        record = only_record_in(job / "ws")
        stop = subprocess.Popen(acceptrun_cmd(job, "stop", record.run_id), cwd=job, env=clean_env())
        # Rank 0's handler records the request: from here its next boundary decides a stop.
        wait_for(lambda: list(record.events("stop_requested")), 120, what="stop_requested")
        (job / "gate").write_text("")
        run.communicate(timeout=300)
        assert stop.wait(timeout=120) == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    resumed = acceptrun_in(job, "resume", "-q", record.run_id, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return job, record


def assert_stopped_at_hold_then_bitwise(job: Path, record: RunRecord, ref: dict[str, Any]) -> None:
    stopped = [e for e in record.events("stopped") if e["attempt"] == 1]
    assert sorted(e["rank"] for e in stopped) == [0, 1], stopped
    assert {(e["step"], e["checkpoint"]) for e in stopped} == {(HOLD, HOLD)}
    # Both ranks left through SystemExit(143), the status of a graceful stop.
    assert [(job / f"exit-{r}-a1").read_text() for r in (0, 1)] == ["143", "143"]
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["outcome"] == "stopped" and exit1["class"] == "stopped", exit1
    assert list(record.events("kill_sent")) == []  # within the grace period: no rank killed
    assert max(e["step"] for e in record.events("step") if e["attempt"] == 1) == HOLD
    store = CheckpointStore(record.checkpoints_dir)
    info = store.get(HOLD)
    assert info is not None and store.verify(HOLD).ok
    assert [r["step"] for r in record.events("restored")] == [HOLD]
    assert record.read_json("verdict.json")["verdict"] == "accepted"
    assert (job / "weights.sha256").read_text() == ref["hash"]
    again = step_losses(record, attempt=2)
    assert again == {s: ref["losses"][s] for s in range(HOLD + 1, TOTAL)}


@pytest.mark.slow
def test_plain_loop_should_stop_reaches_both_ranks(tmp_path: Path) -> None:
    ref, job, record = reference_and_stopped(tmp_path, "framework_stop_plain.py")
    assert_stopped_at_hold_then_bitwise(job, record, ref)
    # run.checkpoint() of 2 ranks: both ranks' own state in the stop's checkpoint
    info = CheckpointStore(record.checkpoints_dir).get(HOLD)
    assert info is not None and {"rank-0/state.json", "rank-1/state.json"} <= set(info.files)


@pytest.mark.slow
def test_accelerate_stop_reaches_both_ranks(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="the accelerate extra is not installed")
    ref, job, record = reference_and_stopped(tmp_path, "framework_stop_accelerate.py")
    assert_stopped_at_hold_then_bitwise(job, record, ref)
    # The stop fell between the script's saves: save_state into stopped-step-6, which
    # holds both ranks' RNG states (each rank wrote its own before rank 0 captured).
    info = CheckpointStore(record.checkpoints_dir).get(HOLD)
    assert info is not None and info.meta["framework"] == "accelerate"
    assert {f"files/stopped-step-{HOLD}/random_states_{r}.pkl" for r in (0, 1)} <= set(info.files)


@pytest.mark.slow
def test_ranks_that_decide_at_different_steps_fail_together(tmp_path: Path) -> None:
    """Rank 1 passes step + 1: both ranks raise at the first boundary instead of waiting."""
    job = make_job(tmp_path / "miscount", "framework_stop_plain.py", hold=-1,
                   env=', MISCOUNT_RANK = "1"')  # fmt: skip
    proc = acceptrun_in(job, "run", "-q", "spec.toml", timeout=600)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["outcome"] == "failed", exit1
    assert list(record.events("kill_sent")) == []  # the ranks ended by themselves
    assert max(e["step"] for e in record.events("step")) == 0  # at the first boundary
    log = (record.path / "attempts/1/stderr.log").read_text()
    said = "the ranks disagree on where they decide a stop (the ranks called run.should_stop() with steps from 0 to 1"
    assert f"{said}; rank 0 was in run.should_stop(0))" in log, log[-3000:]
    assert f"{said}; rank 1 was in run.should_stop(1))" in log
