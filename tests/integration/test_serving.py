"""Serving runs: real servers on loopback under a real `acceptrun run`, and the load generator.

The servers are tests/serving_server.py (standard library) and the example FastAPI server
(examples/serving/server.py, skipped when FastAPI, uvicorn or torch are missing). Every
wait is on readiness or on the run's end, never on a guess.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from acceptrun.serving.load import LoadPlan, run_load
from acceptrun.serving.summary import percentile
from conftest import PYTHON, Project, toml_str

HERE = Path(__file__).parent
SERVER = HERE / "serving_server.py"
EXAMPLE = HERE.parents[1] / "examples" / "serving"
RUN_TIMEOUT = 240  # seconds: a generous bound on a whole run on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving_spec(
    project: Project,
    port: int,
    *,
    args: str = "",
    serving: str = "",
    name: str = "srv",
    ready: str = "",
) -> Path:
    """A spec whose command is tests/serving_server.py on ``port`` with ``args``."""
    shutil.copy(SERVER, project.root / "serving_server.py")
    (project.root / "prompts.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    argv = [PYTHON, "serving_server.py", str(port), *args.split()]
    text = f"""
    [limits]
    grace_period = "60s"
    max_restarts = 2
    [cost]
    price_per_hour = 0.5
    billing_increment = "1s"
    [serving]
    url = "http://127.0.0.1:{port}/v1/completions"
    {ready or f'ready_url = "http://127.0.0.1:{port}/health"'}
    payload = "prompts.jsonl"
    {serving}
    """
    return project.spec(command=argv, name=name, extra=text)


def run(project: Project, spec: Path) -> subprocess.CompletedProcess[str]:
    return project.cli("run", str(spec), timeout=RUN_TIMEOUT)


def checks(record: RunRecord) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in record.read_json("verdict.json")["checks"]}


# ---- real runs -------------------------------------------------------------------------------


@pytest.mark.slow
def test_serving_run_measures_percentiles_ttft_cost_and_is_accepted(project: Project) -> None:
    port = free_port()
    spec = serving_spec(
        project, port, args="--tokens 6",
        serving="""
        stream = true
        rate = 40
        requests = 60
        slo_latency = "5s"
        max_latency_p99 = "10s"
        max_ttft_p99 = "10s"
        max_error_rate = 0
        max_usd_per_1k_requests = 100
        """,
    )  # fmt: skip
    (project.root / "prompts.jsonl").write_text('{"prompt": "a", "stream": true}\n')
    proc = run(project, spec)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = project.only_record()
    c = checks(record)
    for name in ("ready", "load", "latency p50", "latency p90", "latency p99", "ttft p99",
                 "error rate", "goodput", "requests/s", "cost per 1k requests"):  # fmt: skip
        assert c[name]["status"] == "pass", c[name]
    assert "60 requests, open loop, poisson arrivals at 40/s" in c["load"]["evidence"]
    assert "360 tokens" in c["ttft p99"]["evidence"]  # 6 tokens x 60 streamed answers
    s = record.read_json("serving.json")
    assert s["load"]["ok"] == 60 and s["load"]["tokens"] == 360
    assert 0 < s["ready"]["seconds"] <= s["first_success_s"]
    lines = (record.path / "serving" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 60
    exit_ = record.read_json("attempts/1/exit.json")
    assert exit_["outcome"] == "success" and "stopped by the supervisor" in exit_["reason"]
    shown = project.cli("show", record.run_id, check_rc=0).stdout
    assert "TTFT p50" in shown and "USD per 1,000 requests" in shown and "p99" in shown
    html = (record.path / "report.html").read_text()
    assert "Latency histogram" in html and "Latency over time" in html and "Load level" in html


@pytest.mark.slow
def test_slow_server_fails_the_latency_check_with_evidence(project: Project) -> None:
    port = free_port()
    spec = serving_spec(
        project, port, args="--delay 0.3",
        serving='concurrency = 2\nrequests = 8\nmax_latency_p99 = "100ms"\nmax_error_rate = 0',
    )  # fmt: skip
    proc = run(project, spec)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    c = checks(project.only_record())
    assert c["latency p99"]["status"] == "fail"
    assert "at most 100.0 ms" in c["latency p99"]["evidence"]
    assert "raise serving.max_latency_p99" in c["latency p99"]["fix"]
    assert c["ready"]["status"] == "pass" and c["error rate"]["status"] == "pass"
    assert c["exit"]["status"] == "pass"  # the server did its job: only the SLO failed


@pytest.mark.slow
def test_server_that_errors_on_some_requests_fails_the_error_rate(project: Project) -> None:
    port = free_port()
    spec = serving_spec(
        project, port, args="--error-every 4",
        serving="concurrency = 1\nrequests = 20\nmax_error_rate = 0.05",
        ready='ready_log = "serving on 127[.]0[.]0[.]1"',  # readiness from its log line
    )  # fmt: skip
    proc = run(project, spec)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    c = checks(project.only_record())
    assert c["error rate"]["status"] == "fail"
    assert (
        "25.00% of 20 requests failed (HTTP 500 x5), at most 5.00%" in c["error rate"]["evidence"]
    )
    assert c["latency p99"]["status"] == "pass"
    assert "log line 'serving on 127.0.0.1" in c["ready"]["evidence"]


@pytest.mark.slow
def test_server_that_never_becomes_ready_fails_readiness_with_its_stderr(
    project: Project,
) -> None:
    port = free_port()
    spec = serving_spec(
        project, port, args="--never-ready",
        serving='concurrency = 1\nrequests = 5\nready_timeout = "3s"',
    )  # fmt: skip
    proc = run(project, spec)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = project.only_record()
    c = checks(record)
    assert c["ready"]["status"] == "fail"
    assert "not ready 3s after launch" in c["ready"]["evidence"]
    assert "weights file model.bin is truncated" in c["ready"]["evidence"]  # its stderr
    assert "HTTP 503" in c["ready"]["evidence"]  # the last probe
    exit_ = record.read_json("attempts/1/exit.json")
    assert exit_["outcome"] == "not_ready" and exit_["class"] == "not_ready"
    assert not (record.path / "attempts" / "2").exists()  # not retried: it would wait again


@pytest.mark.slow
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "torch")),
    reason="the example server needs fastapi, uvicorn and torch (the dev environment has them)",
)
def test_example_fastapi_server_streams_and_is_accepted(project: Project) -> None:
    port = free_port()
    for name in ("server.py", "prompts.jsonl"):
        shutil.copy(EXAMPLE / name, project.root / name)
    text = (EXAMPLE / "spec.toml").read_text().replace("8765", str(port))
    text = text.replace('command = ["python"', f"command = [{toml_str(PYTHON)}")
    text = text.replace('duration = "10s"', 'duration = "3s"')  # a third of the requests:
    text = text.replace("max_usd_per_1k_requests = 0.2", "max_usd_per_1k_requests = 1.0")
    spec = project.root / "spec.toml"
    spec.write_text(text)
    proc = run(project, spec)
    record = project.only_record()
    c = checks(record)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert c["ttft p99"]["status"] == "pass" and "tokens" in c["ttft p99"]["evidence"]
    assert c["cost per 1k requests"]["status"] == "pass"
    assert record.read_json("serving.json")["load"]["tokens"] > 0


# ---- the load generator ----------------------------------------------------------------------


class _Server:
    """tests/serving_server.py as a child process, waited on until /health answers."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "serving on ..." once it listens
        assert "serving on" in line, line

    def url(self, path: str = "/v1/completions") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def server() -> Any:
    created: list[_Server] = []

    def make(*args: str) -> _Server:
        created.append(_Server(*args))
        return created[-1]

    yield make
    for s in created:
        s.close()


def test_open_loop_charges_a_stall_to_the_requests_behind_it(server: Any) -> None:
    """A 1 s stall: open-loop latency is timed from the intended send, so the requests that
    were due during the stall carry it; a single closed-loop client sends none meanwhile."""
    s = server("--stall-every", "2", "--stall", "1")
    open_ = run_load(LoadPlan(url=s.url(), rate=50, duration=4.0, seed=1))
    assert all(r.ok for r in open_)
    stalled = [r for r in open_ if r.latency is not None and r.latency >= 0.5]
    assert len(stalled) >= 10  # about 50 requests were due in each 1 s stall
    closed = run_load(LoadPlan(url=s.url(), concurrency=1, duration=4.0))
    slow = [r for r in closed if r.latency is not None and r.latency >= 0.5]
    assert len(slow) <= 3  # one request per stall waits; the client sent nothing else
    assert percentile([r.latency for r in open_ if r.latency], 90) >= 0.3  # type: ignore[operator]


def test_streamed_answers_give_ttft_and_inter_token_latency(server: Any) -> None:
    s = server("--tokens", "4")
    results = run_load(
        LoadPlan(url=s.url(), concurrency=2, requests=6, stream=True,
                 bodies=[b'{"prompt": "x", "stream": true}'])
    )  # fmt: skip
    assert [r.index for r in results] == list(range(6))
    for r in results:
        assert r.ok and len(r.token_times) == 4
        d = r.to_dict()
        assert d["ttft"] is not None and 0 <= d["ttft"] <= d["latency"]
        assert len(d["itl"]) == 3 and all(x >= 0 for x in d["itl"])


def test_errors_and_a_dead_port_are_counted_not_raised(server: Any) -> None:
    s = server("--error-every", "2")
    results = run_load(LoadPlan(url=s.url(), concurrency=1, requests=4))
    assert [r.status for r in results] == [200, 500, 200, 500]
    dead = run_load(LoadPlan(url=f"http://127.0.0.1:{free_port()}/", concurrency=1, requests=2))
    assert all(not r.ok and r.error and "ConnectionRefused" in r.error for r in dead)


def test_the_load_stops_when_asked(server: Any) -> None:
    s = server()
    stop = threading.Event()
    t0 = time.monotonic()
    threading.Timer(1.0, stop.set).start()
    results = run_load(LoadPlan(url=s.url(), rate=20, duration=600.0), stop=stop)
    # Far below the 600 s the plan asked for (12,000 requests at 20/s).
    assert time.monotonic() - t0 < 300 and 0 < len(results) < 6000


# ---- the spec --------------------------------------------------------------------------------


def test_a_bad_payload_stops_the_run_before_launch(project: Project) -> None:
    spec = serving_spec(project, free_port(), serving="concurrency = 1\nrequests = 1")
    (project.root / "prompts.jsonl").write_text('{"prompt": "a"}\n{"prompt": oops}\n')
    proc = project.cli("run", str(spec), timeout=RUN_TIMEOUT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "serving.payload" in proc.stderr and "prompts.jsonl:2: not JSON" in proc.stderr
    assert project.run_ids() == []  # stopped before a record was made


@pytest.mark.slow
def test_server_that_crashes_during_the_load_is_a_failed_attempt_and_a_cut_load(
    project: Project,
) -> None:
    port = free_port()
    spec = serving_spec(
        project, port, args="--exit-after 5",
        serving="concurrency = 1\nrequests = 50",
    )  # fmt: skip
    spec.write_text(spec.read_text().replace("max_restarts = 2", "max_restarts = 0"))
    proc = run(project, spec)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = project.only_record()
    exit_ = record.read_json("attempts/1/exit.json")
    assert exit_["outcome"] == "failed" and exit_["returncode"] == 3
    assert exit_["evidence"] == ["exit status 3"]
    c = checks(record)
    assert c["load"]["status"] == "fail"
    assert "cut short: the server exited during the load" in c["load"]["evidence"]
    assert record.read_json("serving.json")["load"]["ok"] == 4  # what it answered is kept


# ---- a server killed mid-load, restarted --------------------------------------------------
# The server kills itself with SIGKILL at its 10th request in attempt 1 and writes what it
# received and answered in each attempt: the truth the record's figures are checked against.

KILL_AT = 10  # the request of attempt 1 the server dies on, unanswered
REQUESTS = 30  # each attempt's load


def _lines(record: RunRecord) -> list[dict[str, Any]]:
    text = (record.path / "serving" / "requests.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _ok(line: dict[str, Any]) -> bool:
    return line["error"] is None and line["status"] is not None and line["status"] < 400


@pytest.mark.slow
def test_a_server_killed_mid_load_counts_every_attempt_and_shows_the_downtime(
    project: Project,
) -> None:
    port = free_port()
    truth_file = project.root / "truth.json"
    spec = serving_spec(
        project, port, args=f"--kill-after {KILL_AT} --count-file {truth_file}",
        serving=f'rate = 20\narrivals = "uniform"\nrequests = {REQUESTS}\nmax_error_rate = 0.01',
    )  # fmt: skip
    spec.write_text(spec.read_text().replace("[limits]", '[limits]\nrestart_backoff = "1s"'))
    proc = run(project, spec)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = project.only_record()
    truth = json.loads(truth_file.read_text())
    # The server's own count: it died on request 10 of attempt 1, then served attempt 2 whole.
    assert truth == {
        "1": {"received": KILL_AT, "answered": KILL_AT - 1},
        "2": {"received": REQUESTS, "answered": REQUESTS},
    }
    assert record.read_json("attempts/1/exit.json")["signal"] == "SIGKILL"
    assert record.read_json("attempts/2/exit.json")["outcome"] == "success"

    lines = _lines(record)
    first = [d for d in lines if d["attempt"] == 1]
    second = [d for d in lines if d["attempt"] == 2]
    assert len(first) + len(second) == len(lines)
    assert len(second) == REQUESTS
    # What the load saw answered is what the server answered, in each attempt; attempt 1's
    # other requests (the one it died on, then refused connections) all failed.
    assert sum(map(_ok, first)) == truth["1"]["answered"]
    assert sum(map(_ok, second)) == truth["2"]["answered"]
    failed = len(first) - truth["1"]["answered"]
    assert failed >= 1
    total = len(lines)

    s = record.read_json("serving.json")
    load = s["load"]
    assert (load["requests"], load["ok"], load["errors"]) == (total, total - failed, failed)
    assert [(a["attempt"], a["requests"], a["failed"]) for a in s["attempts"]] == [
        (1, len(first), failed),
        (2, REQUESTS, 0),
    ]
    assert s["attempts"][0]["interrupted"] == "the server exited during the load"
    assert s["attempts"][0]["ended"] == "killed by SIGKILL" and s["interrupted"] is None
    [window] = s["downtime"]["windows"]
    assert (window["after_attempt"], window["restored_by"]) == (1, 2)
    a2 = record.read_json("attempts/2/serving.json")
    ready_2 = a2["launched_at"] + a2["ready"]["seconds"]
    assert window["seconds"] == pytest.approx(ready_2 - window["since"], abs=1e-5)
    assert window["seconds"] > 0 and s["downtime"]["seconds"] == window["seconds"]
    # Each attempt keeps its own figures.
    assert record.read_json("attempts/1/serving.json")["load"]["requests"] == len(first)
    assert a2["load"]["requests"] == REQUESTS and a2["interrupted"] is None

    c = checks(record)
    by = f"attempt 1: {failed} of {len(first)} failed, cut short (killed by SIGKILL)"
    by += f"; attempt 2: 0 of {REQUESTS} failed"
    assert c["error rate"]["status"] == "fail", c["error rate"]
    assert f"{failed / total:.2%} of {total} requests failed" in c["error rate"]["evidence"]
    assert by in c["error rate"]["evidence"]
    assert c["load"]["status"] == "pass", c["load"]  # attempt 2 served its whole load
    assert f"{total} requests" in c["load"]["evidence"] and "in 2 attempts" in c["load"]["evidence"]
    down = c["downtime"]
    assert (down["status"], down["required"]) == ("fail", False)  # information
    assert f"{window['seconds']:.2f}s without a ready server" in down["evidence"]
    assert (
        "without a ready server after attempt 1 (killed by SIGKILL), until attempt 2 was ready"
        in (down["evidence"])
    )
    assert c["restarts"]["status"] == "pass"

    shown = project.cli("show", record.run_id, check_rc=0).stdout
    assert f"({failed:,} of {total:,})" in shown and by in shown
    assert "downtime: " in shown and "until attempt 2 was ready" in shown
    html = (record.path / "report.html").read_text()
    assert "downtime" in html and "Load level" in html
