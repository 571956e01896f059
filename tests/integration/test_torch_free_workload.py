"""A workload that never imports torch checkpoints, is killed and resumes, still without torch.

torch is an optional extra: a numpy loop, an inference job or a JAX model's host copy
checkpoints plain values and numpy arrays. The client must not import torch on such a
script's behalf (seconds of CPU and hundreds of MB at every start), and the resume must
still be exact: the values and the Python and NumPy RNG states come back.
"""

from __future__ import annotations

import json

from conftest import Project

WORKLOAD = """\
import json, os, random, signal, sys
import numpy as np
import acceptrun

run = acceptrun.init()
rng = np.random.default_rng(0)  # a generator of the script's own: its state is saved below
weights = np.zeros(4)
history = []
start = run.restore(weights=weights, history=history, rng=rng.bit_generator.state)
if start:
    rng.bit_generator.state = run.restored["rng"]
np.random.seed(1) if not start else None
random.seed(2) if not start else None
for step in run.steps(start, 10):
    weights += rng.normal(size=4) + np.random.rand(4) + random.random()
    history.append(float(weights.sum()))
    run.update_state(rng=rng.bit_generator.state)
    run.log(step=step, loss=float(abs(weights).mean()))
    run.checkpoint(step, block=True)
    if step == 6 and os.environ["ACCEPTRUN_ATTEMPT"] == "1":
        print("torch imported:", "torch" in sys.modules, file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
print("torch imported:", "torch" in sys.modules, file=sys.stderr, flush=True)
with open("result.json", "w") as f:
    json.dump({"weights": weights.tolist(), "history": history}, f)
"""


def expected() -> dict[str, list[float]]:
    """The same computation, never interrupted."""
    import random

    import numpy as np

    rng = np.random.default_rng(0)
    np.random.seed(1)
    random.seed(2)
    weights, history = np.zeros(4), []
    for _ in range(10):
        weights += rng.normal(size=4) + np.random.rand(4) + random.random()
        history.append(float(weights.sum()))
    return {"weights": weights.tolist(), "history": history}


def test_killed_torch_free_workload_resumes_exactly_without_importing_torch(
    project: Project,
) -> None:
    spec = project.spec(WORKLOAD, name="numpy-loop")
    proc = project.cli("run", "-q", str(spec), timeout=600)
    record = project.only_record()
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    events = [json.loads(line) for line in (record.path / "events.jsonl").read_text().splitlines()]
    restored = [e for e in events if e["kind"] == "restored"]
    assert [(e["attempt"], e["step"]) for e in restored] == [(2, 6)], restored
    stderr = sorted(record.path.glob("attempts/*/stderr.log"))
    assert len(stderr) == 2
    for log in stderr:
        assert "torch imported: False" in log.read_text(), log.read_text()[-2000:]
    result = json.loads((project.root / "result.json").read_text())
    assert result == expected()  # bit for bit: JSON keeps every float's repr
