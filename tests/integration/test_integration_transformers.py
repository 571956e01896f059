"""The Hugging Face Trainer with AcceptrunCallback, under a real `acceptrun run`.

A tiny GPT-2 (2 layers, hidden 32, vocabulary 100) built from a config, on random tokens:
no downloads. The same job runs uninterrupted, stopped gracefully and resumed, and killed
by an injected fault with its newest checkpoint corrupted; every resumed run must
end with weights bitwise equal to the uninterrupted one, and the loss of every step it
ran again equal to the uninterrupted run's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import acceptrun_in, job_folder, only_record_in, step_losses, wait_for

# find_spec, not importorskip: every xdist worker collects this file, and importing
# transformers only to see that it is there costs each of them seconds.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)

WORKLOAD = textwrap.dedent(
    """
    import hashlib, os, time
    from pathlib import Path
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                              TrainingArguments, set_seed)
    from acceptrun.integrations.transformers import AcceptrunCallback

    total = int(os.environ.get("TOTAL", "20"))
    torch.set_num_threads(1)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            self.x = torch.randint(0, 100, (n, 16), generator=torch.Generator().manual_seed(seed))
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    acb = AcceptrunCallback()

    class Test(TrainerCallback):  # test aids: a held step, a corrupted stored checkpoint
        def on_step_begin(self, args, state, control, **kw):
            hold = os.environ.get("HOLD_AT")
            if hold and state.global_step == int(hold) and os.environ["ACCEPTRUN_ATTEMPT"] == "1":
                deadline = time.monotonic() + 600  # held here until the test's stop lands
                while not acb.fr.stop_requested and time.monotonic() < deadline:
                    time.sleep(0.05)
        def on_save(self, args, state, control, **kw):
            n = state.global_step
            if str(n) == os.environ.get("CORRUPT_AT") and os.environ["ACCEPTRUN_ATTEMPT"] == "1":
                f = Path(os.environ["ACCEPTRUN_CHECKPOINT_DIR"],
                         f"step-{n}/files/checkpoint-{n}/model.safetensors")
                b = bytearray(f.read_bytes()); b[-1] ^= 1; f.write_bytes(bytes(b))

    set_seed(0)
    # Dropout on: the resumed run must also restore the RNG it draws from.
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100,
                                       n_positions=16, resid_pdrop=0.1, embd_pdrop=0.1))
    args = TrainingArguments(
        "out", max_steps=total, per_device_train_batch_size=8, save_steps=5,
        save_total_limit=1, logging_steps=1, eval_strategy="steps", eval_steps=10,
        report_to=[], seed=0, use_cpu=True, disable_tqdm=True,
    )
    if os.environ.get("ADD_CALLBACK"):  # the other way to attach it
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(48, 1),
                          eval_dataset=Tokens(16, 2))
        trainer.add_callback(acb)
        trainer.add_callback(Test())  # after it: Test corrupts what it captured
    else:
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(48, 1),
                          eval_dataset=Tokens(16, 2), callbacks=[acb, Test()])
    trainer.train()
    trainer.save_model("out/final")
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    Path("weights.sha256").write_text(digest.hexdigest())
    """
)
SPEC = """\
name = "hf"
command = [{python}, "train.py"]
[checkpoint]
keep_last = 2
[limits]
max_restarts = 1
restart_backoff = 0
grace_period = "300s"
[acceptance]
outputs = ["model/model.safetensors"]
"""


def make_job(root: Path) -> Path:
    return job_folder(root, WORKLOAD, SPEC.format(python=json.dumps(sys.executable)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run: its weights' hash, its losses and its record."""
    job = make_job(tmp_path_factory.mktemp("hf") / "ref")
    proc = acceptrun_in(job, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    return {
        "hash": (job / "weights.sha256").read_text(),
        "losses": step_losses(record),
        "rec": record,
    }


def test_importing_acceptrun_imports_no_framework() -> None:
    code = (
        "import sys, acceptrun, acceptrun.integrations, acceptrun.cli.main\n"
        "bad = [m for m in ('transformers', 'accelerate', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.slow
def test_uninterrupted_run_records_steps_checkpoints_and_model(reference: dict[str, Any]) -> None:
    record: RunRecord = reference["rec"]
    assert record.read_json("verdict.json")["verdict"] == "accepted"
    steps = list(record.events("step"))
    assert [e["step"] for e in steps] == list(range(1, 21))
    for e in steps:
        assert e["total_steps"] == 20 and e["samples"] == 8
        assert e["step_time"] > 0 and e["loss"] > 0 and e["learning_rate"] > 0
        assert "grad_norm" in e
    metrics = [(m["name"], m["step"]) for m in record.events("metric")]
    assert ("eval_loss", 10) in metrics and ("eval_loss", 20) in metrics
    # Every checkpoint-N the Trainer saved was captured; save_total_limit=1 deleted the
    # Trainer's older directories, acceptrun's retention (keep_last = 2) kept its own.
    commits = [e["step"] for e in record.events("checkpoint_commit")]
    assert commits == [5, 10, 15, 20]
    stalls = [e for e in record.events("checkpoint_stage") if e.get("captured")]
    assert [e["step"] for e in stalls] == commits and all(e["stall_s"] > 0 for e in stalls)
    store = CheckpointStore(record.checkpoints_dir)
    assert [i.step for i in store.list()] == [15, 20]
    assert store.verify(20).ok
    assert "checkpoint-20/trainer_state.json" in "\n".join(store.get(20).files)  # type: ignore[union-attr]
    assert sorted(p.name for p in (record.path.parents[2] / "out").iterdir()) == [
        "checkpoint-20",
        "final",
    ]
    outputs = {e["name"] for e in record.events("output")}
    assert {"model/model.safetensors", "model/config.json"} <= outputs


@pytest.mark.slow
def test_restore_drill_of_a_trainer_run(reference: dict[str, Any]) -> None:
    """`acceptrun ckpt drill`: the newest checkpoint is put back in a scratch copy, one step runs."""
    record: RunRecord = reference["rec"]
    job = record.path.parents[2]
    proc = acceptrun_in(job, "ckpt", "drill", record.run_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (drill,) = record.events("drill")
    assert drill["ok"] and "restored step 20" in drill["evidence"]
    assert sorted(p.name for p in (job / "out").iterdir()) == ["checkpoint-20", "final"]


@pytest.mark.slow
def test_graceful_stop_then_resume_bitwise(tmp_path: Path, reference: dict[str, Any]) -> None:
    job = make_job(tmp_path / "stopped")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env["HOLD_AT"] = "7"  # attempt 1 waits after step 7 until the stop has landed
    ws = job / "ws"
    run = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def committed() -> bool:
        assert run.poll() is None, run.communicate()  # still running while we wait
        return bool(list(ws.glob("runs/*/checkpoints/step-5/MANIFEST.json")))

    wait_for(committed, timeout=240, what="the checkpoint of step 5")
    record = only_record_in(job / "ws")
    stop = acceptrun_in(job, "stop", record.run_id, "--wait")
    assert stop.returncode == 0, stop.stderr
    run.communicate(timeout=300)
    (stopped,) = record.events("stopped")
    last = max(e["step"] for e in record.events("step"))
    assert stopped["checkpoint"] == stopped["step"] == last < 20  # saved the step it stopped at
    assert CheckpointStore(record.checkpoints_dir).latest().step == last  # type: ignore[union-attr]
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["outcome"] == "stopped" and exit1["returncode"] == 143
    resumed = acceptrun_in(job, "resume", "-q", record.run_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["step"] for r in record.events("restored")] == [last]
    assert (job / "weights.sha256").read_text() == reference["hash"]
    again = step_losses(record, attempt=2)
    assert again == {s: reference["losses"][s] for s in range(last + 1, 21)}


@pytest.mark.slow
def test_killed_run_past_a_corrupted_checkpoint_resumes_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Attempt 1 flips a byte of the stored step 10, then kill@step=12 fires from the
    callback's step event: attempt 2 quarantines step 10 and resumes from step 5.

    The callback is attached with trainer.add_callback() here, after the Trainer exists.
    """
    job = make_job(tmp_path / "corrupt")
    env = {"CORRUPT_AT": "10", "ADD_CALLBACK": "1"}
    proc = acceptrun_in(job, "run", "-q", "--inject", "kill@step=12", "spec.toml", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    (fault,) = record.events("fault_injected")
    assert fault["step"] == 12 and fault["action"] == "kill"
    (q,) = record.events("checkpoint_quarantine")
    assert q["step"] == 10 and "failed verification" in q["reason"]
    assert [a["resume_step"] for a in record.events("attempt_start")] == [None, 5]
    (restored,) = record.events("restored")
    assert restored["attempt"] == 2 and restored["step"] == 5
    (removed,) = record.events("stale_checkpoint_removed")  # the Trainer's own checkpoint-10
    assert removed["path"].endswith("checkpoint-10") and removed["resumed_step"] == 5
    assert (job / "weights.sha256").read_text() == reference["hash"]
    again = step_losses(record, attempt=2)
    assert sorted(again) == list(range(6, 21))
    assert again == {s: reference["losses"][s] for s in again}  # the loss curve, exactly


def test_the_trainers_attempt_averages_are_marked_and_refused(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Killed at step 12 and resumed from step 10: the same weights, another train_loss.

    The Trainer's train_loss divides the losses of the steps the attempt ran (11..20) by
    the global step count (20): the resumed run reports about half the uninterrupted
    run's. It is recorded as a figure of attempt 2 only, ``show`` says so, and a spec
    that makes it an acceptance metric is refused before the run, with what to use.
    """
    job = make_job(tmp_path / "averages")
    proc = acceptrun_in(job, "run", "-q", "--inject", "kill@step=12", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(job / "ws")
    assert (job / "weights.sha256").read_text() == reference["hash"]  # the same model
    exit2 = json.loads((record.path / "attempts" / "2" / "exit.json").read_text())["work"]
    assert (exit2["resumed_from"], exit2["first_step"], exit2["steps_done"]) == (10, 11, 10)

    def final(rec: RunRecord) -> dict[str, dict[str, Any]]:
        return {str(e["name"]): e for e in rec.events("metric") if e["step"] == 20}

    ours, theirs = final(record), final(reference["rec"])
    names = ("train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    for name in names:
        assert ours[name]["attempt"] == 2 and "this attempt" in ours[name]["per_attempt"], ours
        assert ours[name]["instead"], ours[name]
    # The truth behind the mark: the weights are equal, the Trainer's averages are not.
    assert ours["train_loss"]["value"] < 0.75 * theirs["train_loss"]["value"], (ours, theirs)
    assert ours["eval_loss"]["value"] == theirs["eval_loss"]["value"]
    assert "per_attempt" not in ours["eval_loss"]
    show = acceptrun_in(job, "show", record.run_id).stdout
    assert "train_loss = " in show and "(attempt 2 only)" in show, show

    # An acceptance threshold on it is refused at spec check and run, with the fix.
    spec = job / "spec.toml"
    spec.write_text(spec.read_text() + '[acceptance.metrics]\ntrain_loss = "<= 100"\n')
    check = acceptrun_in(job, "spec", "check", "spec.toml")
    assert check.returncode != 0, check.stdout + check.stderr
    said = check.stdout + check.stderr
    assert "acceptance.metrics.train_loss" in said and "one attempt" in said, said
    assert "eval_loss" in said, said  # what to use instead
    refused = acceptrun_in(job, "run", "-q", "spec.toml")
    assert refused.returncode != 0 and "acceptance.metrics.train_loss" in refused.stderr, (
        refused.stdout + refused.stderr
    )
