"""Specs the Slurm backend cannot run are refused (a real Slurm:
tests/integration/test_slurm.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from acceptrun.backends.slurm import JOBS_FILE, submit
from acceptrun.errors import UserError
from acceptrun.record.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

TRAIN = """\
import os, time
import torch
import acceptrun

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
total = int(os.environ["TOTAL"])
for step in run.steps(start, total):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
    loss = (model(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.log(step, loss=loss.item())
    run.maybe_checkpoint(step)
    time.sleep(float(os.environ["STEP_S"]))
run.metric("final/loss", loss.item())
"""


def make_spec(root: Path, *, total: int, step_s: float, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(TRAIN)
    spec = root / "spec.toml"
    spec.write_text(
        f'name = "tiny"\ncommand = ["{sys.executable}", "train.py"]\n'
        f'env = {{ TOTAL = "{total}", STEP_S = "{step_s}" }}\n'
        "[checkpoint]\nevery_steps = 5\n"
        '[limits]\ngrace_period = "15s"\n'
        f'[slurm]\nsignal_grace = "60s"\n{extra}'
    )
    return spec


# ---- the batch script ---------------------------------------------------------------------------


def test_specs_slurm_cannot_run_are_refused(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / ".acceptrun")
    slow_stop = make_spec(tmp_path / "a", total=1, step_s=0)
    slow_stop.write_text(slow_stop.read_text().replace('"15s"', '"90s"'))
    with pytest.raises(
        UserError, match=r"limits.grace_period = 1m30s is not shorter than slurm.signal_grace"
    ):
        submit(slow_stop, ws)
    nodes = make_spec(tmp_path / "b", total=1, step_s=0, extra="[resources]\nnodes = 2\n")
    text = nodes.read_text()
    command = next(line for line in text.splitlines() if line.startswith("command = "))
    nodes.write_text(text.replace(command, 'command = "python train.py"'))
    with pytest.raises(
        UserError, match=r"resources\.nodes = 2 with command .*needs the command as a list"
    ):
        submit(nodes, ws)
    assert not (ws.root / JOBS_FILE).exists() and not (ws.root / "slurm").exists()
