"""The memory tier for real: a tiny torch run saved to host memory every step and to disk
every 10, killed mid-interval, resumes from memory and ends bitwise equal to a run that was
never killed; a corrupted memory copy falls back to the disk and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.memtier import PREFIX, SHM
from acceptrun.checkpoint.owner import open_run_store
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch
from conftest import Project, run_main

# The demo's shape: a small MLP, AdamW, a batch drawn from a generator seeded by the step.
# CORRUPT=1: attempt 1 flips a byte in the tensors of the memory copy of step KILL before
# the injected kill fires at the end of that step.
WORKLOAD = """
import hashlib, os, pathlib
import torch
from torch import nn
import acceptrun

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
KILL = int(os.environ["KILL"])
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, 30):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.log(step, loss=loss.item())
    run.maybe_checkpoint(step)
    if run.attempt == 1 and step == 9:
        run._checkpointer.wait()  # step 9 is on disk before the kill, however loaded the machine
    if os.environ.get("CORRUPT") and run.attempt == 1 and step == KILL:
        run._memtier.wait()  # the save of this step is in memory: now damage it
        tensors = pathlib.Path(os.environ["ACCEPTRUN_MEMORY_DIR"], f"step-{step}", "tensors.safetensors")
        data = bytearray(tensors.read_bytes())
        data[-3] ^= 0xFF
        tensors.write_bytes(bytes(data))
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
pathlib.Path(f"digest-{run.run_id}.txt").write_text(digest.hexdigest())
"""

KILL = 15  # mid-interval: the durable saves are of steps 9, 19 and 29


def _spec(project: Project, *, corrupt: bool) -> Path:
    env = f'KILL = "{KILL}"' + (', CORRUPT = "1"' if corrupt else "")
    return project.spec(
        WORKLOAD,
        extra=f"env = {{ {env} }}\n[checkpoint]\nevery_steps = 10\nmemory_every = 1\n"
        "[limits]\nrestart_backoff = 0\nmax_restarts = 1\n",
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final weights' digest of the run never killed (one run for the module)."""
    root = tmp_path_factory.mktemp("reference")
    project = Project(root=root, workspace=root / ".acceptrun")
    record = launch(_spec(project, corrupt=False), workspace=project.workspace, echo=False).record
    return (root / f"digest-{record.run_id}.txt").read_text()


def _killed(project: Project, *, corrupt: bool) -> tuple[RunRecord, str]:
    """A run killed at step KILL and restarted: its record and its final weights' digest."""
    spec = _spec(project, corrupt=corrupt)
    killed = launch(spec, workspace=project.workspace, echo=False, inject=[f"kill@step={KILL}"])
    record = killed.record
    assert record.state["verdict"] == "accepted", killed.verdict
    return record, (project.root / f"digest-{record.run_id}.txt").read_text()


def _restored(record: RunRecord) -> dict[str, Any]:
    (restored,) = [e for e in record.events("restored") if e["attempt"] == 2]
    return restored


def test_a_kill_resumes_from_memory_losing_at_most_a_step_bitwise(
    project: Project, reference: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record, digest = _killed(project, corrupt=False)
    assert digest == reference  # bitwise: the weights of a run that was never killed
    restored = _restored(record)
    assert restored["source"] == "memory", restored
    assert restored["step"] in (KILL - 1, KILL), restored  # 0 or 1 step lost
    assert Path(restored["path"]).parent == SHM / f"{PREFIX}{record.run_id}"
    (tier,) = record.events("memory_tier")
    assert tier["shared"] is True and "note" not in tier
    saves = [e for e in record.events("memory_saves") if e["attempt"] == 2]
    assert saves and saves[0]["saves"] > 0 and "error" not in saves[0]
    # The durable side never saw the memory copies: the supervisor resumed attempt 2 from
    # the disk's step 9, and the store (ckpt ls, keep_last, the mirror) holds durable steps.
    starts = [e.get("resume_step") for e in record.events("attempt_start")]
    assert starts == [None, 9], starts
    store = open_run_store(record, record.spec, retention=False)
    assert sorted(i.step for i in store.list()) == [19, 29]
    (check,) = [c for c in record.read_json("verdict.json")["checks"] if c["name"] == "recovery"]
    assert "from memory" in check["evidence"], check
    assert not (SHM / f"{PREFIX}{record.run_id}").exists()  # the close freed it
    # The interval advice reads the tier's measured stall from the run's memory_saves.
    code, out, err = run_main(capsys, "--workspace", str(project.workspace), "ckpt", "plan",
                              str(record.spec_path), "--gpus", "16384", "--work", "54d", "--json")  # fmt: skip
    assert code == 0, err
    plan = json.loads(out)
    own = sum(e["saves"] for e in record.events("memory_saves"))
    memory = plan["inputs"]["memory_save"]
    assert (
        memory["from"]
        == f"run {record.run_id}: measured: the mean stall of {own} save(s) to memory"
    )
    stall = sum(e["stall_s"] for e in record.events("memory_saves"))
    assert memory["seconds"] == pytest.approx(stall / own)
    assert plan["memory_tier"]["ettr"] >= plan["memory_tier"]["without"]["ettr"]


def test_a_corrupted_memory_copy_falls_back_to_the_disk_and_says_so(
    project: Project, reference: str
) -> None:
    record, digest = _killed(project, corrupt=True)
    assert digest == reference
    restored = _restored(record)
    assert restored["source"] == "disk" and restored["step"] == 9, restored
    assert f"memory copy of step {KILL} failed verification" in restored["memory"], restored
    (check,) = [c for c in record.read_json("verdict.json")["checks"] if c["name"] == "recovery"]
    assert "from disk" in check["evidence"], check
