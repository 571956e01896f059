"""Serving measures without a server process: the arrival schedule, the serving section's
errors, cut loads and downtime, max_downtime, request lines (real servers:
tests/integration/test_serving.py)."""

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
from acceptrun.serving.load import RequestResult, arrival_schedule
from acceptrun.serving.service import combine
from acceptrun.serving.summary import serving_checks
from acceptrun.spec.model import format_duration, parse_spec
from acceptrun.supervisor.classify import Classification
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
    record.file("attempts/1").mkdir(parents=True, exist_ok=True)
    record.file("attempts/1/serving.json").write_text(
        json.dumps({"attempt": 1, "interrupted": None, "load": {"requests": 50, **load}})
    )
    failure = Classification("failed", ["exit status 3"], True, "exited 3")
    res = SimpleNamespace(outcome=outcome, reason="exited 3", signal=None, failure=failure)
    driver.settle(res, 3)
    return driver, res


def test_a_server_gone_before_its_stop_cuts_a_load_that_met_refused_connections(
    tmp_path: Path,
) -> None:
    # A process closes its sockets a moment before it is a zombie: a fast load can end on
    # refused connections while the server still looks alive. The supervisor then sees it
    # exit on its own, and the load is cut short after all (seen once in the suite).
    driver, res = _settled(tmp_path, {"ok": 4, "errors": 46})
    summary = json.loads(driver.record.file("attempts/1/serving.json").read_text())
    assert summary["interrupted"] == "the server exited during the load"
    assert driver.outcome == "interrupted" and res.outcome == "failed"
    assert summary["load"] == {"requests": 50, "ok": 4, "errors": 46}  # figures kept


def test_a_stop_after_the_load_does_not_cut_it(tmp_path: Path) -> None:
    # Stopped by a user (or a limit) after a load with failed requests: the server did not
    # exit on its own, and the load's failures are its own figures, not a cut.
    driver, _ = _settled(tmp_path, {"ok": 40, "errors": 10}, outcome="stopped")
    summary = json.loads(driver.record.file("attempts/1/serving.json").read_text())
    assert summary["interrupted"] is None and driver.outcome == "served"


def test_a_load_served_whole_stays_whole_when_the_server_exits_after_it(tmp_path: Path) -> None:
    driver, res = _settled(tmp_path, {"ok": 50, "errors": 0})
    summary = json.loads(driver.record.file("attempts/1/serving.json").read_text())
    assert summary["interrupted"] is None and driver.outcome == "served"
    assert res.outcome == "failed"  # the attempt still failed: the server exited 3 on its own
    assert summary["ended"] == {"outcome": "failed", "class": "failed", "reason": "exited 3"}


# ---- the service over several attempts ---------------------------------------------------------

SPEC_TEXT = (
    'name = "s"\ncommand = ["srv"]\n[serving]\nurl = "http://127.0.0.1:1/x"\n'
    'ready_url = "http://127.0.0.1:1/health"\nrate = 10\nrequests = 4\nmax_error_rate = 0.01\n'
)
SPEC = parse_spec(SPEC_TEXT)


def _line(attempt: int, t: float, latency: float, ok: bool = True) -> dict[str, Any]:
    r = RequestResult(index=0, intended=t, sent=t, end=t + latency, status=200 if ok else None,
                      error=None if ok else "ConnectionRefusedError")  # fmt: skip
    return {"attempt": attempt, **r.to_dict()}


def _attempt(n: int, launched: float, ready_s: float | None, **extra: Any) -> dict[str, Any]:
    ready = {"ok": True, "seconds": ready_s, "by": "probe"} if ready_s is not None else {
        "ok": False, "seconds": 60.0, "reason": "the server exited before it was ready",
        "stderr_tail": ["boom"]}  # fmt: skip
    return {"attempt": n, "launched_at": launched, "ready": ready, **extra}


def test_requests_round_trip_through_their_lines() -> None:
    r = RequestResult(index=3, intended=0.5, sent=0.501, end=0.9, status=200, bytes_in=7,
                      ttft=0.1, token_times=[0.6, 0.7, 0.85])  # fmt: skip
    back = RequestResult.from_dict(r.to_dict())
    assert back.to_dict() == r.to_dict()
    assert back.token_times == pytest.approx(r.token_times) and back.latency == pytest.approx(0.4)


def test_a_cut_attempt_counts_in_the_service_and_its_gap_is_downtime(tmp_path: Path) -> None:
    # Attempt 1 launched at 1000 s, ready at 1002, answered 2 then died (exit seen at
    # 1010.5) with 1 refused; attempt 2 launched at 1012, ready at 1015, served 4 whole.
    cut = {"requests": 3, "ok": 2, "errors": 1, "seconds": 0.4}
    whole = {"requests": 4, "ok": 4, "errors": 0, "seconds": 0.5}
    killed = {"outcome": "signaled", "class": "killed", "reason": "killed by SIGKILL"}
    attempts = [
        _attempt(1, 1000.0, 2.0, load=cut, first_success_s=2.05, load_started_at=1002.0,
                 interrupted="the server exited during the load", ended=killed,
                 exited_at=1010.5),
        _attempt(2, 1012.0, 3.0, load=whole, first_success_s=3.01, load_started_at=1015.0,
                 interrupted=None),
    ]  # fmt: skip
    lines = [_line(1, 0.0, 0.01), _line(1, 0.1, 0.03), _line(1, 0.2, 0.001, ok=False)]
    lines += [_line(2, 0.1 * i, 0.02) for i in range(4)]
    s = combine(attempts, lines, SPEC.serving)
    load = s["load"]
    assert (load["requests"], load["ok"], load["errors"]) == (7, 6, 1)
    assert load["error_rate"] == pytest.approx(1 / 7)
    assert load["latency"]["max"] == pytest.approx(0.03)  # attempt 1's slowest answer counts
    assert load["seconds"] == pytest.approx(0.9)  # the two loads' spans, not the gap
    assert load["requests_per_s"] == pytest.approx(6 / 0.9)
    assert s["ready"]["seconds"] == 2.0 and s["first_success_s"] == 2.05  # attempt 1's
    assert s["interrupted"] is None  # the service's last attempt served its whole load
    assert s["downtime"] == {"seconds": 4.5, "windows": [{
        "after_attempt": 1, "since": 1010.5, "until": 1015.0, "seconds": 4.5,
        "cause": "killed by SIGKILL", "restored_by": 2,
    }]}  # fmt: skip
    assert [(a["attempt"], a["requests"], a["failed"], a["ended"]) for a in s["attempts"]] == [
        (1, 3, 1, "killed by SIGKILL"), (2, 4, 0, None)]  # fmt: skip

    record = RecordBuilder(tmp_path).run("finished").record
    record.write_json("serving.json", s)
    rows = {name: (status, required, evidence) for _, name, status, required, evidence, _ in
            serving_checks(record, SPEC)}  # fmt: skip
    by = "attempt 1: 1 of 3 failed, cut short (killed by SIGKILL); attempt 2: 0 of 4 failed"
    assert rows["error rate"][0] == "fail"  # max_error_rate sees attempt 1's failure
    assert rows["error rate"][2].startswith("14.29% of 7 requests failed")
    assert by in rows["error rate"][2]
    assert rows["load"][:2] == ("pass", True) and "in 2 attempts" in rows["load"][2]
    assert rows["downtime"][:2] == ("fail", False)  # information, shown as such
    assert rows["downtime"][2].startswith(
        "4.50s without a ready server after attempt 1 (killed by SIGKILL), until attempt 2 was "
        "ready"
    )


def test_a_restart_that_never_becomes_ready_leaves_the_service_down(tmp_path: Path) -> None:
    cut = {"requests": 3, "ok": 2, "errors": 1, "seconds": 0.4}
    killed = {"outcome": "signaled", "class": "killed", "reason": "killed by SIGKILL"}
    attempts = [
        _attempt(1, 1000.0, 2.0, load=cut, first_success_s=2.05, load_started_at=1002.0,
                 interrupted="the server exited during the load", ended=killed,
                 exited_at=1010.5),
        _attempt(2, 1012.0, None, exited_at=1014.0),
    ]  # fmt: skip
    lines = [_line(1, 0.0, 0.01), _line(1, 0.1, 0.03), _line(1, 0.2, 0.001, ok=False)]
    s = combine(attempts, lines, SPEC.serving)
    assert s["ready"]["ok"] and s["load"]["requests"] == 3
    assert s["interrupted"] == "attempt 2 was not ready: the server exited before it was ready"
    [window] = s["downtime"]["windows"]
    assert (window["until"], window["seconds"], window["restored_by"]) == (1014.0, 3.5, None)
    record = RecordBuilder(tmp_path).run("finished").record
    record.write_json("serving.json", s)
    rows = {c[1]: c for c in serving_checks(record, SPEC)}
    assert rows["load"][2] == "fail" and "attempt 2: not ready" in rows["load"][4]
    assert "to the end of the run: no later attempt became ready" in rows["downtime"][4]


def _killed_then_restored() -> dict[str, Any]:
    """Attempt 1 killed at 1010.5 s, attempt 2 ready at 1015: 4.5 s without a server."""
    killed = {"outcome": "signaled", "class": "killed", "reason": "killed by SIGKILL"}
    attempts = [
        _attempt(1, 1000.0, 2.0, load={"seconds": 0.2}, first_success_s=2.05,
                 load_started_at=1002.0, ended=killed, exited_at=1010.5,
                 interrupted="the server exited during the load"),
        _attempt(2, 1012.0, 3.0, load={"seconds": 0.3}, first_success_s=3.01,
                 load_started_at=1015.0, interrupted=None),
    ]  # fmt: skip
    return combine(attempts, [_line(1, 0.0, 0.01), _line(2, 0.0, 0.01)], SPEC.serving)


@pytest.mark.parametrize(
    ("bound", "status"), [("5s", "pass"), ("4.5s", "pass"), ("4s", "fail"), ("0s", "fail")]
)
def test_max_downtime_bounds_the_measured_outage(tmp_path: Path, bound: str, status: str) -> None:
    spec = parse_spec(SPEC_TEXT + f'[acceptance]\nmax_downtime = "{bound}"\n')
    record = RecordBuilder(tmp_path).run("finished").record
    record.write_json("serving.json", _killed_then_restored())
    rows = {c[1]: c for c in serving_checks(record, spec)}
    _, _, got, required, evidence, fix = rows["downtime"]
    assert (got, required) == (status, True)  # judged, no longer information
    limit = f"at most {format_duration(spec.acceptance.max_downtime)} (acceptance.max_downtime)"
    assert limit in evidence and "4.50s" in evidence  # both figures named
    assert (fix is None) == (status == "pass")
    if status == "fail":
        assert evidence.startswith("4.50s measured, " + limit)
        assert "raise acceptance.max_downtime above 4.50s" in fix


def test_max_downtime_fails_a_service_that_never_came_back(tmp_path: Path) -> None:
    cut = {"requests": 3, "ok": 2, "errors": 1, "seconds": 0.4}
    killed = {"outcome": "signaled", "class": "killed", "reason": "killed by SIGKILL"}
    attempts = [
        _attempt(1, 1000.0, 2.0, load=cut, first_success_s=2.05, load_started_at=1002.0,
                 ended=killed, exited_at=1010.5),
        _attempt(2, 1012.0, None, exited_at=1014.0),
    ]  # fmt: skip
    record = RecordBuilder(tmp_path).run("finished").record
    record.write_json("serving.json", combine(attempts, [_line(1, 0.0, 0.01)], SPEC.serving))
    spec = parse_spec(SPEC_TEXT + '[acceptance]\nmax_downtime = "1h"\n')
    row = {c[1]: c for c in serving_checks(record, spec)}["downtime"]
    assert row[2:4] == ("fail", True)  # 3.5 s measured, but the outage never ended
    assert row[4].startswith("at least 3.50s, no ready server at the end of the run, at most 1h")


def test_a_service_without_an_outage_passes_max_downtime(tmp_path: Path) -> None:
    record = RecordBuilder(tmp_path).run("finished").record
    one = [_attempt(1, 1000.0, 2.0, load={"seconds": 0.3}, first_success_s=2.1, interrupted=None)]
    record.write_json("serving.json", combine(one, [_line(1, 0.0, 0.01)], SPEC.serving))
    spec = parse_spec(SPEC_TEXT + '[acceptance]\nmax_downtime = "0s"\n')
    row = {c[1]: c for c in serving_checks(record, spec)}["downtime"]
    assert row[2:4] == ("pass", True) and row[4].startswith("none: the server stayed up")


@pytest.mark.parametrize("bad", ['"-1s"', '"soon"', "true", '"5 parsecs"'])
def test_max_downtime_must_be_a_duration(bad: str) -> None:
    with pytest.raises(SpecError, match=r"acceptance\.max_downtime: .*expected a duration"):
        parse_spec(SPEC_TEXT + f"[acceptance]\nmax_downtime = {bad}\n")


def test_a_one_attempt_record_of_the_old_layout_is_still_judged(tmp_path: Path) -> None:
    # serving.json as a record written before attempts were kept: no attempts, no downtime.
    load = combine([_attempt(1, 1000.0, 2.0, load={"seconds": 0.3}, first_success_s=2.1)],
                   [_line(1, 0.0, 0.01)], SPEC.serving)["load"]  # fmt: skip
    record = RecordBuilder(tmp_path).run("finished").record
    record.write_json("serving.json", {"attempt": 1, "ready": {"ok": True, "seconds": 2.0,
                      "by": "probe"}, "first_success_s": 2.1, "load": load,
                      "interrupted": None})  # fmt: skip
    rows = {c[1]: c for c in serving_checks(record, SPEC)}
    assert "downtime" not in rows and rows["load"][2] == "pass"
    assert rows["error rate"][4] == "0.00% of 1 requests failed, at most 1.00%"
