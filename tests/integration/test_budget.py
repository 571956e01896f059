"""Budgets on real runs: warning at 80%, a graceful stop (checkpoint first) before the
budget is passed, bad budgets refused before launch, and the verdict's cost lines."""

from __future__ import annotations

import json
from pathlib import Path

from acceptrun.run.launch import launch
from budget_job import make


def test_budget_stop_checkpoints_first_and_is_a_limit(tmp_path: Path) -> None:
    # The stop is due 10 s after launch (budget minus grace). The grace period is long
    # because the checkpoint at the stop imports torch, which took over 60 s on a loaded
    # machine; a stop that ends sooner ends the test sooner.
    budget, grace = 130.0, 120.0
    spec, ws = make(
        tmp_path, f'budget_usd = {budget}\ngrace_period = "{grace:g}s"\nmax_restarts = 3'
    )
    result = launch(spec, workspace=ws, echo=False)
    record = result.record
    (warning,) = list(record.events("budget_warning"))  # before the stop, always
    (stop,) = list(record.events("budget_stop"))
    assert warning["t"] <= stop["t"]
    # Billing starts at launch (1 USD a second), and the stop is due when the bill at the
    # end of the grace period would pass the budget: budget - grace s after launch. On a loaded
    # machine the first attempt may start later than that; the supervisor then stops it at
    # its first look, and the budget is already gone (the verdict says so).
    (launched,) = list(record.events("run_start"))
    (started,) = list(record.events("attempt_start"))
    in_time = started["t"] - launched["t"] < budget - grace
    (attempt,) = [json.loads(p.read_text()) for p in (record.path / "attempts").glob("*/exit.json")]
    assert attempt["outcome"] == "budget" and attempt["class"] == "budget"
    stopped = list(record.events("stopped"))
    assert not list(record.events("kill_sent")), "the grace period ran out before the exit"
    if list(record.events("step")):  # the stop came inside the loop, after some steps:
        (stop_event,) = stopped  # the client checkpointed the last step done, then exited
        assert stop_event["checkpoint"] is not None
    else:  # the stop came before the first step (a slow start): nothing to checkpoint
        assert all(e["checkpoint"] is None for e in stopped) and len(stopped) <= 1
    assert not list(record.events("restart"))  # a limit, not a failure: no restart
    ledger = json.loads((record.path / "ledger.json").read_text())
    verdict = {
        c["name"]: c for c in json.loads((record.path / "verdict.json").read_text())["checks"]
    }
    if in_time:  # the supervisor was watching before the stop was due: respected
        assert stop["spent_usd"] < budget and ledger["compute"]["usd"] <= budget
        assert verdict["budget"]["status"] == "pass"
    else:  # the verdict agrees with the ledger either way
        within = ledger["compute"]["usd"] <= budget
        assert verdict["budget"]["status"] == ("pass" if within else "fail")
    assert verdict["exit"]["status"] == "fail"  # but the run did not finish
    assert "USD in all" in verdict["cost"]["evidence"]
