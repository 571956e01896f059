"""The HTML report of a real run, opened in headless Chromium; the SVG charts; md and json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from conftest import chromium_driver

PYTHON = sys.executable
# Read at import: the autouse fixture clears ACCEPTRUN_* variables before each test.
SCREENSHOT_DIR = os.environ.get("ACCEPTRUN_SCREENSHOT_DIR")
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


def _driver(tmp_path: Path) -> Any:
    return chromium_driver(tmp_path / "chromium-profile", window="1100,1400", performance_log=True)


@pytest.mark.slow
def test_report_renders_in_chromium_with_no_network(run: dict[str, Any], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    report = run["dir"] / "report.html"
    assert report.is_file()  # written when the run closed
    proc = _cli(run["ws"], run["proj"], "report", run["dir"].name)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == report

    driver = _driver(tmp_path)
    try:
        driver.get_log("performance")  # drop the browser's own start-up pages
        driver.get(report.as_uri())
        banner = driver.find_element(By.ID, "verdict")
        assert banner.text.startswith("ACCEPTED")
        assert "2 attempt(s)" in banner.text
        assert "21, 128, 61" in banner.value_of_css_property("background-color")  # green
        headings = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "h3")]
        for title in (
            "1. launch and setup",
            "2. data and checkpoints",
            "3. performance and observability",
            "4. operations",
            "5. exit",
        ):
            assert any(h.startswith(title) for h in headings), headings
        charts = driver.find_elements(By.CSS_SELECTOR, "svg.chart")
        titles = [c.find_element(By.TAG_NAME, "title").get_attribute("textContent") for c in charts]
        assert {"Loss", "Throughput (samples/s)", "Step time (ms)", "Host CPU"} <= set(titles), (
            titles
        )
        for chart in charts:
            size = chart.size
            assert size["width"] > 100 and size["height"] > 40, (chart.get_attribute("class"), size)
        loss = charts[titles.index("Loss")]
        assert loss.find_elements(By.CSS_SELECTOR, "line.mark-checkpoint")
        assert loss.find_elements(By.CSS_SELECTOR, "line.mark-restart")
        path = loss.find_element(By.CSS_SELECTOR, "path.series")
        assert path.size["width"] > 300
        # The hostile metric name is text on the page, not markup.
        assert driver.find_elements(By.TAG_NAME, "script") == []
        assert driver.find_elements(By.TAG_NAME, "img") == []
        assert HOSTILE in driver.find_element(By.ID, "outputs").find_element(By.XPATH, "..").text
        attempts = driver.find_element(By.ID, "attempts").find_element(
            By.XPATH, "following-sibling::table"
        )
        assert "killed by SIGKILL" in attempts.text

        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert errors == []
        requests = []  # (the document that asked, the URL asked for)
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                params = message["params"]
                requests.append((params.get("documentURL", ""), params["request"]["url"]))
        ours = [url for doc, url in requests if doc == report.as_uri()]
        assert ours and all(urlparse(u).scheme in ("file", "data") for u in ours), ours
        # Nothing at all left the machine (chrome:// pages are the browser's own).
        assert all(urlparse(u).scheme in ("file", "data", "chrome") for _, u in requests), requests

        driver.set_window_size(
            1100, min(int(driver.execute_script("return document.body.scrollHeight")) + 40, 9000)
        )
        shot = tmp_path / "report.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if SCREENSHOT_DIR:
            out = Path(SCREENSHOT_DIR)
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, out / "report.png")
    finally:
        driver.quit()


@pytest.mark.slow
def test_markdown_and_json_carry_the_same_verdict(run: dict[str, Any], tmp_path: Path) -> None:
    md = _cli(run["ws"], run["proj"], "report", "--format", "md", run["dir"].name)
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert lines[0] == f"# ACCEPTED: report-demo `{run['dir'].name}`"
    assert "### 2. data and checkpoints" in lines
    assert any(line.startswith("| 2 | success |") for line in lines)
    data = json.loads(
        _cli(run["ws"], run["proj"], "report", "--format", "json", run["dir"].name).stdout
    )
    assert data["verdict"]["accepted"] is True
    assert [a["outcome"] for a in data["attempts"]] == ["signaled", "success"]
    (model,) = data["outputs"]
    assert model["name"] == "model" and model["hash"].startswith("xxh3_128:")
    assert data["checkpoints"]["latest"] == 29
    out = tmp_path / "r.md"
    proc = _cli(run["ws"], run["proj"], "report", "--format", "md", "-o", str(out), run["dir"].name)
    assert proc.returncode == 0 and out.read_text().startswith("# ACCEPTED")


@pytest.mark.slow
def test_gpu_samples_in_the_record_become_gpu_charts(run: dict[str, Any], tmp_path: Path) -> None:
    """GPU lines in the telemetry contract's format (as NVML samplers write them) are charted."""
    from acceptrun.record.workspace import RunRecord
    from acceptrun.report.data import report_data
    from acceptrun.report.html import render_html

    copy = tmp_path / "runs" / run["dir"].name
    shutil.copytree(run["dir"], copy)
    t0 = json.loads((copy / "events.jsonl").read_text().splitlines()[0])["t"]
    with open(copy / "telemetry.jsonl", "a") as f:
        for i in range(20):
            for index in (0, 1):
                sample = {
                    "t": t0 + 5 + i, "kind": "gpu", "attempt": 1, "index": index,
                    "name": "NVIDIA H100 80GB HBM3", "util_pct": 90.0 - 40 * index,
                    "mem_used": (30 + i) * 2**30, "mem_total": 80 * 2**30, "power_w": 500.0,
                    "clock_events": [], "procs": {}, "temp_c": 60,
                }  # fmt: skip
                f.write(json.dumps(sample) + "\n")
    page = render_html(report_data(RunRecord(copy)))
    for title in ("GPU utilization (%)", "GPU memory used (GiB)", "GPU power (W)"):
        assert f"<title>{title}</title>" in page
    assert "GPU 1" in page and "No GPU timeline" not in page
    assert "NVIDIA H100 80GB HBM3: mean utilization" in page
