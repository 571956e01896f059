"""Idle detection: a real run that stops working is stopped gracefully (checkpoint first) and
its record says it was idle; the detector's streaks, sources and actions."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from acceptrun.run.launch import launch

# A few real steps, then a wait for something that never comes, with almost no CPU; it
# still looks at stop_requested, as a loop waiting on a queue or a file would.
IDLE_LOOP = """
import time, torch, acceptrun
run = acceptrun.init()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, 100):
    loss = model(torch.ones(2, 4)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(step, loss=loss.item())
    if step >= 3:
        while not run.stop_requested:
            time.sleep(0.05)
"""


@pytest.mark.slow
def test_an_idle_run_is_stopped_gracefully_with_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(IDLE_LOOP))
    (tmp_path / "spec.toml").write_text(
        f'name = "idle"\ncommand = ["{sys.executable}", "train.py"]\n'
        '[limits]\nidle_window = "3s"\n[telemetry]\ninterval = "0.5s"\n'
    )
    result = launch(tmp_path / "spec.toml", workspace=tmp_path / "ws", echo=False)
    record = result.record
    assert result.exit_code == 1  # an idle-stopped run is not accepted
    exit_json = json.loads((record.attempt_dir(1) / "exit.json").read_text())
    assert exit_json["outcome"] == "idle" and exit_json["class"] == "idle"
    assert exit_json["returncode"] == 143  # the client's graceful stop, not a kill
    assert exit_json["reason"].startswith("stopped: idle for ")
    assert "process CPU" in exit_json["reason"] and "< 5%" in exit_json["reason"]
    assert exit_json["work"]["checkpoint_after"] == 3
    assert exit_json["work"]["steps_lost"] == 0
    events = list(record.events())
    kinds = [e["kind"] for e in events]
    assert "kill_sent" not in kinds
    idle = next(e for e in events if e["kind"] == "idle")
    assert idle["source"] == "process" and idle["threshold"] == 5.0
    assert idle["seconds"] >= 3 and idle["activity"] < 5 and idle["attempt"] == 1
    stop = next(e for e in events if e["kind"] == "idle_stop")
    assert stop["reason"] == exit_json["reason"].removeprefix("stopped: ")
    # idle -> idle_stop -> SIGTERM -> the client checkpoints step 3 -> stopped
    order = [
        k for k in kinds if k in ("idle", "idle_stop", "stop_sent", "checkpoint_commit", "stopped")
    ]
    assert order == ["idle", "idle_stop", "stop_sent", "checkpoint_commit", "stopped"]
    assert (record.checkpoints_dir / "step-3" / "MANIFEST.json").exists()
    verdict = json.loads(record.file("verdict.json").read_text())
    (check,) = [c for c in verdict["checks"] if c["name"] == "exit"]
    assert "stopped: idle for" in check["evidence"] and "idle" in check["fix"]
    assert record.state["status"] == "finished"
    # The cost ledger books the idle stretch as idle, not as lost or productive work.
    from acceptrun.cost.ledger import build_ledger

    ledger = build_ledger(record)
    detail = ledger["compute"]["detail_s"]
    assert detail["idle.idle_stop"] >= 3.0
    assert detail["wasted.lost_work"] == 0 and detail["wasted.failed_startup"] == 0
