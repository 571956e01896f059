"""``acceptrun ui``: a real board server on 127.0.0.1 over real runs, read by urllib and Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.ui import Board
from conftest import chromium_driver, toml_str, wait_for
from ui_served import TOKEN, Served

PYTHON = sys.executable
# Read at import: the autouse fixture clears ACCEPTRUN_* variables before each test.
SCREENSHOT_DIR = os.environ.get("ACCEPTRUN_SCREENSHOT_DIR")
# Names that would run script, or fetch, if a page did not escape them.
HOSTILE = '<script>fetch("http://127.0.0.1:9/x")</script>'

FINISHED = f"""
import time, acceptrun
run = acceptrun.init()
for step in run.steps(30):
    time.sleep(0.005)
    run.log(step, loss=SCALE / (step + 1), samples=8)
run.metric("final/loss", SCALE / 30)
run.metric({HOSTILE!r}, 1.0)
open("model.txt", "w").write(repr(SCALE))
run.output({HOSTILE!r}, "model.txt")
"""

# Logs slowly but steadily until stopped; checkpoints its state so a stop leaves one.
LIVE = """
import ast, random, time, acceptrun

class State:
    def __init__(self):
        self.w = 0.0
    def state_dict(self):
        return {"w": self.w}
    def load_state_dict(self, sd):
        self.w = sd["w"]

s = State()
run = acceptrun.init()
start = run.restore(state=s)
for step in run.steps(start, 100000):
    time.sleep(0.05)
    s.w += 0.01
    run.log(step, loss=1.0 / (1.0 + s.w), samples=8)
"""


def _cli(ws: Path, cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env["ACCEPTRUN_CONFIG_DIR"] = os.environ.get("ACCEPTRUN_CONFIG_DIR", "")
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _project(root: Path, name: str, script: str, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "work.py").write_text(textwrap.dedent(script))
    command = f'[{toml_str(PYTHON)}, "work.py"]'
    (root / "spec.toml").write_text(
        f"name = {toml_str(name)}\ncommand = {command}\n{textwrap.dedent(extra)}"
    )
    return root


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two finished runs of the same workload (one planted with hostile names), and a rejected one."""
    root = tmp_path_factory.mktemp("ui")
    ws = root / "ws"
    ids = []
    for i, (name, scale, rc) in enumerate(
        ((HOSTILE, 1.0, 0), ("plain-b", 1.5, 0), ("fails", 1.0, 1))
    ):
        script = FINISHED.replace("SCALE", str(scale))
        if rc:
            script += "\nraise SystemExit(3)\n"
        extra = "[cost]\nprice_per_hour = 2.0\n" + ("[limits]\nmax_restarts = 0\n" if rc else "")
        proj = _project(root / f"p{i}", name, script, extra)
        proc = _cli(ws, proj, "run", "-q", "spec.toml")
        assert proc.returncode == rc, proc.stdout + proc.stderr
        ids.append(sorted(set(Workspace(ws).run_ids()) - set(ids))[0])
    served = Served(Board.for_workspaces([Workspace(ws)]))
    try:
        yield {"ws": ws, "ids": ids, "served": served, "root": root}
    finally:
        served.close()


def _driver(tmp_path: Path) -> Any:
    return chromium_driver(tmp_path / "chromium-profile", window="1200,900")


def _screenshot(driver: Any, tmp_path: Path, name: str, height: int = 900) -> None:
    shot = tmp_path / name
    driver.set_window_size(1200, height)
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if SCREENSHOT_DIR:
        out = Path(SCREENSHOT_DIR)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / name)


# ---- the runs page ---------------------------------------------------------------------------


@pytest.mark.slow
def test_runs_page_lists_runs_with_verdicts_and_failed_checks(board: dict[str, Any]) -> None:
    page = board["served"].get("/")
    hostile, plain, fails = board["ids"]
    assert len(re.findall(r'<tr class="run">', page)) == 3
    # Newest first.
    assert page.index(fails) < page.index(plain) < page.index(hostile)
    for rid, verdict in ((hostile, "accepted"), (plain, "accepted"), (fails, "rejected")):
        row = next(r for r in page.split('<tr class="run">')[1:] if rid in r)
        assert f'class="verdict {verdict}"' in row, row
        assert "$" in row  # priced: the cost column shows the ledger's total
    row = next(r for r in page.split('<tr class="run">')[1:] if fails in r)
    assert "exit: attempt 1 exited 3" in row  # the failed check, in words


@pytest.mark.slow
def test_runs_page_filters_by_name_verdict_and_date(board: dict[str, Any]) -> None:
    served = board["served"]
    hostile, plain, fails = board["ids"]
    page = served.get("/?" + urlencode({"name": "plain"}))
    assert plain in page and fails not in page and hostile not in page
    page = served.get("/?" + urlencode({"verdict": "rejected"}))
    assert fails in page and plain not in page
    page = served.get("/?" + urlencode({"status": "finished", "since": "2000-01-01"}))
    assert plain in page
    page = served.get("/?" + urlencode({"until": "2000-01-01"}))
    assert plain not in page and "No run matches" in page
    bearer = {"Authorization": f"Bearer {TOKEN}"}  # every page needs the token
    status, _, text = served.request("GET", "/?" + urlencode({"since": "yesterday"}), None, bearer)
    assert status == 404 and "since: &#x27;yesterday&#x27; is not a date" in text


@pytest.mark.slow
def test_every_string_from_a_record_is_escaped(board: dict[str, Any]) -> None:
    """A run name, a metric name and an output name of <script> appear as text only."""
    served = board["served"]
    hostile, plain, _ = board["ids"]
    escaped = "&lt;script&gt;fetch(&quot;http://127.0.0.1:9/x&quot;)&lt;/script&gt;"
    pages = {
        "runs": served.get("/"),
        "run": served.get(f"/run/0/{hostile}"),
        "compare": served.get(f"/compare?run=0/{hostile}&run=0/{plain}"),
        "spend": served.get("/spend"),
        "logs": served.get(f"/run/0/{hostile}/logs"),
    }
    for name, page in pages.items():
        assert HOSTILE not in page, name
        assert "<script>" not in page, name  # the only script is the board's own file
    assert escaped in pages["runs"]  # the run name
    run = pages["run"]
    assert run.count(escaped) >= 3  # the run name, the metric name, the output name
    assert "final/loss" in run and "Outputs and their lineage" in run
    assert pages["compare"].count(escaped) >= 2  # metric names side by side, output in the diff


# ---- security ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_actions_need_the_token_and_the_boards_own_origin(board: dict[str, Any]) -> None:
    served = board["served"]
    _, plain, _ = board["ids"]
    report = Path(board["ws"]) / "runs" / plain / "report.html"
    report.unlink()
    own = {"Origin": served.base}
    status, _, text = served.request("POST", f"/run/0/{plain}/report", "", own)
    assert status == 403 and "needs the board&#x27;s token" in text
    status, _, _ = served.request("POST", f"/run/0/{plain}/report", "token=wrong-token", own)
    assert status == 403
    foreign = {"Origin": "http://evil.example"}
    status, _, text = served.request("POST", f"/run/0/{plain}/report", f"token={TOKEN}", foreign)
    assert status == 403 and "is not this board" in text
    cross = {"Sec-Fetch-Site": "cross-site"}
    status, _, _ = served.request("POST", f"/run/0/{plain}/report", f"token={TOKEN}", cross)
    assert status == 403
    assert not report.exists()  # nothing was done by any refused request
    # A page whose DNS name was rebound to 127.0.0.1 sends its own Host.
    status, _, _ = served.request("GET", "/", headers={"Host": f"evil.example:{served.port}"})
    assert status == 403
    status, headers, _ = served.request("POST", f"/run/0/{plain}/report", f"token={TOKEN}", own)
    assert status == 303 and "wrote" in headers["location"]
    assert report.is_file()
    _, headers, _ = served.request("GET", "/")
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "access-control-allow-origin" not in headers


def test_the_command_refuses_a_short_token_and_a_busy_port(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    proc = _cli(ws.root, tmp_path, "ui", "--token", "short", "--port", "0", timeout=300)
    assert proc.returncode == 2 and "give at least 16" in proc.stderr
    served = Served(Board.for_workspaces([ws]))
    try:
        proc = _cli(ws.root, tmp_path, "ui", "--port", str(served.port), timeout=300)
        assert proc.returncode == 2 and "choose another port" in proc.stderr
    finally:
        served.close()


# ---- compare, queue, spend ---------------------------------------------------------------------


@pytest.mark.slow
def test_compare_overlays_two_runs_with_the_diff_verdict(
    board: dict[str, Any], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    served = board["served"]
    hostile, plain, _ = board["ids"]
    driver = _driver(tmp_path)
    try:
        driver.get(f"{served.base}/compare?run=0/{hostile}&run=0/{plain}&token={TOKEN}")
        charts = driver.find_elements(By.CSS_SELECTOR, "svg.chart")
        titles = [c.find_element(By.TAG_NAME, "title").get_attribute("textContent") for c in charts]
        assert titles[:3] == ["Loss", "Throughput", "Step time (ms)"], titles
        for chart in charts[:3]:
            assert len(chart.find_elements(By.CSS_SELECTOR, "path.series")) == 2  # overlaid
        side = driver.find_element(By.ID, "metrics").find_element(
            By.XPATH, "following-sibling::table"
        )
        assert "final/loss" in side.text and "0.0333333" in side.text and "0.05" in side.text
        diff = driver.find_element(By.CSS_SELECTOR, "h2.diff")
        assert plain in diff.text
        verdict = diff.find_element(By.XPATH, "following-sibling::p")
        assert verdict.text.startswith("not reproduced")
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "metric final/loss" in body and "environment" in body and "outputs" in body
        assert driver.find_elements(By.CSS_SELECTOR, "script:not([src])") == []
        # A run's page: the report's own banner, white on green, as in report.html.
        driver.get(f"{served.board}/run/0/{plain}")  # the cookie is sent under the prefix
        banner = driver.find_element(By.ID, "verdict")
        assert banner.text.startswith("ACCEPTED")
        assert "255, 255, 255" in banner.value_of_css_property("color")
        assert "21, 128, 61" in banner.value_of_css_property("background-color")
        assert driver.find_elements(By.CSS_SELECTOR, "svg.chart title")
    finally:
        driver.quit()


@pytest.mark.slow
def test_queue_and_spend_pages(board: dict[str, Any]) -> None:
    served = board["served"]
    page = served.get("/queue")
    assert "No queue in this workspace yet" in page
    page = served.get("/spend")
    assert "cost per accepted run" in page and "By week" in page and "By spec" in page
    assert "plain-b" in page and "The split (USD)" in page and "Left behind in storage" in page


# ---- a live run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_live_run_page_updates_without_reload_and_stops_with_a_checkpoint(
    board: dict[str, Any], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    served, ws = board["served"], Path(board["ws"])
    proj = _project(board["root"] / "live", "live-run", LIVE, "[checkpoint]\nevery_steps = 20\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env["ACCEPTRUN_CONFIG_DIR"] = os.environ.get("ACCEPTRUN_CONFIG_DIR", "")
    before = set(Workspace(ws).run_ids())
    proc = subprocess.Popen(
        [PYTHON, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=proj, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    driver = None
    try:
        run_id = wait_for(
            lambda: sorted(set(Workspace(ws).run_ids()) - before), 60, 0.1, "the run"
        )[0]
        record = RunRecord(ws / "runs" / run_id)
        wait_for(lambda: len(list(record.events("step"))) >= 3, 90, 0.1, "3 steps")
        # Refused without the token, and from a foreign Origin, while it is live.
        own = {"Origin": served.base}
        status, _, _ = served.request("POST", f"/run/0/{run_id}/stop", "", own)
        assert status == 403
        status, _, _ = served.request(
            "POST", f"/run/0/{run_id}/stop", f"token={TOKEN}", {"Origin": "http://evil.example"}
        )
        assert status == 403
        assert not list(record.events("stop_requested", "stopped"))
        assert record.state["status"] == "running"

        driver = _driver(tmp_path)
        driver.get(f"{served.base}/?token={TOKEN}")  # the address `acceptrun ui` prints
        assert "token" not in driver.current_url  # kept in a cookie, out of the address bar
        _screenshot(driver, tmp_path, "ui-runs.png", 700)
        driver.get(f"{served.board}/run/0/{run_id}")  # the cookie is sent under the prefix
        driver.execute_script("window.acceptrunNoReload = 1")

        def step() -> int | None:
            text = driver.find_element(By.ID, "live-step").text
            return int(text) if text.isdigit() else None

        first = wait_for(step, 300, 0.1, "a step number on the page")
        wait_for(lambda: (step() or 0) >= first + 5, 300, 0.1, "the step number to increase")
        assert driver.execute_script("return window.acceptrunNoReload") == 1  # no reload
        wait_for(
            lambda: driver.find_element(By.ID, "live-loss").find_element(By.CSS_SELECTOR, "path.series").get_attribute("d"),
            30, 0.1, "the live loss chart",
        )  # fmt: skip
        assert driver.find_element(By.ID, "live-rate").text.endswith("samples/s")
        assert driver.find_element(By.ID, "live-use").text != ""
        _screenshot(driver, tmp_path, "ui-run.png", 1100)

        driver.find_element(By.CSS_SELECTOR, "#actions button.danger").click()
        flash = wait_for(
            lambda: driver.find_elements(By.CSS_SELECTOR, "p.flash"), 30, 0.1, "the flash"
        )
        assert "stop sent to run" in flash[0].text, flash[0].text
        proc.wait(timeout=120)
        stopped = list(record.events("stopped"))
        assert stopped and isinstance(stopped[-1].get("checkpoint"), int), stopped
        assert record.state["status"] in ("finished", "stopped")  # closed, not crashed
        (exit_,) = record.events("attempt_exit")
        assert exit_["class"] == "stopped" and exit_["work"]["steps_lost"] == 0
        audits = [e for e in record.events("audit") if e.get("action") == "stop"]
        assert audits and audits[-1]["reason"] == "from acceptrun ui"
        ckpt = stopped[-1]["checkpoint"]
        page = served.get(f"/run/0/{run_id}")
        assert f"/run/0/{run_id}/checkpoint/{ckpt}" in page  # a link to its manifest
        assert "tensors.safetensors" in served.get(f"/run/0/{run_id}/checkpoint/{ckpt}")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors

        # Resume from the page: `acceptrun resume` starts detached from the checkpoint.
        driver.get(f"{served.board}/run/0/{run_id}")
        resume = driver.find_element(By.XPATH, "//div[@id='actions']//button[text()='resume']")
        resume.click()
        flash = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "p.flash"), 30, 0.1, "flash")
        assert "acceptrun resume" in flash[0].text and "resume-" in flash[0].text
        starts = wait_for(
            lambda: [e for e in record.events("attempt_start") if e.get("attempt") == 2],
            120, 0.2, "attempt 2",
        )  # fmt: skip
        assert starts[0].get("resume_step") == stopped[-1]["checkpoint"], starts
        wait_for(lambda: record.state.get("status") == "running", 300, 0.2, "running again")

        def stop_sent() -> bool:
            status, headers, _ = served.request(
                "POST", f"/run/0/{run_id}/stop", f"token={TOKEN}", own
            )
            return status == 303 and "msg=stop+sent" in headers["location"]

        wait_for(stop_sent, 300, 0.5, "a stop of the resumed run")
        wait_for(lambda: record.state.get("status") in ("finished", "stopped"), 120, 0.2, "closed")
    finally:
        if driver is not None:
            driver.quit()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_queued_job_is_listed_and_cancelled_from_the_queue_page(tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj", "queued-job", "print('never runs')\n")
    ws = tmp_path / "ws"
    for _ in range(2):
        proc = _cli(ws, proj, "submit", "spec.toml", timeout=120)
        assert proc.returncode == 0, proc.stderr
    served = Served(Board.for_workspaces([Workspace(ws)]))
    try:
        page = served.get("/queue")
        assert "<h4>queued (2)</h4>" in page and "queued-job" in page
        assert "No worker is running" in page
        own = {"Origin": served.base}
        status, _, _ = served.request("POST", "/queue/0/1/cancel", "", own)
        assert status == 403
        status, headers, _ = served.request("POST", "/queue/0/1/cancel", f"token={TOKEN}", own)
        assert status == 303 and "cancelled" in headers["location"]
        page = served.get(headers["location"])
        assert "job 1 (queued-job) cancelled" in page
        assert "<h4>cancelled (1)</h4>" in page and "<h4>queued (1)</h4>" in page
    finally:
        served.close()
