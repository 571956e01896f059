"""Figures on the scripts people bring: what ``show`` says against what the verdict says.

Real ``acceptrun run`` processes over scripts that know nothing of acceptrun, shaped like
public examples; each asserts a figure against the truth known from the script's own
output. A script that must be killed blocks at a known point, and the test kills it
once the record shows what it waits for.
"""

from __future__ import annotations

import json
import re
from typing import Any

from blackbox_harness import events, kill_when

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import Project


def printed(record: RunRecord, attempt: int, pattern: str) -> list[int]:
    """The numbers the script printed on its stdout in lines that match ``pattern`` (one
    group), in order: the truth each figure is checked against."""
    log = record.file(f"attempts/{attempt}/stdout.log").read_text()
    return [int(m.group(1)) for m in re.finditer(pattern, log, re.M)]


def work(record: RunRecord, attempt: int) -> dict[str, Any]:
    """What exit.json says the attempt did and lost."""
    return json.loads(record.file(f"attempts/{attempt}/exit.json").read_text())["work"]


def restart_hint(project: Project, record: RunRecord) -> str:
    """The line of ``acceptrun show`` that says what the restarts cost."""
    show = project.cli("show", record.run_id, check_rc=0).stdout
    hint = next((line for line in show.splitlines() if "restarts cost" in line), "")
    assert hint, show
    return hint


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
# iterations, a resume from the file by itself. The save comes before the line that names
# its step. With SIDECAR=1 it also writes the step beside it in a form acceptrun reads
# (out/ckpt.json). It prints what it saved, where it resumed from and where it waits, to
# be killed, in attempt 1: after the line of iteration 60.
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
        print(f"saved iteration {iter_num}", flush=True)
    if iter_num % 10 == 0:
        print(f"iter {iter_num}: loss {1.0 / (iter_num + 1):.5f}", flush=True)
    if not resumed and iter_num == 60:
        print(f"waiting at iteration {iter_num}", flush=True)
        signal.pause()  # killed here
    iter_num += 1
"""
ITER, SAVED = r"^iter (\d+): loss", r"^saved iteration (\d+)"


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
        restart_backoff = "1s"
        """,
    )  # a backoff of 1 s: restarts cost enough for show's restart hint, on any machine
    rc, out = kill_when(
        project, spec, lambda e: e["kind"] == "checkpoint_captured", "the save of 50 captured"
    )
    assert rc == 0, out
    rec = project.only_record()
    assert printed(rec, 1, SAVED) == [50], rec.file("attempts/1/stdout.log")
    assert printed(rec, 2, r"^resuming from iteration (\d+)") == [50]
    return rec, project.cli("ckpt", "ls", rec.run_id, check_rc=0).stdout


def _nanogpt_truth(rec: RunRecord) -> dict[str, Any]:
    """The figures as the script's own lines give them: each attempt's first and last
    step and the steps between (every iteration between two lines ran), the step saved
    and resumed from, and the steps attempt 1 ran past it."""
    iters = {n: printed(rec, n, ITER) for n in (1, 2)}
    (killed_at,) = printed(rec, 1, r"^waiting at iteration (\d+)")
    assert iters[1][-1] == killed_at, iters  # its last line is the last iteration it ran
    (resumed_from,) = printed(rec, 2, r"^resuming from iteration (\d+)")
    return {
        "steps": {n: (i[0], i[-1], i[-1] - i[0] + 1) for n, i in iters.items()},
        # attempt 2 saves 50 again, the same content, on its way: one save of each step
        "saved": sorted({*printed(rec, 1, SAVED), *printed(rec, 2, SAVED)}),
        "resumed_from": resumed_from,
        "lost": killed_at - resumed_from,
    }


def test_a_checkpoint_that_says_its_step_beside_it_is_dated_by_it(project: Project) -> None:
    rec, ls = _nanogpt_run(project, sidecar=True)
    truth = _nanogpt_truth(rec)
    (captured,) = [
        e for e in events(project) if e["kind"] == "checkpoint_captured" and e["step"] == 50
    ]
    assert captured["dated_by"] == "iter_num in ckpt.json", captured
    assert "step_estimate" not in captured, captured
    assert "~" not in ls, ls
    # Every save is stored under the step the script saved, and nothing else is.
    assert [i.step for i in CheckpointStore(rec.checkpoints_dir).list()] == truth["saved"]
    assert truth["saved"] == [50, 100], truth
    works = {n: work(rec, n) for n in (1, 2)}
    for n in (1, 2):
        first, last, done = truth["steps"][n]
        got = works[n]
        assert (got["first_step"], got["last_step"], got["steps_done"]) == (first, last, done), got
    assert works[2]["resumed_from"] == truth["resumed_from"], works[2]
    assert works[1]["steps_lost"] == truth["lost"] == 10, (works[1], truth)  # 60 ran, 50 saved
    verdict = json.loads(rec.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "resumed"]
    assert "step 50" in row["evidence"] and "estimate" not in row["evidence"], row
    # show's restart hint counts the steps the verdict counts: a line every 10 iterations
    # stands for 10 steps, and attempt 2, resumed from 50, ran again those of the line of
    # 60 (51..60), none of those of the line of 50 that it printed again.
    hint = restart_hint(project, rec)
    assert f"(1 restart, {truth['lost']} steps redone)" in hint, hint


def test_an_unnumbered_checkpoint_dated_by_sparse_lines_says_its_step_is_an_estimate(
    project: Project,
) -> None:
    """Without the sidecar, the file's step is known only from the lines read before it was
    written: at most the step it holds (the line naming its step comes after the save, and
    a line may be read late), so the stored step, the step resumed from, and the lost steps
    counted from it are estimates, and each figure says so and which way it errs."""
    rec, ls = _nanogpt_run(project, sidecar=False)
    truth = _nanogpt_truth(rec)
    captured = [e for e in events(project) if e["kind"] == "checkpoint_captured"]
    assert len(captured) == len(truth["saved"]) == 2, (captured, truth)
    for e, saved in zip(captured, truth["saved"], strict=True):
        # An estimate, and one that errs towards an earlier step: never past the truth.
        assert e.get("step_estimate"), e
        assert e["step"] <= saved, (e, truth)
    stored = [i.step for i in CheckpointStore(rec.checkpoints_dir).list()]
    assert stored == [e["step"] for e in captured], (stored, captured)
    assert "~ = its step is an estimate" in ls, ls
    works = {n: work(rec, n) for n in (1, 2)}
    for n in (1, 2):
        first, last, done = truth["steps"][n]  # the lines themselves are exact
        got = works[n]
        assert (got["first_step"], got["last_step"], got["steps_done"]) == (first, last, done), got
    resumed = works[2]["resumed_from"]
    assert resumed == captured[0]["step"] <= truth["resumed_from"], (works[2], truth)
    verdict = json.loads(rec.file("verdict.json").read_text())
    (row,) = [c for c in verdict["checks"] if c["name"] == "resumed"]
    assert f"from step {resumed} (an estimate: " in row["evidence"], row
    # Lost steps counted from a step that may be too early: at least the truth, and said
    # to be at most that many, in exit.json, the verdict and show's restart hint alike.
    lost = works[1]["steps_lost"]
    assert lost == truth["steps"][1][1] - resumed >= truth["lost"], (works[1], truth)
    assert works[1].get("lost_at_most") is True, works[1]
    (failures,) = [c for c in verdict["checks"] if c["name"] == "failures"]
    # At most: from the estimate's step, and up to 9 steps run unseen after the last line
    # (a line every 10 iterations): record/lost.py's range.
    most = works[1]["steps_lost_range"][1]
    assert most == lost + 9 and f"lost at most {most} steps" in failures["evidence"], failures
    hint = restart_hint(project, rec)
    assert f"at most {lost} steps redone" in hint, hint


# Shaped like the Trainer under run_clm.py as a black box: a progress bar on stderr (tqdm:
# carriage returns, "N/total [") that draws 0/60 first and, resumed, jumps to the first
# step after the checkpoint; it saves checkpoint-N/ every 20 steps (the step in the
# directory's name and its trainer_state.json) and resumes from the newest one by
# itself. It prints on stdout what it saved, where it resumed from and where it waits, to
# be killed, in attempt 1: after step 50.
TRAINER_BAR = """
import glob, json, os, signal, sys
os.makedirs("out", exist_ok=True)
saves = sorted(glob.glob("out/checkpoint-*"), key=lambda p: int(p.rsplit("-", 1)[1]))
start = json.load(open(saves[-1] + "/trainer_state.json"))["global_step"] if saves else 0
if start:
    print(f"resuming from checkpoint-{start}", flush=True)
def bar(n):
    # tqdm's redraw: a carriage return, then the bar (ended here too, so the step's line is
    # complete when it is drawn and not only at the next redraw)
    sys.stderr.write(f"\\r{100 * n // 60:3d}%|          | {n}/60 [00:00<00:00, 9.9it/s]\\r")
    sys.stderr.flush()
bar(0)  # the Trainer's bar starts at 0, resumed or not
for step in range(start + 1, 61):
    bar(step)
    print(f"step {step} done", flush=True)
    if step % 20 == 0:
        os.makedirs(f"out/tmp-{step}", exist_ok=True)
        with open(f"out/tmp-{step}/trainer_state.json", "w") as f:
            json.dump({"global_step": step}, f)
        os.replace(f"out/tmp-{step}", f"out/checkpoint-{step}")
        print(f"saved checkpoint-{step}", flush=True)
    if start == 0 and step == 50:
        print(f"waiting at step {step}", flush=True)
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
        restart_backoff = "1s"
        """,
    )  # a backoff of 1 s: restarts cost enough for show's restart hint, on any machine
    rc, out = kill_when(
        project,
        spec,
        lambda e: e["kind"] == "checkpoint_commit" and e.get("step") == 40,
        "the save of step 40 captured",
    )
    assert rc == 0, out
    rec = project.only_record()
    # The truth, from the script's own stdout: the steps each attempt ran, what it saved,
    # where attempt 2 resumed from and where attempt 1 was killed.
    ran = {n: printed(rec, n, r"^step (\d+) done") for n in (1, 2)}
    saved = [s for n in (1, 2) for s in printed(rec, n, r"^saved checkpoint-(\d+)")]
    (killed_at,) = printed(rec, 1, r"^waiting at step (\d+)")
    (resumed_from,) = printed(rec, 2, r"^resuming from checkpoint-(\d+)")
    assert (ran[1][-1], saved, resumed_from) == (killed_at, [20, 40, 60], 40), (ran, saved)
    works = [work(rec, n) for n in (1, 2)]
    # Each attempt's bar draws 0/60 before its first step: no step. Attempt 1 ran steps
    # 1..50; attempt 2, after the checkpoint of step 40, ran 41..60 (its 41/60 is one step).
    for n, got in enumerate(works, 1):
        want = (ran[n][0], ran[n][-1], len(ran[n]))
        assert (got["first_step"], got["last_step"], got["steps_done"]) == want, (n, got)
    assert works[1]["resumed_from"] == resumed_from, works[1]
    steps2 = [e for e in rec.events("step") if e["attempt"] == 2]
    assert steps2[0]["step"] == resumed_from + 1 and "span" not in steps2[0], steps2[0]
    # Every save is stored under the step in its name; the steps attempt 1 ran past its
    # newest save are lost, and show's restart hint counts the same steps redone.
    assert [i.step for i in CheckpointStore(rec.checkpoints_dir).list()] == saved
    lost = killed_at - resumed_from
    assert works[0]["checkpoint_after"] == resumed_from, works[0]
    assert works[0]["steps_lost"] == lost == 10, (works[0], lost)
    assert f"(1 restart, {lost} steps redone)" in restart_hint(project, rec)
