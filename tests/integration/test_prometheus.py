"""The Prometheus endpoint: a real run serves /metrics on a free port while it runs (scraped
over HTTP and parsed with prometheus_client's parser), announces it, and frees it at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import metric_value, scrape_metrics, wait_for

# Runs until the test has scraped (it creates "done"), so the run is as short as can be.
LOOP = """
import os, time, acceptrun
run = acceptrun.init()
for step in run.steps(100000):
    if os.path.exists("done"):
        break
    with run.data_wait():
        time.sleep(0.005)
    t = time.perf_counter()
    while time.perf_counter() - t < 0.02:
        pass
    run.log(step, loss=1.0 / (step + 1), samples=16, tokens=2048)
"""


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
def test_a_running_run_serves_metrics_on_a_free_port(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text(textwrap.dedent(LOOP))
    (tmp_path / "spec.toml").write_text(
        f'name = "prom"\ncommand = ["{sys.executable}", "work.py"]\n'
        '[telemetry]\ninterval = "0.25s"\n'
    )
    ws = tmp_path / "ws"
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q",
         "--prometheus-port", "0", "spec.toml"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # seconds: a loaded machine starts torch slowly
        url = None
        while url is None and time.monotonic() < deadline:
            runs = list((ws / "runs").glob("2*")) if (ws / "runs").is_dir() else []
            found = [e for r in runs for e in _events(r) if e["kind"] == "prometheus"]
            url = found[0]["url"] if found else None
            time.sleep(0.1)
        assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        first = scrape_metrics(url)
        while "acceptrun_step" not in first or "acceptrun_host_cpu_percent" not in first:
            assert time.monotonic() < deadline, first.keys()
            time.sleep(0.2)
            first = scrape_metrics(url)
        # The next sample with a later step (the telemetry interval is 0.25 s).
        second = wait_for(
            lambda: (
                (s := scrape_metrics(url))
                and metric_value(s, "acceptrun_step") > metric_value(first, "acceptrun_step")
                and s
            ),
            what="a scrape with a later acceptrun_step",
        )
        (tmp_path / "done").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out, err)
    assert f"prometheus metrics at {url}" in err  # announced on the terminal, once
    assert err.count("prometheus metrics at") == 1
    assert metric_value(second, "acceptrun_step") > metric_value(first, "acceptrun_step") >= 0
    ((labels, one),) = second["acceptrun_run_info"]
    (run_dir,) = (ws / "runs").glob("2*")
    assert one == 1 and labels == {"run_id": run_dir.name, "name": "prom"}
    last_t = metric_value(second, "acceptrun_last_step_timestamp_seconds")
    assert abs(last_t - time.time()) < 60
    assert (
        metric_value(second, "acceptrun_attempt") == 1
        and metric_value(second, "acceptrun_restarts") == 0
    )
    assert metric_value(second, "acceptrun_process_rss_bytes") > 0
    assert metric_value(second, "acceptrun_process_count") >= 1
    assert (
        0
        < metric_value(second, "acceptrun_host_memory_used_bytes")
        <= metric_value(second, "acceptrun_host_memory_total_bytes")
    )
    assert "acceptrun_host_cpu_percent" in second and "acceptrun_idle_seconds" in second
    assert 0 < metric_value(second, "acceptrun_step_time_seconds") < 5
    ratio = metric_value(second, "acceptrun_tokens_per_second") / metric_value(
        second, "acceptrun_samples_per_second"
    )
    assert abs(ratio - 128) < 1e-6  # 2048 tokens / 16 samples, both over the same step
    assert 0 < metric_value(second, "acceptrun_data_wait_share") < 1
    assert 0 < metric_value(second, "acceptrun_loss") <= 1
    assert not any(k.startswith("acceptrun_gpu_") for k in second)  # no GPU here
    # Shut down with the run: the port no longer answers.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_a_bad_port_is_refused_before_launch(tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text(f'name = "p"\ncommand = ["{sys.executable}", "-V"]\n')
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(tmp_path / "ws"), "run",
         "--prometheus-port", "70000", "spec.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert (
        "argument --prometheus-port: '70000' is out of range; expected 0 to 65,535" in proc.stderr
    )
    assert not (tmp_path / "ws" / "runs").exists() or not list((tmp_path / "ws" / "runs").iterdir())
