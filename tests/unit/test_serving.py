"""Serving runs: real servers on loopback under a real `acceptrun run`, and the load generator.

The servers are tests/serving_server.py (standard library) and the example FastAPI server
(examples/serving/server.py, skipped when FastAPI, uvicorn or torch are missing). Every
wait is on readiness or on the run's end, never on a guess.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.builders import T0, RecordBuilder

from acceptrun.errors import SpecError
from acceptrun.serving.driver import ServingDriver
from acceptrun.serving.load import arrival_schedule
from acceptrun.spec.model import parse_spec
from conftest import Project

RUN_TIMEOUT = 240  # seconds: a generous bound on a whole run on a busy 2-core machine


def run(project: Project, spec: Path) -> subprocess.CompletedProcess[str]:
    return project.cli("run", str(spec), timeout=RUN_TIMEOUT)


# ---- the load generator ----------------------------------------------------------------------


def test_arrival_schedule_is_poisson_at_the_rate_and_fixed_by_the_seed() -> None:
    times = arrival_schedule(100.0, 5000, seed=3)
    assert times == arrival_schedule(100.0, 5000, seed=3)
    assert 45 <= times[-1] <= 55  # 5000 arrivals at 100/s: about 50 s
    gaps = [b - a for a, b in itertools.pairwise(times)]
    cv = (sum((g - 0.01) ** 2 for g in gaps) / len(gaps)) ** 0.5 / 0.01
    assert 0.9 <= cv <= 1.1  # exponential gaps: standard deviation = mean
    assert arrival_schedule(10.0, 3, arrivals="uniform") == [0.0, 0.1, 0.2]


# ---- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        pytest.param('rate = 5\nconcurrency = 2\nrequests = 1\nready_url = "http://h/"',
                     "exactly one of rate", id="rate-and-concurrency"),
        pytest.param("rate = 5\nrequests = 1", "a health URL", id="no-readiness"),
        pytest.param('rate = 5\nready_log = "up"', "a length of load", id="no-length"),
        pytest.param('rate = 5\nrequests = 1\nready_log = "up"\nmax_ttft_p99 = "1s"',
                     "stream = true", id="ttft-without-stream"),
        pytest.param('rate = 5\nrequests = 1\nready_log = "("', "regular expression",
                     id="bad-regex"),
    ],
)  # fmt: skip
def test_serving_section_errors_name_the_field_and_the_fix(serving: str, message: str) -> None:
    text = f'name = "s"\ncommand = ["srv"]\n[serving]\nurl = "http://127.0.0.1:1/x"\n{serving}\n'
    with pytest.raises(SpecError, match="serving\\.") as info:
        parse_spec(text)
    assert message in str(info.value)


def test_a_spec_is_a_serving_run_or_a_batch_run_not_both() -> None:
    text = (
        'name = "s"\ncommand = ["srv"]\n[inference]\ninput = "items.txt"\n[serving]\n'
        'url = "http://127.0.0.1:1/x"\nready_log = "up"\nrate = 1\nrequests = 1\n'
    )
    with pytest.raises(SpecError, match="one kind of run a spec"):
        parse_spec(text)


def test_serving_keys_without_a_url_are_refused() -> None:
    with pytest.raises(SpecError, match=r"serving\.url"):
        parse_spec('name = "s"\ncommand = ["srv"]\n[serving]\nrate = 5\n')


# ---- how an attempt ended ----------------------------------------------------------------------


def _settled(
    tmp_path: Path, load: dict[str, int], outcome: str = "failed"
) -> tuple[ServingDriver, Any]:
    """A driver whose load ended ``served`` while the server looked alive, settled with the
    attempt's ``outcome`` (``failed``: the server's own exit, status 3, no stop)."""
    record = RecordBuilder(tmp_path).run("running").record
    spec = parse_spec(
        'name = "s"\ncommand = ["srv"]\n[serving]\nurl = "http://127.0.0.1:1/x"\n'
        'ready_url = "http://127.0.0.1:1/health"\nconcurrency = 1\nrequests = 50\n'
    )
    driver = ServingDriver(record, spec, 1, launched_at=T0, logs=(tmp_path / "o", tmp_path / "e"))
    driver.outcome, driver.stop_reason = "served", "served 50 requests"
    record.file("serving.json").write_text(
        json.dumps({"attempt": 1, "interrupted": None, "load": {"requests": 50, **load}})
    )
    res = SimpleNamespace(outcome=outcome, reason="exited 3", signal=None, failure="failed")
    driver.settle(res, 3)
    return driver, res


def test_a_server_gone_before_its_stop_cuts_a_load_that_met_refused_connections(
    tmp_path: Path,
) -> None:
    # A process closes its sockets a moment before it is a zombie: a fast load can end on
    # refused connections while the server still looks alive. The supervisor then sees it
    # exit on its own, and the load is cut short after all (seen once in the suite).
    driver, res = _settled(tmp_path, {"ok": 4, "errors": 46})
    summary = json.loads(driver.record.file("serving.json").read_text())
    assert summary["interrupted"] == "the server exited during the load"
    assert driver.outcome == "interrupted" and res.outcome == "failed"
    assert summary["load"] == {"requests": 50, "ok": 4, "errors": 46}  # figures kept


def test_a_stop_after_the_load_does_not_cut_it(tmp_path: Path) -> None:
    # Stopped by a user (or a limit) after a load with failed requests: the server did not
    # exit on its own, and the load's failures are its own figures, not a cut.
    driver, _ = _settled(tmp_path, {"ok": 40, "errors": 10}, outcome="stopped")
    summary = json.loads(driver.record.file("serving.json").read_text())
    assert summary["interrupted"] is None and driver.outcome == "served"


def test_a_load_served_whole_stays_whole_when_the_server_exits_after_it(tmp_path: Path) -> None:
    driver, res = _settled(tmp_path, {"ok": 50, "errors": 0})
    summary = json.loads(driver.record.file("serving.json").read_text())
    assert summary["interrupted"] is None and driver.outcome == "served"
    assert res.outcome == "failed"  # the attempt still failed: the server exited 3 on its own
