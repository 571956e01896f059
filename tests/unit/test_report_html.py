"""The HTML report of a real run, opened in headless Chromium; the SVG charts; md and json."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.report.svg import Mark, Series, line_chart, nice_ticks

PYTHON = sys.executable
# A metric name that would run script, or fetch, if the report did not escape it.
HOSTILE = '<script>fetch("http://127.0.0.1:9/x")</script><img src="http://127.0.0.1:9/y">'

WORK = f"""
import ast, os, random, signal, time
import acceptrun

class State:
    def __init__(self):
        self.w = 0.0
        self.rng = random.Random(1)
    def state_dict(self):
        return {{"w": self.w, "rng": repr(self.rng.getstate())}}
    def load_state_dict(self, sd):
        self.w = sd["w"]
        self.rng.setstate(ast.literal_eval(sd["rng"]))

s = State()
run = acceptrun.init()
start = run.restore(state=s)
for step in run.steps(start, 30):
    with run.data_wait():
        x = s.rng.random()
    s.w += 0.1 * (x - s.w)
    time.sleep(0.02)
    run.log(step, loss=(1.0 - s.w) ** 2, samples=8)
    run.maybe_checkpoint(step)
    if step == 17 and run.attempt == 1:
        time.sleep(0.3)  # let the step-14 checkpoint commit
        os.kill(os.getpid(), signal.SIGKILL)
run.metric("final/w", s.w)
run.metric({HOSTILE!r}, 1.0)
open("model.txt", "w").write(repr(s.w))
run.output("model", "model.txt")
"""

SPEC = """
name = "report-demo"
command = ["{python}", "work.py"]
[checkpoint]
every_steps = 5
[limits]
max_restarts = 1
restart_backoff = 0
[cost]
price_per_hour = 2.0
[telemetry]
interval = 0.5
[acceptance]
outputs = ["model"]
"""


def _cli(ws: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real run with checkpoints, a SIGKILL and a restart; its report written at close."""
    root = tmp_path_factory.mktemp("report")
    proj, ws = root / "proj", root / "ws"
    proj.mkdir()
    (proj / "work.py").write_text(textwrap.dedent(WORK))
    (proj / "spec.toml").write_text(SPEC.format(python=PYTHON))
    proc = _cli(ws, proj, "run", "-q", "spec.toml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((ws / "runs").iterdir())
    return {"proj": proj, "ws": ws, "dir": run_dir}


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert nice_ticks(0, 1) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(3.2, 97.1) == [0.0, 25.0, 50.0, 75.0, 100.0]
    ticks = nice_ticks(5.0, 5.0)
    assert ticks[0] < 5.0 < ticks[-1]


def test_line_chart_escapes_text_and_breaks_lines_at_gaps() -> None:
    svg = line_chart(
        [Series("a<b>", [(0, 1), (1, 2), (2, float("nan")), (3, 1), (4, 0.5)])],
        title='loss "&" <x>',
        x_label="step",
        y_label="loss",
        marks=[Mark(2.5, "restart", "attempt <2>")],
    )
    assert "<b>" not in svg and "a&lt;b&gt;" in svg and "&quot;&amp;&quot;" in svg
    assert "attempt &lt;2&gt;" in svg
    (path,) = [p for p in svg.split("<path ")[1:]]
    assert path.count("M") == 2  # two segments: the gap is not bridged
    assert "nan" not in svg
