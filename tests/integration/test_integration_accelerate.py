"""A plain Accelerate loop with ``track(accelerator)``, under a real `acceptrun run`.

A small MLP with dropout on a shuffled DataLoader (10 batches an epoch), AdamW and a
step scheduler. The same job runs uninterrupted, stopped gracefully and resumed, and
killed by an injected fault mid-epoch with its newest checkpoint corrupted: each resumed
run must end bitwise equal to the uninterrupted one. A last test shows what acceptrun
restores that Accelerate alone does not: ``load_state`` + ``skip_first_batches`` in the
middle of an epoch redraws that epoch's order and ends with other weights.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import acceptrun_in, clean_env, job_folder, only_record_in, step_losses, wait_for

# find_spec, not importorskip: collecting this file must not import accelerate (and torch).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed"
)

SETUP = """
import hashlib, os, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed

total = int(os.environ.get("TOTAL", "30"))
torch.set_num_threads(1)
set_seed(0)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(80, 8, generator=g), torch.randn(80, 1, generator=g))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)
accelerator = Accelerator(cpu=True)
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)


def digest():
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
"""
WORKLOAD = SETUP + textwrap.dedent(
    """
    from acceptrun.integrations.accelerate import track

    tracker = track(accelerator)
    for step, (x, y) in tracker.steps(loader, total):
        if str(step) == os.environ.get("HOLD_AT") and os.environ["ACCEPTRUN_ATTEMPT"] == "1":
            deadline = time.monotonic() + 600  # held until the test's stop has landed
            while not tracker.fr.stop_requested and time.monotonic() < deadline:
                time.sleep(0.05)
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step(); sched.step(); opt.zero_grad()
        tracker.log(step, loss=loss.item(), samples=len(x))
        if (step + 1) % 4 == 0:
            accelerator.save_state(f"ckpt/step_{step}")
            n = os.environ.get("CORRUPT_AT")
            if str(step) == n and os.environ["ACCEPTRUN_ATTEMPT"] == "1":
                f = Path(os.environ["ACCEPTRUN_CHECKPOINT_DIR"], f"step-{n}/files/step_{n}/model.safetensors")
                b = bytearray(f.read_bytes()); b[-1] ^= 1; f.write_bytes(bytes(b))
        if str(step) == os.environ.get("BREAK_AFTER"):
            break  # the loop's own end, as the examples' `if completed_steps >= max: break`
    Path("weights.sha256").write_text(digest())
    """
)
# Accelerate alone: `run STEP...` trains uninterrupted, with a save_state after each STEP
# (plain_ckpt_STEP); `resume STEP` loads plain_ckpt_STEP in a new process and trains on.
PLAIN = SETUP + textwrap.dedent(
    """
    resume = sys.argv[1] == "resume"
    saves = set() if resume else {int(a) for a in sys.argv[2:]}
    step = 0
    if resume:
        accelerator.load_state(f"plain_ckpt_{sys.argv[2]}")
        step = int(sys.argv[2]) + 1
    offset = step % len(loader)
    while step < total:
        batches = accelerator.skip_first_batches(loader, offset) if offset else loader
        offset = 0
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step(); sched.step(); opt.zero_grad()
            if step in saves:
                accelerator.save_state(f"plain_ckpt_{step}")
            step += 1
            if step >= total:
                break
    print(digest())
    """
)
SPEC = """\
name = "acc"
command = [{python}, "train.py"]
[checkpoint]
keep_last = 2
[limits]
max_restarts = 1
restart_backoff = 0
grace_period = "300s"
"""


def make_job(root: Path) -> Path:
    return job_folder(root, WORKLOAD, SPEC.format(python=json.dumps(sys.executable)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    job = make_job(tmp_path_factory.mktemp("acc") / "ref")
    proc = acceptrun_in(job, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    return {
        "hash": (job / "weights.sha256").read_text(),
        "losses": step_losses(record),
        "rec": record,
    }


@pytest.mark.slow
def test_uninterrupted_run_records_steps_and_captures_each_save(
    reference: dict[str, Any],
) -> None:
    record: RunRecord = reference["rec"]
    assert record.read_json("verdict.json")["verdict"] == "accepted"
    steps = list(record.events("step"))
    assert [e["step"] for e in steps] == list(range(30))
    assert all(e["total_steps"] == 30 and e["samples"] == 8 and e["loss"] > 0 for e in steps)
    assert all(e["step_time"] >= e["data_wait"] >= 0 for e in steps)
    assert [e["step"] for e in record.events("checkpoint_commit")] == [3, 7, 11, 15, 19, 23, 27]
    store = CheckpointStore(record.checkpoints_dir)
    assert [i.step for i in store.list()] == [23, 27]  # keep_last = 2
    info = store.get(27)
    assert info is not None and store.verify(27).ok
    assert info.meta["framework"] == "accelerate" and info.meta["epoch"] == 2
    assert "files/step_27/custom_checkpoint_0.pkl" in info.files  # the loop's own state


@pytest.mark.slow
def test_a_break_out_of_steps_keeps_the_last_steps_event(tmp_path: Path) -> None:
    """The loop's own `break` after step 21's work: its event is written (22 steps logged)."""
    job = make_job(tmp_path / "break")
    proc = acceptrun_in(job, "run", "-q", "spec.toml", env={"BREAK_AFTER": "21"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    assert [e["step"] for e in record.events("step")] == list(range(22))
    work = record.read_json("attempts/1/exit.json")["work"]
    assert (work["first_step"], work["last_step"], work["steps_done"]) == (0, 21, 22)


@pytest.mark.slow
def test_graceful_stop_then_resume_bitwise(tmp_path: Path, reference: dict[str, Any]) -> None:
    job = make_job(tmp_path / "stopped")
    ws = job / "ws"
    run = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=job, env=clean_env(HOLD_AT="6"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def committed() -> bool:
        assert run.poll() is None, run.communicate()  # still running while we wait
        return bool(list(ws.glob("runs/*/checkpoints/step-3/MANIFEST.json")))

    wait_for(committed, timeout=240, what="the checkpoint of step 3")
    record = only_record_in(job / "ws")
    assert acceptrun_in(job, "stop", record.run_id, "--wait").returncode == 0
    run.communicate(timeout=300)
    (stopped,) = record.events("stopped")
    last = max(e["step"] for e in record.events("step"))
    assert stopped["step"] == stopped["checkpoint"] == last < 29
    assert record.read_json("attempts/1/exit.json")["returncode"] == 143
    if (last + 1) % 4:  # the stop fell between the script's saves: acceptrun saved it
        assert (job / "ckpt" / f"stopped-step-{last}").is_dir()
    resumed = acceptrun_in(job, "resume", "-q", record.run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["step"] for r in record.events("restored")] == [last]
    assert (job / "weights.sha256").read_text() == reference["hash"]
    assert step_losses(record, attempt=2) == {
        s: reference["losses"][s] for s in range(last + 1, 30)
    }


@pytest.mark.slow
def test_killed_mid_epoch_past_a_corrupted_checkpoint_resumes_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Attempt 1 flips a byte of the stored step 11, then dies at kill@step=13: attempt 2
    quarantines step 11, restores step 7 (epoch 0, 8 batches in) and runs steps 8.. in order.
    """
    job = make_job(tmp_path / "corrupt")
    proc = acceptrun_in(
        job, "run", "-q", "--inject", "kill@step=13", "spec.toml", env={"CORRUPT_AT": "11"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    (fault,) = record.events("fault_injected")
    assert fault["step"] == 13 and fault["action"] == "kill"
    (q,) = record.events("checkpoint_quarantine")
    assert q["step"] == 11 and "failed verification" in q["reason"]
    assert [a["resume_step"] for a in record.events("attempt_start")] == [None, 7]
    assert [r["step"] for r in record.events("restored")] == [7]
    assert (job / "weights.sha256").read_text() == reference["hash"]
    again = step_losses(record, attempt=2)
    assert again == {s: reference["losses"][s] for s in range(8, 30)}


@pytest.mark.slow
def test_accelerate_alone_is_not_exact_mid_epoch(tmp_path: Path, reference: dict[str, Any]) -> None:
    """Why steps() keeps each epoch's starting RNG: without it the resumed epoch reshuffles.

    Stopping after step 12 (epoch 1, 3 batches in) and resuming with load_state and
    skip_first_batches ends with other weights; stopping at an epoch's end (step 19) does not.
    """
    (tmp_path / "plain.py").write_text(PLAIN)

    def plain(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "plain.py", *args], cwd=tmp_path, env=clean_env(),
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        return proc.stdout.strip()

    # The same training as under acceptrun (a save_state changes no weight or RNG), saving
    # the state after steps 12 and 19 on the way.
    assert plain("run", "12", "19") == reference["hash"]
    assert plain("resume", "12") != reference["hash"]
    assert plain("resume", "19") == reference["hash"]
