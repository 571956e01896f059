"""The client API in real training loops either does what a script asks or says loudly
that it did not.

Each test runs real scripts under the real supervisor (or the real client API), and each
failed on the code before the fix it covers: plain values dropped on restore, faults
that never fired in a ``run.log`` loop, a step lost to ``break``, checkpoint metrics of
the step before, an optimizer that pickles differently after a resume, a restore drill
that wrote into the working tree, the same exception retried blindly, an injected kill
described as an unexplained SIGKILL."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.hashing import hash_file
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import LaunchResult, launch
from acceptrun.verdict.decide import compute_verdict
from conftest import PYTHON, Project

LIMITS = '[limits]\nrestart_backoff = 0\ngrace_period = "5s"\n'


def run_spec(
    project: Project,
    script: str,
    *,
    inject: list[str] | None = None,
    extra: str = "",
    limits: str = "max_restarts = 3\n",
) -> LaunchResult:
    spec = project.spec(script, extra=extra + LIMITS + limits)
    return launch(spec, workspace=project.workspace, echo=False, inject=inject or [])


def exits(record: RunRecord) -> list[dict[str, Any]]:
    return [
        json.loads((record.attempt_dir(n) / "exit.json").read_text())
        for n in range(1, 1 + len(list(record.events("attempt_start"))))
    ]


# ---- 1. restore gives back every plain value; the script's own torch.save after it is exact ----

RESUMED_STATE = """
import json
import torch
import acceptrun

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.Adam([{"params": model[0].parameters()},
                        {"params": model[2].parameters(), "lr": 1e-2}], lr=1e-3)
x, y = torch.randn(16, 4), torch.randn(16, 1)   # before restore(), which sets the RNG
counters = {"seen": 0}
history = []
hidden = torch.zeros(1, 3, requires_grad=True)   # an RNN's hidden state, carried over
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt, counters=counters, history=history,
                    hidden=hidden, best=float("inf"), name="fresh")
best = run.restored.get("best", float("inf"))
for step in run.steps(start, 8):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    counters["seen"] += 1
    history.append(step)
    with torch.no_grad():
        hidden += 1
    best = min(best, 10.0 - step)
    run.update_state(best=best, name=f"after {step}")
    run.log(step, loss=loss.item())
    if step % 2 == 1:
        run.checkpoint(step, block=True)
torch.save(opt.state_dict(), "optimizer.pt")
torch.save(model.state_dict(), "model.pt")
json.dump({"counters": counters, "history": history, "hidden": hidden.tolist(), "best": best,
           "name": run.state("name"), "restored": sorted(run.restored)}, open("values.json", "w"))
"""


@pytest.mark.slow
def test_restore_gives_back_plain_values_and_the_optimizer_pickles_byte_identical(
    project: Project,
) -> None:
    run_spec(project, RESUMED_STATE)
    reference = {n: (project.root / n).read_bytes() for n in ("optimizer.pt", "model.pt")}
    for n in (*reference, "values.json"):
        (project.root / n).unlink()
    record = run_spec(project, RESUMED_STATE, inject=["kill@step=4"]).record
    assert [e["resume_step"] for e in record.events("attempt_start")] == [None, 3]
    got = json.loads((project.root / "values.json").read_text())
    # Attempt 2 went on from what step 3 saved, as if never interrupted.
    assert got["counters"] == {"seen": 8}
    assert got["history"] == list(range(8))
    assert got["hidden"] == [[8.0, 8.0, 8.0]]
    assert got["best"] == 3.0
    assert got["name"] == "after 7"
    assert got["restored"] == ["best", "counters", "hidden", "history", "name"]
    # The script's own torch.save of its optimizer and model, after the resume: the bytes
    # of the uninterrupted run.
    for name, data in reference.items():
        assert (project.root / name).read_bytes() == data, name


# ---- 2. injected faults fire in any loop that logs, and a missed one fails the verdict --------

LOG_LOOP = """
import torch
import acceptrun

torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
run = acceptrun.init()
start = run.restore(model=model)
for step in range(start, 8):               # a script's own loop: no run.steps()
    run.log(step, loss=1.0 / (step + 1))
    if step % 3 == 2:
        run.checkpoint(step, block=True)
"""


def test_step_fault_fires_in_a_log_loop(project: Project) -> None:
    record = run_spec(project, LOG_LOOP, inject=["kill@step=4"]).record
    first, second = exits(record)
    assert first["signal"] == "SIGKILL" and second["outcome"] == "success"
    faults = list(record.events("fault_injected"))
    assert [(f["action"], f["step"], f["attempt"]) for f in faults] == [("kill", 4, 1)]
    assert [e["resume_step"] for e in record.events("attempt_start")] == [None, 2]
    assert compute_verdict(record).accepted


# The same loop without the model and its checkpoints (no torch to import): a step fault
# is checked against the steps the script logged, whatever else it does.
LOG_LOOP_ONLY = """
import acceptrun

run = acceptrun.init()
for step in range(8):                      # a script's own loop: no run.steps()
    run.log(step, loss=1.0 / (step + 1))
"""


def test_a_fault_that_never_fired_rejects_the_run(project: Project) -> None:
    record = run_spec(project, LOG_LOOP_ONLY, inject=["kill@step=40"]).record
    (only,) = exits(record)
    assert only["outcome"] == "success"
    verdict = compute_verdict(record)
    assert not verdict.accepted
    (check,) = [c for c in verdict.checks if c.name == "injected faults"]
    assert check.status == "fail" and check.required
    assert "kill@step=40 requested, the run ended at step 7 without it firing" in check.evidence


# ---- 3. break keeps the last step; a checkpoint's metrics are its own step's -------------------

BREAK_LOOP = """
import torch
import acceptrun

model = torch.nn.Linear(2, 1)
run = acceptrun.init()
run.restore(model=model)
for step in run.steps(10):
    run.log(step, loss=100.0 + step)
    run.maybe_checkpoint(step)
    if step == 3:
        break
run.checkpoint(3, block=True)
"""


def test_break_keeps_the_last_step_and_metrics_are_the_steps_own(project: Project) -> None:
    extra = "[checkpoint]\nevery_steps = 2\nkeep_last = 5\n"
    record = run_spec(project, BREAK_LOOP, extra=extra).record
    assert [e["step"] for e in record.events("step")] == [0, 1, 2, 3]
    assert next(e for e in record.events("step") if e["step"] == 3)["loss"] == 103.0
    store = CheckpointStore(record.checkpoints_dir)
    assert {i.step: i.metrics.get("loss") for i in store.list()} == {1: 101.0, 3: 103.0}


def test_an_exception_in_the_loop_does_not_count_as_a_step(project: Project) -> None:
    script = """
    import acceptrun
    run = acceptrun.init()
    for step in run.steps(5):
        run.log(step, loss=1.0)
        undefined_name
    """
    record = run_spec(project, script).record
    assert list(record.events("step")) == []
    (only,) = exits(record)
    assert only["class"] == "user_error"  # a NameError before the first step


# ---- 4. the restore drill never changes the user's files --------------------------------------

WRITES_FILES = """
import os
import torch
import acceptrun

os.makedirs("out", exist_ok=True)
open("train.log", "w").write("started\\n")        # truncates the log, like many scripts
model = torch.nn.Linear(2, 1)
run = acceptrun.init()
start = run.restore(model=model)
for step in run.steps(start, 4):
    run.log(step, loss=1.0)
    with open("out/model.txt", "w") as f:      # the model, saved every step
        f.write(f"weights after step {step}, drill={os.environ.get('ACCEPTRUN_DRILL')}\\n")
    run.maybe_checkpoint(step)
open("train.log", "a").write("done\\n")
run.output("model", "out/model.txt")
"""


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".acceptrun" not in p.parts
    }


@pytest.mark.slow
def test_restore_drill_leaves_outputs_and_working_tree_alone(project: Project) -> None:
    record = run_spec(project, WRITES_FILES, extra="[checkpoint]\nevery_steps = 2\n").record
    (output,) = record.events("output")
    before = tree_hashes(project.root)
    assert before["train.log"] == hashlib.sha256(b"started\ndone\n").hexdigest()
    drill = project.cli("ckpt", "drill", record.run_id, timeout=300)
    assert drill.returncode == 0, drill.stdout + drill.stderr
    (result,) = [e for e in record.events("drill") if e.get("drill") == "restore"]
    assert result["ok"], result
    assert tree_hashes(project.root) == before
    assert hash_file(Path(output["path"]))[0] == output["hash"]  # as registered


# ---- 5. the same exception twice is not retried blindly; nccl on a CPU run is flagged ---------

SAME_ERROR_AT_STEP = """
import torch
import acceptrun

model = torch.nn.Linear(2, 1)
run = acceptrun.init()
start = run.restore(model=model)
for step in run.steps(start, 6):
    run.log(step, loss=1.0)
    if step == 3:
        raise ValueError("batch 3 has shape (7,) where (8,) was expected")
    run.checkpoint(step, block=True)
"""


def test_same_exception_at_the_same_step_stops_as_user_error(project: Project) -> None:
    result = run_spec(project, SAME_ERROR_AT_STEP, limits="max_restarts = 4\n")
    record = result.record
    attempts = exits(record)
    assert len(attempts) == 2  # not 5: the second failure proved it deterministic
    last = attempts[-1]
    assert last["class"] == "user_error", last
    text = "\n".join(last["evidence"])
    assert "attempt 1" in text and "attempt 2" in text
    assert text.count("ValueError: batch 3 has shape (7,)") == 2
    assert "attempts/1/stderr.log" in text and "attempts/2/stderr.log" in text
    assert last["decision"].startswith("stop")


def test_same_exception_before_the_first_step_stops_as_user_error(project: Project) -> None:
    script = """
    import acceptrun
    run = acceptrun.init()
    raise RuntimeError("config: hidden_size 100 is not a multiple of heads 12")
    """
    record = run_spec(project, script).record
    attempts = exits(record)
    assert len(attempts) == 2
    assert attempts[0]["class"] == "failed" and attempts[1]["class"] == "user_error"
    assert "before the first step" in attempts[1]["class_reason"]


def test_different_failures_are_still_retried(project: Project) -> None:
    script = """
    import os
    import acceptrun
    run = acceptrun.init()
    attempt = int(os.environ["ACCEPTRUN_ATTEMPT"])
    if attempt < 3:
        raise RuntimeError(f"flaky mount, try {attempt}")
    """
    record = run_spec(project, script).record
    attempts = exits(record)
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "success"]


# ---- 6. an injected supervisor kill is described as injected ----------------------------------


def test_injected_time_kill_is_described_as_injected(project: Project) -> None:
    spec = project.spec(
        command=[PYTHON, "-c", "import time; time.sleep(30)"],
        extra="[limits]\nmax_restarts = 0\n",
    )
    record = launch(spec, workspace=project.workspace, echo=False, inject=["kill@time=0.5s"]).record
    (only,) = exits(record)
    assert only["signal"] == "SIGKILL"
    assert "injected fault kill@time=0.5s" in only["reason"]
    assert "injected fault kill@time=0.5s" in only["class_reason"]
    assert "not by the supervisor" not in only["class_reason"]
