"""The Lightning integration over real runs: real lightning on CPU, real signals, real files.

One tiny LightningModule (161 parameters, dropout, AdamW with a per-step scheduler) trains
30 steps on a shuffled synthetic loader of 12 batches per epoch, with a ``ModelCheckpoint``
every 6 steps, each followed by a validation (which a resumed Lightning skips, creating a
validation iterator that draws from the RNG). The uninterrupted run is the reference; runs
killed mid-epoch, stopped gracefully, or resumed past a corrupted checkpoint must end
with bitwise-equal weights and the same loss at every step. A plain Lightning resume
(``fit(ckpt_path=...)`` without the callback) is measured too: it does not end equal,
which is what the callback's loader and RNG state fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from conftest import only_record_in, step_losses, wait_for

pytestmark = pytest.mark.slow  # each Lightning process spends seconds importing lightning

PYTHON = sys.executable
TOTAL = 30  # steps; 12 batches per epoch, so the run ends mid-epoch 2
KILL_AT = 20  # mid-epoch 1: the newest checkpoint is step 18, six batches into the epoch

TRAIN = textwrap.dedent(
    """
    import hashlib, json, os, time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    TOTAL = int(os.environ.get("TOTAL", "30"))
    HOLD_AT = int(os.environ.get("HOLD_AT", "-1"))  # attempt 1 waits here for the stop
    PLAIN = os.environ.get("PLAIN")  # without acceptrun: Lightning's own resume

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

        def training_step(self, batch, i):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            if self.global_step == HOLD_AT and os.environ.get("ACCEPTRUN_ATTEMPT") == "1":
                deadline = time.monotonic() + 600  # held until the test's stop has landed
                while not acb.fr.stop_requested and time.monotonic() < deadline:
                    time.sleep(0.05)
            return loss

        def validation_step(self, batch, i):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.7)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g))
    val = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
    workers = int(os.environ.get("WORKERS", "0"))
    train_loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=workers)
    every = int(os.environ.get("EVERY", "6"))
    # LOGGER: Lightning's own logger (its version folders); checkpoints then go under it.
    LOGGER = os.environ.get("LOGGER")
    dirpath = None if LOGGER else "ckpt"
    callbacks = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=every, save_top_k=-1)]
    if not PLAIN:
        from acceptrun.integrations.lightning import AcceptrunCallback
        acb = AcceptrunCallback()
        callbacks.append(acb)
    if LOGGER == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger
        logger = TensorBoardLogger(".")
    elif LOGGER == "csv":
        from lightning.pytorch.loggers import CSVLogger
        logger = CSVLogger(".")
    else:
        logger = False
    trainer = pl.Trainer(
        max_steps=TOTAL, accelerator="cpu", devices=1, logger=logger, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, val_check_interval=6,
        limit_val_batches=0 if os.environ.get("NOVAL") else 1.0, callbacks=callbacks,
    )
    model = Tiny()
    trainer.fit(model, train_loader, DataLoader(val, batch_size=16),
                ckpt_path=os.environ.get("CKPT") or None)
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    open("weights.sha256", "w").write(hashlib.sha256(weights).hexdigest())
    """
)

SPEC = """\
name = "tiny-lightning"
command = [{python}, "train.py"]
[checkpoint]
keep_last = 3
[limits]
max_restarts = {restarts}
restart_backoff = 0
grace_period = "300s"
[acceptance]
outputs = ["model"]
"""


def make_job(root: Path, *, restarts: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(TRAIN)
    (root / "spec.toml").write_text(SPEC.format(python=json.dumps(PYTHON), restarts=restarts))
    return root


def acceptrun(
    job: Path, ws: Path, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        cwd=job, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run under `acceptrun run`: its record, weights and loss curve."""
    root = tmp_path_factory.mktemp("reference")
    job = make_job(root / "job")
    proc = acceptrun(job, root / "ws", "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(root / "ws")
    return {
        "job": job,
        "proc": proc,
        "record": record,
        "sha": (job / "weights.sha256").read_text(),
        "losses": step_losses(record),
    }


def test_uninterrupted_run_is_accepted_with_steps_checkpoints_metrics_and_output(
    reference: dict[str, Any],
) -> None:
    record: RunRecord = reference["record"]
    assert "ACCEPTED" in reference["proc"].stdout
    steps = list(record.events("step"))
    assert [e["step"] for e in steps] == list(range(1, TOTAL + 1))  # Lightning's global_step
    assert all(e["total_steps"] == TOTAL and e["samples"] == 8 for e in steps)
    assert all(e["loss"] > 0 and 0 < e["lr"] <= 0.01 for e in steps)
    assert steps[10]["lr"] == pytest.approx(0.007)  # StepLR(10, 0.7) after ten steps
    assert all("step_time" in e and "data_wait" in e for e in steps[1:])
    # Each ModelCheckpoint save is one acceptrun checkpoint of that step, files hashed.
    commits = [e["step"] for e in record.events("checkpoint_commit")]
    assert commits == [6, 12, 18, 24, 30]
    stages = list(record.events("checkpoint_stage"))
    assert [e["step"] for e in stages] == commits and all(e["captured"] for e in stages)
    manifest = json.loads((record.checkpoints_dir / "step-30" / "MANIFEST.json").read_text())
    (name,) = manifest["meta"]["files"]
    assert name == "ckpt/epoch=2-step=30.ckpt"
    assert manifest["meta"]["lightning"]["global_step"] == 30
    assert manifest["files"][f"files/{name}"]["hash"].startswith("xxh3_128:")
    # Retention is acceptrun's (keep_last = 3); ModelCheckpoint kept all of its own files.
    assert sorted(p.name for p in record.checkpoints_dir.glob("step-*")) == [
        "step-18", "step-24", "step-30",
    ]  # fmt: skip
    assert len(list((reference["job"] / "ckpt").glob("*.ckpt"))) == 5
    vals = [e for e in record.events("metric") if e["name"] == "val_loss"]
    assert [e["step"] for e in vals] == [6, 12, 18, 24, 30, 30]  # every 6 steps, then final
    (output,) = record.events("output")
    assert output["name"] == "model" and output["path"].endswith("epoch=2-step=30.ckpt")
    verdict = record.read_json("verdict.json")
    assert verdict["verdict"] == "accepted"


def test_restore_drill_passes_and_changes_no_file_of_the_run(reference: dict[str, Any]) -> None:
    job, record = reference["job"], reference["record"]
    before = {p.name: p.read_bytes() for p in (job / "ckpt").iterdir()}
    scratch = record.path.parent.parent.parent / "drill-tmp"  # the drill's copy goes here
    scratch.mkdir()
    drill = acceptrun(
        job, record.path.parent.parent, "ckpt", "drill", record.run_id, TMPDIR=str(scratch)
    )
    assert drill.returncode == 0, drill.stdout + drill.stderr
    assert "restore drill PASSED: restored step 30" in drill.stdout + drill.stderr
    assert {p.name: p.read_bytes() for p in (job / "ckpt").iterdir()} == before
    assert not list(scratch.glob("acceptrun-drill-*"))  # and is gone once it was loaded


def test_killed_mid_epoch_resumes_from_the_newest_verified_checkpoint_bitwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    job = make_job(tmp_path / "job")
    proc = acceptrun(
        job, tmp_path / "ws", "run", "-q", "--inject", f"kill@step={KILL_AT}", "spec.toml"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(tmp_path / "ws")
    (fault,) = record.events("fault_injected")  # fired by the callback's run.log
    assert fault["step"] == KILL_AT and fault["action"] == "kill"
    exits = [record.read_json(f"attempts/{n}/exit.json") for n in (1, 2)]
    assert exits[0]["class"] == "killed" and exits[1]["class"] == "success"
    assert exits[0]["work"]["steps_lost"] == KILL_AT - 18  # lost work: after the newest capture
    (restored,) = record.events("restored")
    assert restored["attempt"] == 2 and restored["step"] == 18  # mid-epoch 1
    first = next(e["step"] for e in record.events("step") if e["attempt"] == 2)
    assert first == 19
    assert not list(record.events("resume_note"))  # nothing it could not make exact
    assert (job / "weights.sha256").read_text() == reference["sha"]
    assert step_losses(record) == reference["losses"]  # the same loss at every step


def test_graceful_stop_saves_exits_143_and_resume_ends_bitwise_without_validation(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """A stop mid-run, then `acceptrun resume`; no validation and checkpoints every 7 steps:
    validation does not move the training random streams, so this is still the reference."""
    job = make_job(tmp_path / "job")
    ws = tmp_path / "ws"
    env = {"NOVAL": "1", "EVERY": "7"}
    # Attempt 1 holds step 10 until the stop has landed, however slow the machine.
    run = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=job, env={**os.environ, **env, "HOLD_AT": "10"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def committed() -> RunRecord | None:
            found = list((ws / "runs").glob("*/events.jsonl")) if (ws / "runs").is_dir() else []
            record = RunRecord(found[0].parent) if found else None
            return record if record and list(record.events("checkpoint_commit")) else None

        record = wait_for(committed, timeout=300, what="a first checkpoint")
        stop = acceptrun(job, ws, "stop", record.run_id, "--wait", timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["class"] == "stopped" and exit1["returncode"] == 143
    (stopped,) = record.events("stopped")
    last = max(e["step"] for e in record.events("step"))
    assert stopped["step"] == last and stopped["checkpoint"] == last < TOTAL
    commits = [e["step"] for e in record.events("checkpoint_commit")]
    assert commits[-1] == last  # the step in flight finished and was saved
    if last % 7:  # not a ModelCheckpoint step: the callback saved its own .ckpt
        info = json.loads((record.checkpoints_dir / f"step-{last}" / "MANIFEST.json").read_text())
        assert list(info["meta"]["files"]) == ["ckpt/acceptrun.ckpt"]
    assert exit1["work"]["steps_lost"] == 0

    resumed = acceptrun(job, ws, "resume", "-q", record.run_id, **env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [e["step"] for e in record.events("restored")] == [last]
    assert not [e for e in record.events("metric") if e["name"] == "val_loss"]
    # ModelCheckpoint's steps, and the stop's; step 30 has no ModelCheckpoint file: the
    # callback saved its own for the output.
    commits = [e["step"] for e in record.events("checkpoint_commit")]
    assert last in commits
    assert [c for c in commits if c != last] == [c for c in (7, 14, 21, 28, 30) if c != last]
    (output,) = record.events("output")
    assert output["path"] == str(job / "ckpt" / "acceptrun.ckpt")
    assert (job / "weights.sha256").read_text() == reference["sha"]
    assert step_losses(record) == reference["losses"]


def test_corrupted_newest_is_quarantined_and_the_epoch_end_one_resumes_bitwise_with_workers(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Step 18's checkpoint is corrupted: the resume quarantines it and restores step 12,
    the end of epoch 0, with two loader worker processes (epoch 1 starts afresh)."""
    job = make_job(tmp_path / "job", restarts=0)
    ws = tmp_path / "ws"
    kill = f"kill@step={KILL_AT}"
    proc = acceptrun(job, ws, "run", "-q", "--inject", kill, "spec.toml", WORKERS="2")
    assert proc.returncode == 1  # killed, no restart allowed
    record = only_record_in(ws)
    newest = record.checkpoints_dir / "step-18" / "files" / "ckpt" / "epoch=1-step=18.ckpt"
    blob = bytearray(newest.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # one flipped byte
    newest.write_bytes(bytes(blob))

    resumed = acceptrun(job, ws, "resume", "-q", record.run_id, WORKERS="2")
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    (quarantine,) = record.events("checkpoint_quarantine")
    assert quarantine["step"] == 18 and "failed verification" in quarantine["reason"]
    assert list((record.checkpoints_dir / "quarantine").glob("step-18-*"))
    assert [e["step"] for e in record.events("restored")] == [12]  # epoch 1 starts afresh
    assert record.read_json("attempts/2/exit.json")["class"] == "success"
    # The file put back is the verified copy, whatever Lightning left in ckpt/; two worker
    # processes give the same batches in the same order as the main process.
    assert (job / "weights.sha256").read_text() == reference["sha"]
    assert step_losses(record) == reference["losses"]


def test_plain_lightning_mid_epoch_resume_is_not_exact(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """The known issue the callback fixes, measured: Lightning alone, same checkpoint."""
    job = make_job(tmp_path / "job")
    full = subprocess.run([PYTHON, "train.py"], cwd=job, env={**os.environ, "PLAIN": "1"},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert full.returncode == 0, full.stderr
    uninterrupted = (job / "weights.sha256").read_text()
    env = {"PLAIN": "1", "CKPT": "ckpt/epoch=1-step=18.ckpt"}
    resumed = subprocess.run([PYTHON, "train.py"], cwd=job, env={**os.environ, **env},
                             capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "dataloader is not resumable" in resumed.stderr  # Lightning's own warning
    assert (job / "weights.sha256").read_text() != uninterrupted


def test_a_nan_loss_stops_the_run_as_diverged(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job")
    proc = acceptrun(job, tmp_path / "ws", "run", "-q", "--inject", "nan@step=4", "spec.toml")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = only_record_in(tmp_path / "ws")
    (diverged,) = record.events("diverged")
    assert diverged["step"] == 4 and "not finite" in diverged["reason"]
    exit1 = record.read_json("attempts/1/exit.json")
    assert exit1["class"] == "diverged" and not record.exists("attempts/2/exit.json")


def test_importing_acceptrun_never_imports_lightning() -> None:
    code = "import sys, acceptrun, acceptrun.integrations; print('lightning' in sys.modules)"
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("logger", ["tensorboard", "csv"])
def test_a_resumed_fit_writes_into_the_version_of_the_checkpoint_it_restored(
    tmp_path: Path, reference: dict[str, Any], logger: str
) -> None:
    """Killed mid-epoch with Lightning's logger on: attempt 2 would open version_1 while
    the checkpoint it restores is in version_0/checkpoints. A TensorBoardLogger is moved
    back to version_0 (one folder for the whole run); a CSVLogger cannot be (reopening
    version_0 deletes its metrics.csv), and the run says so, naming both folders."""
    if logger == "tensorboard":
        pytest.importorskip("tensorboard")
    job = make_job(tmp_path / "job")
    proc = acceptrun(
        job, tmp_path / "ws", "run", "-q", "--inject", f"kill@step={KILL_AT}", "spec.toml",
        LOGGER=logger,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = only_record_in(tmp_path / "ws")
    assert (job / "weights.sha256").read_text() == reference["sha"]  # still bitwise
    (restored,) = record.events("restored")
    assert restored["step"] == 18, restored
    versions = sorted(p.name for p in (job / "lightning_logs").iterdir())
    (resumed,) = [c for c in record.read_json("verdict.json")["checks"] if c["name"] == "resumed"]
    notes = [e["note"] for e in record.events("resume_note")]
    if logger == "tensorboard":
        assert versions == ["version_0"], versions
        saved = sorted(p.name for p in (job / "lightning_logs/version_0/checkpoints").iterdir())
        assert "epoch=2-step=30.ckpt" in saved and "epoch=1-step=18.ckpt" in saved, saved
        assert len(list((job / "lightning_logs/version_0").glob("events.out.tfevents.*"))) == 2
        assert any("continues in" in n and "version_0" in n for n in notes), notes
    else:
        assert versions == ["version_0", "version_1"], versions
        (split,) = [n for n in notes if "split across two folders" in n]
        assert "version_0" in split and "version_1" in split, split
        assert "split across two folders" in resumed["evidence"], resumed
