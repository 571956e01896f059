"""An example's Accelerate loop with ``track`` in three added lines, under `acceptrun run`.

The script is shaped as the Hugging Face transformers repository's
``examples/pytorch/language-modeling/run_clm_no_trainer.py`` (an example that uses
Accelerate) writes its loop: arguments ``--output_dir``, ``--checkpointing_steps``,
``--max_train_steps`` and ``--resume_from_checkpoint``; an epoch loop around the prepared
DataLoader, ``skip_first_batches`` on resume, ``completed_steps`` counted by the script,
``save_state(f"step_{completed_steps}")``, an evaluation loader after each epoch, and the
script's own ``break`` at ``max_train_steps``. The script's own resume code reads the step
from the directory's name. The truth each test checks against is what the script prints
(``completed N loss L``) and the weights of an uninterrupted run.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import acceptrun_in, clean_env, job_folder, only_record_in, step_losses

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed"
)

# 10 batches an epoch, 3 epochs, a break at step 25 (mid-epoch 2), saves every 4 steps.
UPSTREAM = """\
import argparse, hashlib, math, os
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", default="out")
parser.add_argument("--checkpointing_steps", default="4")
parser.add_argument("--max_train_steps", type=int, default=25)
parser.add_argument("--num_train_epochs", type=int, default=3)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--resume_from_checkpoint", default=None)
args = parser.parse_args()

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
torch.set_num_threads(1)
set_seed(0)
g = torch.Generator().manual_seed(1)
train = TensorDataset(torch.randn(80, 8, generator=g), torch.randn(80, 1, generator=g))
held_out = TensorDataset(torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g))
train_dataloader = DataLoader(train, batch_size=8, shuffle=True)
eval_dataloader = DataLoader(held_out, batch_size=8)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.8)
model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
)
checkpointing_steps = args.checkpointing_steps
if checkpointing_steps is not None and checkpointing_steps.isdigit():
    checkpointing_steps = int(checkpointing_steps)
completed_steps = 0
starting_epoch = 0
resume_step = None

# Potentially load in the weights and states from a previous save
if args.resume_from_checkpoint:
    checkpoint_path = args.resume_from_checkpoint
    path = os.path.basename(args.resume_from_checkpoint)
    accelerator.print(f"Resumed from checkpoint: {checkpoint_path}")
    accelerator.load_state(checkpoint_path)
    training_difference = os.path.splitext(path)[0]
    if "epoch" in training_difference:
        starting_epoch = int(training_difference.replace("epoch_", "")) + 1
        resume_step = None
        completed_steps = starting_epoch * len(train_dataloader)
    else:
        resume_step = int(training_difference.replace("step_", "")) * args.gradient_accumulation_steps
        starting_epoch = resume_step // len(train_dataloader)
        completed_steps = resume_step // args.gradient_accumulation_steps
        resume_step -= starting_epoch * len(train_dataloader)

for epoch in range(starting_epoch, args.num_train_epochs):
    model.train()
    if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
        active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
    else:
        active_dataloader = train_dataloader
    for step, batch in enumerate(active_dataloader):
        with accelerator.accumulate(model):
            x, y = batch
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            completed_steps += 1
            print(f"completed {completed_steps} loss {loss.item():.9g}", flush=True)
        if isinstance(checkpointing_steps, int):
            if completed_steps % checkpointing_steps == 0 and accelerator.sync_gradients:
                output_dir = f"step_{completed_steps}"
                if args.output_dir is not None:
                    output_dir = os.path.join(args.output_dir, output_dir)
                accelerator.save_state(output_dir)
        if completed_steps >= args.max_train_steps:
            break
    model.eval()
    losses = []
    for step, batch in enumerate(eval_dataloader):
        with torch.no_grad():
            x, y = batch
            losses.append(nn.functional.mse_loss(model(x), y))
    print(f"epoch {epoch} eval_loss {torch.stack(losses).mean().item():.9g}", flush=True)

digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
Path("weights.sha256").write_text(digest.hexdigest())
"""
# The three lines a user adds: the import, track after prepare, and the checkpoint that
# acceptrun restored handed to the script's own resume code.
TRACKED = UPSTREAM.replace(
    "from accelerate.utils import set_seed\n",
    "from accelerate.utils import set_seed\nfrom acceptrun.integrations.accelerate import track\n",
).replace(
    "resume_step = None\n\n",
    "resume_step = None\n"
    "tracker = track(accelerator, total_steps=args.max_train_steps)\n"
    "args.resume_from_checkpoint = tracker.resume_path or args.resume_from_checkpoint\n\n",
)
SPEC = """\
name = "acc-upstream"
command = [{python}, "train.py", "--output_dir", "out"]
[checkpoint]
keep_last = 2
[limits]
max_restarts = 1
restart_backoff = 0
grace_period = "300s"
"""
TOTAL = 25


def changed_lines(a: str, b: str) -> int:
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
    return sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))


def make_job(root: Path) -> Path:
    return job_folder(root, TRACKED, SPEC.format(python=json.dumps(sys.executable)))


def printed_losses(record: RunRecord, attempt: int) -> dict[int, float]:
    """What the script itself printed: completed_steps and that step's loss."""
    out = record.file(f"attempts/{attempt}/stdout.log").read_text()
    pairs = (line.split() for line in out.splitlines() if line.startswith("completed "))
    return {int(p[1]): float(p[3]) for p in pairs}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("upstream")
    job = make_job(root / "ref")
    proc = acceptrun_in(job, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plain = root / "plain"
    plain.mkdir()
    (plain / "train.py").write_text(UPSTREAM)
    alone = subprocess.run(
        [sys.executable, "train.py"], cwd=plain, env=clean_env(), capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    record = only_record_in(job / "ws")
    return {
        "hash": (job / "weights.sha256").read_text(),
        "plain_hash": (plain / "weights.sha256").read_text(),
        "losses": printed_losses(record, 1),
        "rec": record,
    }


def test_three_added_lines_and_nothing_else_changes(reference: dict[str, Any]) -> None:
    assert changed_lines(UPSTREAM, TRACKED) == 3
    # Tracking changes nothing the script computes: the same weights as Accelerate alone.
    assert reference["hash"] == reference["plain_hash"]


@pytest.mark.slow
def test_every_step_is_counted_and_each_save_has_the_number_in_its_name(
    reference: dict[str, Any],
) -> None:
    record: RunRecord = reference["rec"]
    assert record.read_json("verdict.json")["verdict"] == "accepted"
    steps = list(record.events("step"))
    # The last step is the one the script's own `break` ends on: counted too.
    assert [e["step"] for e in steps] == list(range(1, TOTAL + 1))
    assert {e["step"]: e["loss"] for e in steps} == pytest.approx(reference["losses"], rel=1e-6)
    assert all(e["total_steps"] == TOTAL and e["data_wait"] >= 0 for e in steps)
    assert all(e["step_time"] >= e["data_wait"] for e in steps)
    assert [e["step"] for e in record.events("checkpoint_commit")] == [4, 8, 12, 16, 20, 24]
    store = CheckpointStore(record.checkpoints_dir)
    assert [i.step for i in store.list()] == [20, 24]
    info = store.get(24)
    assert info is not None and "files/step_24/custom_checkpoint_0.pkl" in info.files
    assert info.meta["epoch"] == 2
    exit1 = record.read_json("attempts/1/exit.json")["work"]
    assert (exit1["first_step"], exit1["last_step"], exit1["steps_done"]) == (1, TOTAL, TOTAL)


@pytest.mark.slow
def test_killed_mid_epoch_resumes_through_the_scripts_own_resume_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """kill@step=13: the newest save is step_12 (epoch 1, 2 batches in); attempt 2 hands
    out/step_12 to the script, whose skip_first_batches draws the epoch as it first was.

    The steps lost are those attempt 1 ran past the save that attempt 2 says it resumed
    from; exit.json, the verdict and show's restart hint count the same."""
    job = make_job(tmp_path / "killed")
    # A backoff of 1 s: the restart costs enough for show's restart hint, on any machine.
    spec = (job / "spec.toml").read_text().replace("restart_backoff = 0", 'restart_backoff = "1s"')
    (job / "spec.toml").write_text(spec)
    proc = acceptrun_in(job, "run", "-q", "--inject", "kill@step=13", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    # The truth, from the script's own lines: the save attempt 2's own resume code loaded
    # (the step in its name), and the last step attempt 1 printed as completed. The kill
    # fires as step 13's optimizer step returns (its step event), before the script counts
    # the step and prints it: attempt 1 ran one step past its last line, and lost it too.
    out2 = record.file("attempts/2/stdout.log").read_text()
    (resumed_from,) = map(int, re.findall(r"^Resumed from checkpoint: \S*step_(\d+)$", out2, re.M))
    printed_last = max(printed_losses(record, 1))
    (fault,) = record.events("fault_injected")
    assert fault["step"] == printed_last + 1, (fault, printed_last)
    ran_to = printed_last + 1
    lost = ran_to - resumed_from
    assert (ran_to, resumed_from) == (13, 12), (ran_to, resumed_from)
    assert [r["step"] for r in record.events("restored")] == [resumed_from]
    assert (job / "weights.sha256").read_text() == reference["hash"]
    truth = {s: reference["losses"][s] for s in range(resumed_from + 1, TOTAL + 1)}
    assert printed_losses(record, 2) == truth
    assert step_losses(record, attempt=2) == pytest.approx(truth, rel=1e-6)
    exit2 = record.read_json("attempts/2/exit.json")["work"]
    want = (resumed_from + 1, TOTAL, TOTAL - resumed_from)
    assert (exit2["first_step"], exit2["last_step"], exit2["steps_done"]) == want, exit2
    assert exit2["resumed_from"] == resumed_from
    exit1 = record.read_json("attempts/1/exit.json")["work"]
    assert (exit1["last_step"], exit1["checkpoint_after"]) == (ran_to, resumed_from), exit1
    assert exit1["steps_lost"] == lost, exit1
    assert "lost_at_most" not in exit1, exit1  # counted from a step known exactly
    verdict = record.read_json("verdict.json")
    assert verdict["verdict"] == "accepted"
    (resumed,) = [c for c in verdict["checks"] if c["name"] == "resumed"]
    assert (
        f"step {resumed_from} " in resumed["evidence"] and "estimate" not in resumed["evidence"]
    ), resumed
    (failures,) = [c for c in verdict["checks"] if c["name"] == "failures"]
    assert f"; lost {lost} step," in failures["evidence"], failures
    show = acceptrun_in(job, "show", record.run_id)
    assert show.returncode == 0, show.stdout + show.stderr
    hint = next((line for line in show.stdout.splitlines() if "restarts cost" in line), "")
    redone = f"{lost} step{'' if lost == 1 else 's'} redone"
    assert f"(1 restart, {redone})" in hint, show.stdout


@pytest.mark.slow
def test_a_stop_between_saves_is_saved_under_the_scripts_own_name(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """term@step=14 (a preemption): the stop saves step 14 as out/step_14, a name the
    script's resume code can read, and the restarted attempt ends bitwise."""
    job = make_job(tmp_path / "stopped")
    proc = acceptrun_in(job, "run", "-q", "--inject", "term@step=14", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    (stopped,) = record.events("stopped")
    assert stopped["step"] == stopped["checkpoint"] == 14
    assert record.read_json("attempts/1/exit.json")["returncode"] == 143
    assert (job / "out" / "step_14").is_dir()
    assert [r["step"] for r in record.events("restored")] == [14]
    assert (job / "weights.sha256").read_text() == reference["hash"]
    assert printed_losses(record, 2) == {s: reference["losses"][s] for s in range(15, TOTAL + 1)}


SPEC_2RANKS = """\
name = "acc-upstream-ddp"
command = [{python}, "train.py", "--output_dir", "out", "--max_train_steps", "12"]
[resources]
processes = 2
[checkpoint]
keep_last = 2
[limits]
max_restarts = 1
restart_backoff = 0
grace_period = "300s"
"""


@pytest.mark.slow
def test_two_ranks_killed_mid_epoch_resume_bitwise(tmp_path: Path) -> None:
    """2 gloo ranks (5 batches an epoch each): killed at step 7, resumed from out/step_4
    (epoch 0, 4 batches in) through the script's own resume code, bitwise."""
    hashes = []
    for name, inject in (("ref", []), ("killed", ["--inject", "kill@step=7"])):
        job = tmp_path / name
        job.mkdir()
        (job / "train.py").write_text(TRACKED)
        (job / "spec.toml").write_text(SPEC_2RANKS.format(python=json.dumps(sys.executable)))
        proc = acceptrun_in(job, "run", "-q", *inject, "spec.toml")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        record = only_record_in(job / "ws")
        assert [e["step"] for e in record.events("step") if e.get("attempt", 1) == 1][:1] == [1]
        hashes.append((job / "weights.sha256").read_text())
        if inject:
            assert [r["step"] for r in record.events("restored")] == [4]
            work = record.read_json("attempts/2/exit.json")["work"]
            assert (work["first_step"], work["last_step"]) == (5, 12)
    assert hashes[0] == hashes[1]


@pytest.mark.slow
def test_a_training_loader_not_prepared_is_said_to_have_no_stop_boundary(tmp_path: Path) -> None:
    """Batches from a DataLoader that accelerator.prepare did not return: steps still
    count, and the run says that a stop cannot be honoured at a step boundary."""
    job = make_job(tmp_path / "unprepared")
    script = TRACKED.replace(
        "model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(\n"
        "    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler\n)",
        "model, optimizer, eval_dataloader, lr_scheduler = accelerator.prepare(\n"
        "    model, optimizer, eval_dataloader, lr_scheduler\n)",
    )
    assert script != TRACKED
    (job / "train.py").write_text(script)
    proc = acceptrun_in(job, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    assert [e["step"] for e in record.events("step")] == list(range(1, TOTAL + 1))
    (note,) = record.events("resume_note")
    assert "no step boundary to honour a stop request at" in note["note"], note
    assert "accelerator.prepare" in record.file("attempts/1/stderr.log").read_text()
