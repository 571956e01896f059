"""Bit-exact resume through the whole path: supervisor, client API, store, loader.

The same training job runs uninterrupted, and again SIGKILLed at random steps and
resumed by the supervisor from its latest verified checkpoint; the final weights must be
bitwise equal. Also: graceful stop loses no step, the restore drill, quarantine on
restart, and the ckpt commands.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.durable import read_jsonl
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.cli.main import main
from acceptrun.record.steplog import StepLog
from acceptrun.run.launch import launch
from conftest import wait_for

WORKLOAD = textwrap.dedent(
    """
    import hashlib, os, signal, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import acceptrun

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    workers = int(os.environ.get("WORKERS", "0"))
    total = int(os.environ.get("TOTAL", "24"))
    kill_at = {int(s) for s in os.environ.get("KILL_AT", "").split(",") if s}
    eager = bool(os.environ.get("EAGER_WORKERS"))  # workers forked before run.steps()
    attempt = int(os.environ["ACCEPTRUN_ATTEMPT"])

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g))
    sampler = acceptrun.ResumableSampler(data, seed=3)
    loader = acceptrun.ResumableLoader(DataLoader(data, batch_size=16, sampler=sampler, num_workers=workers))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)

    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt, scheduler=sched, loader=loader)
    stream = loader.infinite()
    if eager:
        plain = DataLoader(data, batch_size=16, num_workers=workers, persistent_workers=True)
        first = iter(plain)  # forks the workers here, before run.steps()

        def forever(it):
            while True:
                yield from it
                it = iter(plain)

        stream = forever(first)
    for step in run.steps(start, total):
        with run.data_wait():
            x, y = next(stream)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run.log(step, loss=loss.item(), samples=len(x))
        run.maybe_checkpoint(step)
        # Die only after the step's checkpoint had time to start: a kill can land inside a save.
        if step in kill_at and attempt == 1 + sorted(kill_at).index(step):
            os.kill(os.getpid(), signal.SIGKILL)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    open("weights.sha256", "w").write(digest)
    run.metric("final/loss", loss.item())
    """
)


def make_job(
    tmp_path: Path, name: str, *, every: int = 3, restarts: int = 5, extra: str = ""
) -> Path:
    job = tmp_path / name
    job.mkdir()
    (job / "train.py").write_text(WORKLOAD)
    (job / "spec.toml").write_text(
        f'name = "{name}"\ncommand = ["{sys.executable}", "train.py"]\n'
        f"[checkpoint]\nevery_steps = {every}\nkeep_last = 2\n"
        f'[limits]\nmax_restarts = {restarts}\nrestart_backoff = 0\ngrace_period = "300s"\n{extra}'
    )
    return job


def failed_checks(result: Any) -> list[dict[str, Any]]:
    """The required checks a run failed, whole (a Verdict's repr is cut short)."""
    return [c.to_dict() for c in result.verdict.checks if c.required and c.status != "pass"]


def run_job(job: Path, ws: Path, **env: str) -> tuple[str, object]:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        result = launch(job / "spec.toml", workspace=ws, echo=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return (job / "weights.sha256").read_text(), result


@pytest.mark.parametrize("workers", ["0", "2"], ids=["no-workers", "2-workers"])
def test_killed_and_resumed_run_is_bitwise_equal(tmp_path: Path, workers: str) -> None:
    ws = tmp_path / "ws"
    # About resume, not the loader's speed: on a busy machine two loader workers starved of
    # CPU make the loop wait for data, which the default max_data_wait rightly rejects.
    lenient = "[acceptance]\nmax_data_wait = 1.0\n"
    reference, ref = run_job(make_job(tmp_path, "ref", extra=lenient), ws, WORKERS=workers)
    assert ref.exit_code == 0, failed_checks(ref)  # type: ignore[attr-defined]
    kills = sorted(random.Random(int(workers) + 7).sample(range(3, 22), 3))
    resumed, result = run_job(
        make_job(tmp_path, "killed", extra=lenient),
        ws,
        WORKERS=workers,
        KILL_AT=",".join(map(str, kills)),
    )
    assert result.exit_code == 0, failed_checks(result)  # type: ignore[attr-defined]
    assert resumed == reference
    record = result.record  # type: ignore[attr-defined]
    starts = list(record.events("attempt_start"))
    assert len(starts) == 4
    # Each restart resumed from the newest checkpoint at or before the kill.
    for kill, start in zip(kills, starts[1:], strict=True):
        assert start["resume_step"] is not None and start["resume_step"] <= kill
    restored = list(record.events("restored"))
    assert [r["attempt"] for r in restored] == [2, 3, 4]


@pytest.mark.parametrize("workers", ["0", "2"], ids=["no-workers", "2-workers"])
def test_graceful_stop_loses_no_step(tmp_path: Path, workers: str) -> None:
    """With data-loader workers too: they must not die of the stop and crash the loop."""
    job = make_job(tmp_path, "stop", every=1000, restarts=0)
    ws = tmp_path / "ws"
    env = {**os.environ, "TOTAL": "100000", "WORKERS": workers}
    if workers != "0":
        env["EAGER_WORKERS"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip

    def twenty_steps_logged() -> Path | None:
        runs = list((ws / "runs").glob("*/events.jsonl")) if (ws / "runs").exists() else []
        if runs and StepLog(runs[0].parent).count() >= 20:
            return runs[0]
        return None

    events = wait_for(twenty_steps_logged, what="the workload to log 20 steps")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    evs = list(read_jsonl(events))
    last_step = max(e["step"] for e in StepLog(events.parent).events())
    (stopped,) = [e for e in evs if e["kind"] == "stopped"]
    assert stopped["checkpoint"] == last_step  # the step in flight finished and was saved
    store = CheckpointStore(events.parent / "checkpoints")
    assert store.latest().step == last_step
    assert store.verify().ok
    (exit_json,) = (events.parent / "attempts").glob("*/exit.json")
    assert json.loads(exit_json.read_text())["outcome"] == "stopped"
    assert "DataLoader worker" not in (exit_json.parent / "stderr.log").read_text()


def test_restart_skips_a_corrupted_checkpoint(tmp_path: Path) -> None:
    """A flipped byte in the newest checkpoint: it is quarantined and the older one used."""
    ws = tmp_path / "ws"
    job = make_job(tmp_path, "corrupt", restarts=1)
    reference, _ = run_job(make_job(tmp_path, "ref"), ws)
    # Attempt 1 dies at step 16, just after corrupting its newest checkpoint (step 14).
    kill = "        os.kill(os.getpid(), signal.SIGKILL)"
    assert kill in WORKLOAD
    corrupt = (
        "        run._checkpointer.wait()\n"
        "        f = os.path.join(os.environ['ACCEPTRUN_CHECKPOINT_DIR'], 'step-14', 'tensors.safetensors')\n"
        "        b = bytearray(open(f, 'rb').read()); b[-1] ^= 1; open(f, 'wb').write(bytes(b))\n"
    )
    (job / "train.py").write_text(WORKLOAD.replace(kill, corrupt + kill))
    resumed, result = run_job(job, ws, KILL_AT="16")
    assert resumed == reference
    record = result.record  # type: ignore[attr-defined]
    (q,) = list(record.events("checkpoint_quarantine"))
    assert "step-14" in q["path"] or q.get("step") == 14
    assert [s["resume_step"] for s in record.events("attempt_start")] == [None, 11]
    assert list((record.checkpoints_dir / "quarantine").iterdir())


def test_ckpt_commands_and_restore_drill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = tmp_path / "ws"
    _, result = run_job(
        make_job(tmp_path, "drill", extra='[acceptance]\ndrills = ["restore"]\n'), ws
    )
    record = result.record  # type: ignore[attr-defined]
    # The verdict asked for a drill that has not run yet: rejected, and it says how to fix it.
    assert result.exit_code == 1  # type: ignore[attr-defined]
    assert main(["--workspace", str(ws), "ckpt", "ls", record.run_id]) == 0
    out = capsys.readouterr().out
    assert "     23*" in out and "     20 " in out  # keep_last = 2 (every 3 steps, last at 23)
    assert main(["--workspace", str(ws), "ckpt", "verify", record.run_id]) == 0
    assert "step 23: ok" in capsys.readouterr().out
    assert main(["--workspace", str(ws), "ckpt", "drill", "--cpu", record.run_id]) == 0
    out = capsys.readouterr().out
    assert "restore drill PASSED: restored step 23" in out
    (drill,) = list(record.events("drill"))
    assert drill["ok"] and drill["step"] == 23
    # The drill logged nothing into the run: its steps are not the run's.
    assert max(e["step"] for e in record.events("step")) == 23
    from acceptrun.verdict.decide import compute_verdict

    verdict = compute_verdict(record)
    assert verdict.accepted, [c for c in verdict.checks if c.status != "pass"]
    # Corrupt the latest checkpoint: verify fails, names the file, exit 1.
    f = record.checkpoints_dir / "step-23" / "tensors.safetensors"
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))
    assert main(["--workspace", str(ws), "ckpt", "verify", record.run_id]) == 1
    assert "tensors.safetensors" in capsys.readouterr().out
    assert json.loads((record.path / "drills" / "1" / "result.json").read_text())["ok"] is True
