"""`acceptrun drill`: a clean run, then killed and preempted, compared bit for bit."""

from __future__ import annotations

import json

from acceptrun.record.workspace import RunRecord
from acceptrun.run.drills.operations import run_ops_drill
from conftest import Project

# Deterministic: seeded, one thread, deterministic algorithms, dropout, AdamW, and batches
# drawn from a generator saved with the checkpoint. FORGET_OPTIMIZER leaves the optimizer
# out of run.restore(), the classic resume bug: AdamW's moments restart from zero. A step
# takes 30 ms, so an async save (a few ms here) commits within the next step, as in a
# real job whose steps take longer than saving a small model.
WORKLOAD = """
import os
import time
import torch
from torch import nn
import acceptrun

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(1)
xs, ys = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
batches = torch.Generator().manual_seed(2)

run = acceptrun.init()
state = {"model": model, "batches": batches}
if not os.environ.get("FORGET_OPTIMIZER"):
    state["optimizer"] = opt
start = run.restore(**state)
for step in run.steps(start, 24):
    with run.data_wait():
        idx = torch.randint(0, 64, (16,), generator=batches)
    loss = nn.functional.mse_loss(model(xs[idx]), ys[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.03)
    run.log(step, loss=loss.item())
    run.maybe_checkpoint(step)
with open("weights.bin", "wb") as f:
    f.write(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
run.output("weights", "weights.bin")
run.metric("final/loss", loss.item())
"""

SPEC = """
{env}
[checkpoint]
every_steps = 4
keep_last = 2
[limits]
max_restarts = 2
restart_backoff = 0
grace_period = "20s"
[acceptance]
drills = ["kill", "preempt"]
"""


def test_drill_passes_on_a_deterministic_workload(project: Project) -> None:
    project.spec(WORKLOAD, name="good", extra=SPEC.format(env=""))
    # Two runs and four attempt start-ups (torch's import each): minutes on a busy machine.
    proc = project.cli("drill", "spec.toml", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "operations drill PASSED" in proc.stdout
    reference, drilled = (RunRecord(project.runs_dir / i) for i in project.run_ids())
    report = json.loads(drilled.file("drill.json").read_text())
    assert report["ok"] and report["reference_run"] == reference.run_id
    assert report["spec_hash"] == reference.state["spec_hash"] == drilled.state["spec_hash"]
    # Checkpoints at 3, 7, 11...: killed at 5 (halfway to the second) once step 3's save
    # committed (the client waits for it there, whatever the load), preempted at 16 (70%).
    assert report["faults"] == ["kill@step=5:after=checkpoint:attempt=1", "term@step=16:attempt=2"]
    assert drilled.state["injected"] == report["faults"]
    kill, preempt = report["restarts"]
    assert (kill["last_step"], kill["resume_step"], kill["lost_steps"]) == (5, 3, 2)
    assert (preempt["last_step"], preempt["resume_step"], preempt["lost_steps"]) == (16, 16, 0)
    assert preempt["stopped_checkpoint"] == 16
    assert report["comparison"]["equal"] and report["comparison"]["bitwise"]
    assert report["comparison"]["outputs"]["weights"]["equal"]
    events = {e["drill"]: e for e in drilled.events("drill")}
    assert events["kill"]["ok"] and events["preempt"]["ok"]
    assert "killed at step 5" in events["kill"]["evidence"]
    assert f"bitwise equal to run {reference.run_id}" in events["kill"]["evidence"]
    assert events["preempt"]["lost_steps"] == 0
    # The drills the spec requires are found: the drill run is accepted once they are in.
    assert json.loads(drilled.file("verdict.json").read_text())["accepted"]
    assert drilled.state["verdict"] == "accepted"
    # A later run of the same spec counts the drill run's proof.
    proc = project.cli("run", "-q", "spec.toml", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"passed in drill run {drilled.run_id} of the same spec" in proc.stdout


def test_drill_fails_on_a_resume_that_forgets_the_optimizer(project: Project) -> None:
    spec = project.spec(
        WORKLOAD, name="bad", extra=SPEC.format(env='env = { FORGET_OPTIMIZER = "1" }')
    )
    report = run_ops_drill(spec, workspace=project.workspace)
    assert not report.ok
    first = report.comparison["first_difference"]
    # Attempt 2 resumes after step 3 and redoes step 4 with the right weights (same loss);
    # the first update with AdamW's moments reset shows at step 5.
    assert first["step"] == 5 and first["attempt"] == 2
    assert report.comparison["fresh_start_equal"]  # deterministic: the resume is to blame
    kill = next(d for d in report.drills if d["drill"] == "kill")
    assert not kill["ok"]
    assert "differs from run" in kill["evidence"] and "first at step 5" in kill["evidence"]
