"""Figures on the scripts people bring: what ``show`` says against what the verdict says.

Real ``acceptrun run`` processes over scripts that know nothing of acceptrun, shaped like
public examples; each asserts a figure against the truth known from the script's own
output. A script that must be killed blocks at a known point, and the test kills it
once the record shows what it waits for.
"""

from __future__ import annotations

import json

from blackbox_harness import events, kill_when

from acceptrun.record.workspace import RunRecord
from conftest import Project

# Shaped like a black box that prints a line every 10 iterations and saves its state
# atomically every 20 (a numbered file, as Hugging Face's checkpoint-N/ are); it resumes
# from its newest save by itself. Attempt 1 waits, after iteration 55, to be killed.
EVERY_TEN = """
import glob, json, os, signal
os.makedirs("out", exist_ok=True)
saves = sorted(glob.glob("out/ckpt-*.json"), key=lambda p: int(p.split("-")[1][:-5]))
start = json.load(open(saves[-1]))["step"] if saves else 0
if start:
    print(f"resuming from iteration {start}", flush=True)
for it in range(start + 1, 101):
    if it % 10 == 0:
        print(f"iter {it}: loss {1.0 / it:.5f}", flush=True)
    if it % 20 == 0:
        with open("out/tmp.json", "w") as f:
            json.dump({"step": it}, f)
        os.replace("out/tmp.json", f"out/ckpt-{it}.json")
    if start == 0 and it == 55:
        signal.pause()  # killed here
"""


def test_shows_restart_hint_counts_the_steps_the_verdict_counts(project: Project) -> None:
    spec = project.spec(
        EVERY_TEN,
        extra="""
        [checkpoint]
        watch = ["out/ckpt-*.json"]
        keep_last = 5
        [progress]
        pattern = 'iter (?P<step>\\d+): loss (?P<loss>[0-9.]+)'
        [limits]
        restart_backoff = "1s"
        """,
    )
    rc, out = kill_when(
        project, spec, lambda e: e["kind"] == "checkpoint_captured" and e["step"] == 40,
        "the save of iteration 40 captured",
    )  # fmt: skip
    assert rc == 0, out
    rec = project.only_record()
    log = (rec.path / "attempts" / "2" / "stdout.log").read_text()
    assert "resuming from iteration 40" in log, log
    exit1 = json.loads((rec.path / "attempts" / "1" / "exit.json").read_text())
    lost = exit1["work"]["steps_lost"]
    assert lost == 10, exit1  # iteration 50 was the last one reported; 40 was saved
    show = project.cli("show", rec.run_id, check_rc=0).stdout
    hint = next((line for line in show.splitlines() if "restarts cost" in line), "")
    assert f"{lost} steps redone" in hint, show
    # A black box saves on its own schedule: the fix is the script's, not a spec key.
    assert "checkpoint.every_steps" not in hint, hint
    assert "have the script save more often" in hint, hint
    # The start-up figures say whose they are: attempt 1's, or every attempt's together.
    assert "attempt 1's first step after" in show and "to each first step" in show, show
    verdict = json.loads(rec.file("verdict.json").read_text())
    (first,) = [c for c in verdict["checks"] if c["name"] == "first step"]
    assert first["evidence"].startswith("attempt 1's first step "), first


# The loop of most examples: a loss and the batch's size logged every step.
LOGS_SAMPLES = """
import numpy as np
import acceptrun

run = acceptrun.init()
w = np.zeros(4)
start = run.restore(w=w)
for step in run.steps(start, 10):
    w += 1.0
    run.log(step, loss=1.0 / (step + 1), samples=8, lr=0.1)
    run.maybe_checkpoint(step)
"""


def test_a_checkpoints_metrics_are_not_its_batch_size(project: Project) -> None:
    from acceptrun.checkpoint.store import CheckpointStore

    spec = project.spec(LOGS_SAMPLES, extra="[checkpoint]\nevery_steps = 5\n")
    project.cli("run", "-q", str(spec), check_rc=0)
    rec = project.only_record()
    infos = CheckpointStore(rec.checkpoints_dir).list()
    assert infos and all(set(i.metrics) == {"loss", "lr"} for i in infos), [
        i.metrics for i in infos
    ]
    ls = project.cli("ckpt", "ls", rec.run_id, check_rc=0).stdout
    assert "loss=" in ls and "samples=" not in ls, ls


# A black box that reports no step at all and saves atomically; attempt 1 waits, after
# its save, to be killed.
NO_PROGRESS = """
import json, os, signal
os.makedirs("out", exist_ok=True)
if os.path.exists("out/state.json"):
    print("resuming from", json.load(open("out/state.json"))["step"], flush=True)
else:
    with open("out/tmp.json", "w") as f:
        json.dump({"step": 7}, f)
    os.replace("out/tmp.json", "out/state.json")
    signal.pause()  # killed here
"""


def test_a_resume_from_a_step_that_is_an_estimate_says_so(project: Project) -> None:
    spec = project.spec(
        NO_PROGRESS,
        extra='[checkpoint]\nwatch = ["out/state.json"]\n[limits]\nrestart_backoff = "0s"\n',
    )
    rc, out = kill_when(
        project, spec, lambda e: e["kind"] == "checkpoint_commit", "the save captured"
    )
    assert rc == 0, out
    rec = project.only_record()
    assert "resuming from 7" in (rec.path / "attempts" / "2" / "stdout.log").read_text()
    verdict = json.loads(rec.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "resumed"]
    # No step was ever reported: the stored step is a number, not the script's 7, and
    # the verdict says it is an estimate.
    assert "(an estimate: no step was reported before the file was written)" in row["evidence"], row


# Shaped like nanoGPT's train.py: one unnumbered checkpoint file written at each
# evaluation (every 50 iterations here; its own iter_num inside), a line every 10
# iterations, a resume from the file by itself. With SIDECAR=1 it also writes the step
# beside it in a form acceptrun reads (out/ckpt.json). Attempt 1 waits, after iteration
# 65, to be killed.
NANOGPT_SHAPED = """
import json, os, signal
os.makedirs("out", exist_ok=True)
iter_num = 0
if os.path.exists("out/ckpt.pt"):
    iter_num = json.load(open("out/ckpt.pt"))["iter_num"]
    print(f"resuming from iteration {iter_num}", flush=True)
resumed = iter_num > 0
while iter_num <= 100:
    if iter_num % 50 == 0 and iter_num > 0:
        with open("out/ckpt.pt", "w") as f:
            json.dump({"iter_num": iter_num}, f)
        if os.environ.get("SIDECAR") == "1":
            with open("out/ckpt.json", "w") as f:
                json.dump({"iter_num": iter_num}, f)
    if iter_num % 10 == 0:
        print(f"iter {iter_num}: loss {1.0 / (iter_num + 1):.5f}", flush=True)
    if not resumed and iter_num == 65:
        signal.pause()  # killed here
    iter_num += 1
"""


def _nanogpt_run(project: Project, sidecar: bool) -> tuple[RunRecord, str]:
    spec = project.spec(
        NANOGPT_SHAPED,
        extra=f"""
        [env]
        SIDECAR = "{int(sidecar)}"
        [checkpoint]
        watch = ["out/ckpt.pt"]
        [progress]
        pattern = 'iter (?P<step>\\d+): loss (?P<loss>[0-9.]+)'
        [limits]
        restart_backoff = "0s"
        """,
    )
    rc, out = kill_when(
        project, spec, lambda e: e["kind"] == "checkpoint_captured", "the save of 50 captured"
    )
    assert rc == 0, out
    rec = project.only_record()
    log = (rec.path / "attempts" / "2" / "stdout.log").read_text()
    assert "resuming from iteration 50" in log, log
    return rec, project.cli("ckpt", "ls", rec.run_id, check_rc=0).stdout


def test_a_checkpoint_that_says_its_step_beside_it_is_dated_by_it(project: Project) -> None:
    rec, ls = _nanogpt_run(project, sidecar=True)
    (captured,) = [
        e for e in events(project) if e["kind"] == "checkpoint_captured" and e["step"] == 50
    ]
    assert captured["dated_by"] == "iter_num in ckpt.json", captured
    assert "step_estimate" not in captured, captured
    assert "~" not in ls, ls
    exit1 = json.loads((rec.path / "attempts" / "1" / "exit.json").read_text())
    assert exit1["work"]["steps_lost"] == 10, exit1  # 60 last reported, 50 saved
    verdict = json.loads(rec.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "resumed"]
    assert "step 50" in row["evidence"] and "estimate" not in row["evidence"], row


def test_an_unnumbered_checkpoint_dated_by_sparse_lines_says_its_step_is_an_estimate(
    project: Project,
) -> None:
    rec, ls = _nanogpt_run(project, sidecar=False)
    first = next(e for e in events(project) if e["kind"] == "checkpoint_captured")
    assert first.get("step_estimate"), first
    assert "~ = its step is an estimate" in ls, ls
    verdict = json.loads(rec.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "resumed"]
    assert "(an estimate: " in row["evidence"], row


# Shaped like the Trainer under run_clm.py as a black box: a progress bar on stderr (tqdm:
# carriage returns, "N/total [") that draws 0/60 first and, resumed, jumps to the first
# step after the checkpoint; it saves checkpoint-N/ every 20 steps (the step in the
# directory's name and its trainer_state.json) and resumes from the newest one by
# itself. Attempt 1 waits, after step 50, to be killed.
TRAINER_BAR = """
import glob, json, os, signal, sys
os.makedirs("out", exist_ok=True)
saves = sorted(glob.glob("out/checkpoint-*"), key=lambda p: int(p.rsplit("-", 1)[1]))
start = json.load(open(saves[-1] + "/trainer_state.json"))["global_step"] if saves else 0
def bar(n):
    # tqdm's redraw: a carriage return, then the bar (ended here too, so the step's line is
    # complete when it is drawn and not only at the next redraw)
    sys.stderr.write(f"\\r{100 * n // 60:3d}%|          | {n}/60 [00:00<00:00, 9.9it/s]\\r")
    sys.stderr.flush()
bar(0)  # the Trainer's bar starts at 0, resumed or not
for step in range(start + 1, 61):
    bar(step)
    if step % 20 == 0:
        os.makedirs(f"out/tmp-{step}", exist_ok=True)
        with open(f"out/tmp-{step}/trainer_state.json", "w") as f:
            json.dump({"global_step": step}, f)
        os.replace(f"out/tmp-{step}", f"out/checkpoint-{step}")
    if start == 0 and step == 50:
        signal.pause()  # killed here
sys.stderr.write("\\n")
"""


def test_a_resumed_progress_bar_counts_the_steps_the_attempt_ran(project: Project) -> None:
    spec = project.spec(
        TRAINER_BAR,
        extra="""
        [checkpoint]
        watch = ["out/checkpoint-*"]
        keep_last = 5
        [progress]
        pattern = '(?P<step>\\d+)/(?P<total_steps>\\d+) \\['
        stream = "stderr"
        [limits]
        restart_backoff = "0s"
        """,
    )
    rc, out = kill_when(
        project,
        spec,
        lambda e: e["kind"] == "checkpoint_commit" and e.get("step") == 40,
        "the save of step 40 captured",
    )
    assert rc == 0, out
    rec = project.only_record()
    exits = [
        json.loads((rec.path / "attempts" / str(n) / "exit.json").read_text())["work"]
        for n in (1, 2)
    ]
    # Attempt 1 ran steps 1..last (its bar's 0/60 is no step). Attempt 2 ran 41..60 after
    # the checkpoint of step 40: its bar's 0/60 is no step, its 41/60 is one step.
    assert exits[0]["first_step"] == 1, exits[0]
    assert exits[0]["steps_done"] == exits[0]["last_step"], exits[0]
    assert exits[1]["resumed_from"] == 40, exits[1]
    assert (exits[1]["first_step"], exits[1]["steps_done"]) == (41, 20), exits[1]
    steps2 = [e for e in rec.events("step") if e["attempt"] == 2]
    assert steps2[0]["step"] == 41 and "span" not in steps2[0], steps2[0]
