"""The corpus's shapes run for real: saved, killed at a random step, resumed, checked.

For a shape of tests/corpus/shapes/, :func:`check_shape` runs tests/integration/
corpus_replay.py under ``acceptrun run`` as a black box: it prints the shape's recorded
log, saves ``out/ckpt.json`` (the true step of its last line) at the shape's resume
points (every K-th when there are many, so a run has three saves or more where the log
allows), and resumes from it with ``--resume``. The spec watches the file, keeps the last
2 captures and reads the shape's ``[progress]`` keys. Attempt 1 is killed by
``--inject kill@step=N`` at a random step line (seeded by the shape's name) after the
first save and on no save; attempt 2 resumes and prints to the end. Then, against the
recorded truth:

- the step log holds every true step (attempt 1 up to the kill, attempt 2 from its
  resume line) and the loss curve every recorded loss at its true step;
- attempt 1's lost work (exit.json ``work.steps_lost_range``, run.json ``work.lost``)
  contains the true loss (the kill's step less the last captured save's) and is never a
  false zero;
- each capture is stored under the step its file holds, in commit order, attempt 2
  resumed from the newest capture of attempt 1, and retention kept exactly the newest
  ``keep_last`` by commit.

The shared test files (test_corpus_runs_a.py / _b.py) take alternate shapes, so xdist
runs the halves side by side.
"""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from corpus_replay import pieces

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.lost import LostWork
from acceptrun.record.workspace import RunRecord
from acceptrun.telemetry.timelines import timelines
from campaign import tally
from conftest import PYTHON, Project

CORPUS = Path(__file__).parents[1] / "corpus" / "shapes"
SHAPES = sorted(p.stem for p in CORPUS.glob("*.toml"))
REPLAY = Path(__file__).with_name("corpus_replay.py")
KEEP_LAST = 2
MAX_SAVES = 3  # intermediate saves kept to at most this many: every K-th resume point


def load(name: str) -> dict[str, Any]:
    return tomllib.loads((CORPUS / f"{name}.toml").read_text())


def save_lines(meta: dict[str, Any], n_lines: int) -> list[int]:
    """The lines after which the script saves: before a resume point, and at the end.

    A save just before resume line r holds the step of the last step line before r, and
    the resumed script prints again from r. With many resume points (a step counter, where
    every line is one), every K-th is taken so a run saves about ``MAX_SAVES`` times.
    """
    first = meta["truth"][0][0]
    points = [r - 1 for r in meta["resume_lines"] if r > first]
    k = max(1, -(-len(points) // MAX_SAVES))  # ceil: K so there are <= MAX_SAVES
    return sorted({*points[k - 1 :: k], n_lines - 1})


def spec_extra(meta: dict[str, Any]) -> str:
    progress = tomli_w.dumps({"progress": {**meta["progress"], "stream": "stdout"}})
    return f"""
[checkpoint]
watch = ["out/ckpt.json"]
resume_args = ["--resume"]
settle = "0.3s"
keep_last = {KEEP_LAST}
[limits]
max_restarts = 1
restart_backoff = 0
{progress}"""


def command(name: str, saves: list[int], stop_after: int | None = None) -> list[str]:
    argv = [PYTHON, str(REPLAY), str(CORPUS / f"{name}.toml"), "--saves"]
    argv.append(",".join(map(str, saves)))
    return argv + ([] if stop_after is None else ["--stop-after", str(stop_after)])


def _curve(record: RunRecord) -> dict[int, set[float]]:
    curve: dict[int, set[float]] = {}
    for point in timelines(record.path)["steps"]:
        if point.get("loss") is not None:
            curve.setdefault(point["step"], set()).add(round(point["loss"], 4))
    return curve


def check_shape(project: Project, name: str) -> None:
    meta = load(name)
    truth: list[list[Any]] = meta["truth"]
    lines = pieces(CORPUS / f"{name}.log")
    step_of = {line: step for line, step, _loss in truth}
    saves = save_lines(meta, len(lines))
    # The kill: a step line after the first save and on no save, seeded by the shape.
    choices = [line for line, _s, _l in truth if saves[0] < line and line not in saves]
    if not choices:
        pytest.fail(f"{name}: no step line between two saves ({saves}) to kill at")
    kill_line = random.Random(name).choice(choices)
    kill = step_of[kill_line]
    saved_line = max(s for s in saves if s < kill_line)
    saved = max(s for line, s, _l in truth if line <= saved_line)
    resume_line = min(r for r in meta["resume_lines"] if r > saved_line)
    checks = 0

    spec = project.spec(
        command=command(name, saves, kill_line), name=f"corpus-{name}", extra=spec_extra(meta)
    )
    proc = project.cli("run", "--inject", f"kill@step={kill}", str(spec), timeout=240)
    record: RunRecord = project.only_record()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exits = [
        json.loads((record.path / "attempts" / str(n) / "exit.json").read_text()) for n in (1, 2)
    ]
    assert f"injected fault kill@step={kill}" in exits[0]["reason"], exits[0]
    assert not (record.path / "attempts" / "3").exists()

    # The step log: every true step, attempt 1 up to the kill, attempt 2 from its resume line.
    steps = list(record.events("step"))
    one = [e["step"] for e in steps if e["attempt"] == 1]
    two = [e["step"] for e in steps if e["attempt"] == 2]
    assert one == [s for line, s, _l in truth if line <= kill_line], (name, one)
    assert two == [s for line, s, _l in truth if line >= resume_line], (name, two)
    checks += len(one) + len(two)

    # The loss curve: every recorded loss at its true step.
    want = {s: {round(loss, 4)} for _line, s, loss in truth}
    assert _curve(record) == want, name
    checks += len(want)

    # Lost work: the steps printed after the last captured save, up to the kill; inside
    # the range and never a false zero, in exit.json and in run.json's text alike.
    lost = kill - saved
    low, high = exits[0]["work"]["steps_lost_range"]
    assert low <= lost and (high is None or lost <= high), (name, lost, low, high)
    assert high != 0 and lost > 0, (name, low, high)
    # run.json sums the attempts (attempt 2 ran to its end and lost nothing) and prints the
    # figure with record/lost.py's text, the one every view shows.
    run_work = json.loads((record.path / "run.json").read_text())["work"]
    assert exits[1]["work"]["steps_lost_range"] == [0, 0], exits[1]["work"]
    assert run_work["steps_lost_range"] == [low, high], run_work
    assert run_work["lost"] == LostWork.of_work(run_work).text(), run_work
    assert not run_work["lost"].startswith("0 steps"), run_work
    checks += 3

    # Checkpoints: each capture under the step its file holds, in commit order; attempt 2
    # resumed from the newest capture; retention kept the newest keep_last by commit.
    committed = [
        max(s for line, s, _l in truth if line <= i)
        for i in saves
        if i <= saved_line or i >= resume_line
    ]
    commits = [e for e in record.events("checkpoint_commit") if e.get("source") == "watched"]
    assert [e["step"] for e in commits] == committed, (name, commits)
    assert exits[1]["work"]["resumed_from"] == saved, exits[1]["work"]
    store = CheckpointStore(record.path / "checkpoints", keep_last=KEEP_LAST)
    kept = store.ordered()
    assert [c.step for c in kept] == committed[-KEEP_LAST:], (name, kept)
    for info in kept:
        held = json.loads((info.path / "files" / "out" / "ckpt.json").read_text())["step"]
        assert held == info.step, (name, info)
    checks += len(commits) + len(kept) + 1
    tally("corpus runs", tried=checks)
