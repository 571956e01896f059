"""Supervision policy with real processes: hangs, data stalls, divergence, user errors,
OOM retries, rollback, lost-work accounting and time-based faults."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch


def job(tmp_path: Path, body: str, spec: str = "", name: str = "job") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "train.py").write_text(textwrap.dedent(body))
    (d / "spec.toml").write_text(
        f'name = "{name}"\ncommand = ["{sys.executable}", "train.py"]\n'
        f'env = {{ ACCEPTRUN_HEARTBEAT_S = "0.2" }}\n{textwrap.dedent(spec)}'
    )
    return d / "spec.toml"


def exits(record: RunRecord) -> list[dict]:
    root = record.path / "attempts"
    return [
        json.loads((root / str(n) / "exit.json").read_text())
        for n in sorted(int(p.name) for p in root.iterdir())
    ]


CKPT_LOOP = """
import os, time, torch, acceptrun
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, int(os.environ.get("TOTAL", "20"))):
    loss = model(torch.ones(2, 4)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(step, loss=loss.item())
    run.maybe_checkpoint(step)
    {extra}
"""


def test_hang_is_detected_stacks_collected_and_retried(tmp_path: Path) -> None:
    body = CKPT_LOOP.replace(
        "{extra}", "if step == 6 and run.attempt == 1:\n        time.sleep(1000)  # stuck in a step"
    )
    spec = '[checkpoint]\nevery_steps = 3\n[limits]\nhang_window = "10s"\nrestart_backoff = 0\n'
    result = launch(job(tmp_path, body, spec), workspace=tmp_path / "ws", echo=False)
    assert result.exit_code == 0, result.verdict
    first, second = exits(result.record)
    assert first["outcome"] == "hang" and first["class"] == "hang"
    assert "stuck in phase 'step'" in first["evidence"][0]
    assert first["decision"].startswith("restart: hang is retried")
    stacks = (result.record.attempt_dir(1) / "stacks.txt").read_text()
    assert "time.sleep" in stacks or "train.py" in stacks
    # Work lost: step 6 never finished (no step lost), but the time since step 5's
    # checkpoint (the hang window and more) was.
    assert first["work"]["checkpoint_after"] == 5
    assert first["work"]["steps_lost"] == 0
    assert first["work"]["seconds_lost"] >= 10
    assert second["work"]["resumed_from"] == 5


def test_data_stall_is_told_from_a_hang(tmp_path: Path) -> None:
    body = CKPT_LOOP.replace(
        "    loss = model",
        "    with run.data_wait():\n        if step == 4 and run.attempt == 1:\n            time.sleep(1000)\n    loss = model",
    ).replace("{extra}", "")
    spec = '[limits]\nhang_window = "10s"\nrestart_backoff = 0\n'
    result = launch(job(tmp_path, body, spec), workspace=tmp_path / "ws", echo=False)
    first = exits(result.record)[0]
    assert first["class"] == "data_stall"
    assert "waiting for data" in first["evidence"][0]


def test_black_box_hang_without_client(tmp_path: Path) -> None:
    body = "import time\nprint('started', flush=True)\ntime.sleep(1000)\n"
    spec = '[limits]\nhang_window = "10s"\nmax_restarts = 0\n'
    result = launch(job(tmp_path, body, spec), workspace=tmp_path / "ws", echo=False)
    (first,) = exits(result.record)
    assert first["class"] == "hang"
    assert "no output and no CPU use" in first["evidence"][0]
    assert result.exit_code == 1


def test_user_error_is_never_retried(tmp_path: Path) -> None:
    result = launch(
        job(
            tmp_path,
            "import no_such_module_xyz\n",
            "[limits]\nmax_restarts = 5\nrestart_backoff = 0\n",
        ),
        workspace=tmp_path / "ws",
        echo=False,
    )
    (first,) = exits(result.record)
    assert first["class"] == "user_error"
    assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in first["evidence"]
    assert first["decision"].startswith("stop: user_error")
    assert result.exit_code == 1


def test_host_oom_is_retried_once(tmp_path: Path) -> None:
    body = """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    blocks = [bytearray(1 << 28) for _ in range(16)]
    """
    result = launch(
        job(tmp_path, body, "[limits]\nmax_restarts = 5\nrestart_backoff = 0\n"),
        workspace=tmp_path / "ws",
        echo=False,
    )
    attempts = exits(result.record)
    assert [a["class"] for a in attempts] == ["host_oom", "host_oom"]
    assert attempts[-1]["decision"].startswith("stop: host_oom again after 1 retry")


def test_divergence_stops_without_checkpointing_the_diverged_state(tmp_path: Path) -> None:
    body = CKPT_LOOP.replace(
        "run.log(step, loss=loss.item())",
        "run.log(step, loss=float('nan') if step == 7 else loss.item())",
    )
    body = body.replace("{extra}", "")
    spec = "[checkpoint]\nevery_steps = 3\n[limits]\nmax_restarts = 3\n"
    result = launch(job(tmp_path, body, spec), workspace=tmp_path / "ws", echo=False)
    (first,) = exits(result.record)
    assert first["class"] == "diverged" and first["returncode"] == 3
    assert (
        first["decision"].startswith("stop: diverged")
        and 'on_divergence = "stop"' in first["decision"]
    )
    # The newest checkpoint is step 5, saved before the NaN: nothing after it was saved.
    assert (result.record.checkpoints_dir / "LATEST").read_text().strip() == "step-5"


def test_divergence_rollback_restarts_from_the_checkpoint_before(tmp_path: Path) -> None:
    body = CKPT_LOOP.replace(
        "run.log(step, loss=loss.item())",
        "run.log(step, loss=1e9 if (step == 10 and run.attempt == 1) else loss.item())",
    ).replace("{extra}", "")
    spec = '[checkpoint]\nevery_steps = 3\nkeep_last = 3\n[limits]\nmax_loss = 1e6\non_divergence = "rollback"\nrestart_backoff = 0\n'
    result = launch(job(tmp_path, body, spec), workspace=tmp_path / "ws", echo=False)
    assert result.exit_code == 0, result.verdict
    first, second = exits(result.record)
    assert first["class"] == "diverged"
    (rollback,) = list(result.record.events("rollback"))
    assert rollback["quarantined_step"] == 8
    assert second["work"]["resumed_from"] == 5


def test_time_fault_kills_a_black_box_command(tmp_path: Path) -> None:
    body = "import os, time\nif os.environ['ACCEPTRUN_ATTEMPT'] == '1':\n    time.sleep(60)\n"
    result = launch(
        job(tmp_path, body, "[limits]\nrestart_backoff = 0\n"),
        workspace=tmp_path / "ws",
        echo=False,
        inject=["kill@time=1s"],
    )
    assert result.exit_code == 0, result.verdict
    first, _second = exits(result.record)
    assert first["signal"] == "SIGKILL" and first["class"] == "killed"
    # Killed by the fault once 1 s had passed, before its 60 s sleep ended (that exits 0).
    assert 1.0 <= first["duration_s"] < 60
    (fired,) = list(result.record.events("fault_injected"))
    assert fired["action"] == "kill" and fired["attempt"] == 1 and fired["after_s"] == 1.0
