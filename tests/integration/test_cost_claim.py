"""Who caused the waste, over real runs: a preemption is the provider's, a user error the
workload's, an injected fault a drill; ``acceptrun cost claim`` lists the provider's only.

The preemption is a real SIGTERM the supervisor did not send (the workload's first
attempt gets it from outside the supervisor, as a spot reclaim would); priced at 3600 USD
per hour, so the figures read as seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acceptrun.cli.main import main
from conftest import launch_job

# First attempt: a SIGTERM from outside the supervisor (the process sends it to itself,
# as a provider's reclaim would); the restart finds the marker and succeeds.
PREEMPTED = """
import os, pathlib, signal
marker = pathlib.Path("attempted")
if not marker.exists():
    marker.write_text("1")
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
"""
USER_ERROR = "import no_such_module_for_the_claim_test\n"
# First attempt waits for the injected term@time fault; the restart succeeds.
DRILL = """
import pathlib, signal
marker = pathlib.Path("attempted")
if not marker.exists():
    marker.write_text("1")
    signal.pause()
"""
PRICE = "[cost]\nprice_per_hour = 3600\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("claim")
    ws = root / ".acceptrun"
    return {
        "ws": ws,
        "preempted": launch_job(root, ws, "preempted", PREEMPTED, extra=PRICE),
        "user": launch_job(root, ws, "user", USER_ERROR, extra=PRICE),
        "drill": launch_job(root, ws, "drill", DRILL, extra=PRICE, inject=["term@time=1s"]),
    }


def cli(ws: Path, *args: str) -> int:
    return main(["--workspace", str(ws), *args])


def test_each_failed_attempt_carries_its_responsibility(runs: dict[str, Any]) -> None:
    from acceptrun.cost.ledger import build_ledger

    pre = build_ledger(runs["preempted"].record)["compute"]
    first = pre["attempts"][0]
    assert (first["class"], first["responsibility"]) == ("preempted", "provider")
    assert first["evidence"]["injected"] is False
    assert any("SIGTERM" in line for line in first["evidence"]["lines"]), first["evidence"]
    assert pre["attempts"][1]["responsibility"] == "none"
    assert first["split_s"]["wasted"] > 0
    assert pre["waste"]["seconds"]["provider"] == pytest.approx(first["split_s"]["wasted"])

    user = build_ledger(runs["user"].record)["compute"]
    (only,) = user["attempts"]
    assert (only["class"], only["responsibility"]) == ("user_error", "workload")
    assert any("no_such_module_for_the_claim_test" in x for x in only["evidence"]["lines"])
    assert user["waste"]["seconds"]["workload"] > 0 and user["waste"]["seconds"]["provider"] == 0

    drill = build_ledger(runs["drill"].record)["compute"]["attempts"][0]
    # An injected preemption is a preemption, booked to the drill that asked for it.
    assert (drill["class"], drill["responsibility"]) == ("preempted", "drill")
    assert drill["evidence"]["injected"] is True


def test_cost_claim_lists_the_provider_incident_only(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ws = runs["ws"]
    capsys.readouterr()
    assert cli(ws, "cost", "claim", "--since", "7d", "--json") == 0
    found = json.loads(capsys.readouterr().out)
    (incident,) = found["incidents"]
    assert incident["run_id"] == runs["preempted"].record.run_id
    assert incident["class"] == "preempted" and not incident["injected"]
    assert incident["started_at"] and incident["ended_at"]
    assert incident["wasted_s"] > 0
    assert incident["wasted_usd"] == pytest.approx(incident["wasted_s"])  # 1 USD a second
    assert found["wasted_usd"] == pytest.approx(incident["wasted_usd"])

    assert cli(ws, "cost", "claim", "--since", "7d") == 0
    text = capsys.readouterr().out
    assert text.startswith("1 provider-caused incident since ")
    assert runs["preempted"].record.run_id in text and "evidence: " in text
    assert runs["user"].record.run_id not in text and runs["drill"].record.run_id not in text

    assert cli(ws, "cost", "claim", "--drills") == 0
    text = capsys.readouterr().out
    assert runs["drill"].record.run_id in text and "injected by a drill" in text


def test_cost_splits_waste_by_whose_failure(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ws = runs["ws"]
    capsys.readouterr()
    assert cli(ws, "cost", "--by-responsibility") == 0
    text = capsys.readouterr().out
    assert "wasted, by whose failure: provider $" in text
    for group in ("week", "provider", "run"):
        assert f"wasted, by whose failure, per {group}:" in text
    assert cli(ws, "cost", "--json") == 0
    totals = json.loads(capsys.readouterr().out)
    assert "waste_by" not in totals  # the split per run is asked for, as in text
    assert cli(ws, "cost", "--by-responsibility", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["waste_usd"] == totals["waste_usd"]
    assert summary["waste_usd"]["provider"] > 0 and summary["waste_usd"]["workload"] > 0
    assert {r["run"] for r in summary["waste_by"]["run"]} == {
        runs[k].record.run_id for k in ("preempted", "user", "drill")
    }


def test_a_machine_stop_recorded_after_the_run_is_booked_as_idle(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime

    from acceptrun.cost.ledger import build_ledger

    record = runs["user"].record
    before = build_ledger(record)
    assert not before["after_run"]["counted"] and "not counted" in before["after_run"]["why"]
    end = max(s["end"] for s in before["segments"])
    when = datetime.fromtimestamp(end + 90, UTC).isoformat()
    capsys.readouterr()
    assert cli(runs["ws"], "cost", "add", record.run_id, "--machine-stopped-at", when) == 0
    assert "machine after the run 90 s" in capsys.readouterr().out
    ledger = build_ledger(record)
    assert ledger["after_run"]["counted"] and ledger["after_run"]["seconds"] == pytest.approx(90)
    assert ledger["billed_s"] == pytest.approx(before["billed_s"] + 90)
