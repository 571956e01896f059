"""A restore reads a checkpoint's tensors once, hashing them as they load: a real run whose
newest checkpoint's tensors were damaged after the save still resumes from the one before,
bit for bit, and the damaged one is set aside as evidence.

The script saves at steps 2 and 4, then flips one bit of step 4's tensors file (only
that file: its manifest and state.json still verify) and kills itself. The second
attempt's store check leaves the tensors' hash to the loader, which finds the mismatch
before any object changes; the full check then quarantines step 4, and the run resumes
from step 2. Its final weights equal those of a run nothing interrupted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = """
import os, signal, sys
import torch
import acceptrun

torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
print("resumed from", start, flush=True)
for step in run.steps(start, 8):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, 16, generator=g)
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(step, loss=loss.item())
    if step in (2, 4):
        run.checkpoint(step, block=True)
    if step == 5 and run.attempt == 1 and os.environ.get("DAMAGE"):
        path = os.path.join(os.environ["ACCEPTRUN_CHECKPOINT_DIR"], "step-4", "tensors.safetensors")
        data = bytearray(open(path, "rb").read()); data[-1] ^= 1
        open(path, "wb").write(bytes(data))
        os.kill(os.getpid(), signal.SIGKILL)
torch.save({k: v.clone() for k, v in model.state_dict().items()}, sys.argv[1])
"""


def _run(root: Path, damage: bool) -> Path:
    root.mkdir()
    (root / "train.py").write_text(textwrap.dedent(SCRIPT))
    env = '\nenv = { DAMAGE = "1" }' if damage else ""
    (root / "spec.toml").write_text(
        f'name = "onepass"\ncommand = [{json.dumps(sys.executable)}, "train.py", "final.pt"]'
        f"{env}\n[limits]\nrestart_backoff = 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", "ws", "run", "-q", "spec.toml"],
        cwd=root, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = [p for p in (root / "ws" / "runs").iterdir() if not p.name.startswith(".")]
    return record


def _events(record: Path, kind: str) -> list[dict]:
    lines = (record / "events.jsonl").read_text().splitlines()
    return [e for line in lines if (e := json.loads(line)).get("kind") == kind]


def test_damaged_tensors_are_caught_while_loading_and_the_run_resumes_bitwise(
    tmp_path: Path,
) -> None:
    import torch

    record = _run(tmp_path / "damaged", damage=True)
    (quarantined,) = _events(record, "checkpoint_quarantine")
    assert quarantined["step"] == 4, quarantined
    assert "tensors.safetensors: wrong hash" in quarantined["reason"], quarantined
    restored = [e for e in _events(record, "restored") if e["attempt"] == 2]
    assert [e["step"] for e in restored] == [2]
    out = (record / "attempts" / "2" / "stdout.log").read_text()
    assert "resumed from 3" in out
    assert list((record / "checkpoints" / "quarantine").glob("step-4-*"))  # kept, aside

    reference = _run(tmp_path / "reference", damage=False)
    assert not _events(reference, "checkpoint_quarantine")
    a = torch.load(tmp_path / "damaged" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "reference" / "final.pt", weights_only=True)
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name].view(torch.int32), b[name].view(torch.int32)), name
