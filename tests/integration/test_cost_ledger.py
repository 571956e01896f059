"""The cost ledger over real runs: the split of billed time, storage, people, totals.

Runs are priced at 3600 USD per hour (1 USD per second, billed per minute), so the
figures read as seconds and the rounding up to a minute is plain to see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.units import format_usd
from acceptrun.cli.main import main
from acceptrun.cost.ledger import PARTS, build_ledger
from acceptrun.record.workspace import RunRecord
from conftest import launch_job

# Steps of ~50 ms; a blocking checkpoint after steps 2 and 5; an output at the end.
WORKLOAD = """
import time
import numpy as np
import acceptrun

weights = np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32)
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 8):
    time.sleep(0.05)
    run.log(step, loss=1.0 / (step + 1))
    if step % 3 == 2:
        run.checkpoint(step, block=True)
open("model.bin", "wb").write(b"w" * 4096)
run.output("model", "model.bin")
"""

PRICE = "[cost]\nprice_per_hour = 3600\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three runs in one workspace: killed and resumed, clean, failed preflight."""
    root = tmp_path_factory.mktemp("cost")
    ws = root / ".acceptrun"
    killed = launch_job(root, ws, "killed", WORKLOAD, extra=PRICE, inject=["kill@step=4"])
    clean = launch_job(root, ws, "clean", WORKLOAD, extra=PRICE)
    failed = launch_job(root, ws, "pf", WORKLOAD, extra=PRICE + '[expect]\npython = "<3.0"\n')
    return {"ws": ws, "killed": killed, "clean": clean, "failed": failed}


def cli(ws: Path, *args: str) -> int:
    try:
        return main(["--workspace", str(ws), *args])
    except SystemExit as exc:  # argparse's usage error: exit 2, its message on stderr
        return int(exc.code or 0)


def _sums_to_billed(ledger: dict[str, Any]) -> None:
    split = ledger["compute"]["split_s"]
    assert set(split) == set(PARTS)
    assert sum(split.values()) == pytest.approx(ledger["billed_s"], abs=1e-5)
    assert all(v >= 0 for v in split.values()), split
    assert sum(ledger["compute"]["split_usd"].values()) == pytest.approx(
        ledger["compute"]["usd"], abs=1e-4
    )


def test_killed_run_splits_billed_time_into_productive_waste_idle_stall(
    runs: dict[str, Any],
) -> None:
    result = runs["killed"]
    assert result.exit_code == 0, result.verdict
    ledger = build_ledger(result.record)
    assert ledger["priced"] and ledger["price"]["price_per_hour"] == 3600
    # Per-minute rounding: the wall time is billed in whole minutes, 1 USD a second (a minute
    # on a quiet machine; more when a busy one slowed the start-ups).
    billed = 60 * -(-ledger["wall_s"] // 60)
    assert ledger["billed_s"] == billed >= 60
    assert ledger["compute"]["usd"] == pytest.approx(billed)
    assert ledger["compute"]["detail_s"]["idle.rounding"] == pytest.approx(
        billed - ledger["wall_s"], abs=0.01
    )
    _sums_to_billed(ledger)
    split = ledger["compute"]["split_s"]
    assert split["productive"] > 0.2  # 8 kept steps of ~50 ms, less the first of each attempt
    assert split["wasted"] > 0  # steps 3 and 4 were redone after the kill
    assert split["checkpoint_stall"] > 0
    first, second = ledger["compute"]["attempts"]
    assert first["outcome"] == "signaled" and first["split_s"]["wasted"] > 0
    assert second["outcome"] == "success" and second["split_s"]["wasted"] == 0
    assert ledger["gpus"] == 0 and ledger["device_seconds"] == 0  # a CPU run bills no GPU
    assert ledger["accepted"] is True
    assert json.loads((result.record.path / "ledger.json").read_text()) == ledger


def test_storage_counts_checkpoints_and_what_is_left_behind(runs: dict[str, Any]) -> None:
    record: RunRecord = runs["killed"].record
    storage = build_ledger(record)["storage"]
    assert storage["checkpoints"]["gib_hours"] > 0
    assert {i["step"] for i in storage["checkpoints"]["items"]} >= {2, 5}
    on_disk = sum(p.stat().st_size for p in record.checkpoints_dir.rglob("*") if p.is_file())
    left = storage["left_behind"]
    assert left["checkpoint_bytes"] == on_disk > 0
    assert left["output_bytes"] == 4096
    assert left["bytes"] == on_disk + 4096
    assert storage["outputs"]["items"][0]["bytes"] == 4096


def test_a_run_refused_at_preflight_is_billed_no_compute(runs: dict[str, Any]) -> None:
    """No process ran: 0 compute (was a billed minute), the checks' time on its own line,
    and the verdict only the checks that ran (no "log steps" or "set progress.pattern")."""
    result = runs["failed"]
    assert result.exit_code == 2
    ledger = build_ledger(result.record)
    assert ledger["status"] == "failed_preflight" and ledger["accepted"] is False
    assert ledger["billed_s"] == 0 and ledger["compute"]["usd"] == 0
    assert set(ledger["compute"]["split_s"].values()) == {0}
    assert ledger["preflight_refused_s"] == pytest.approx(ledger["wall_s"], abs=1e-3)
    assert ledger["wall_s"] > 0
    assert ledger["compute"]["attempts"] == []
    verdict = json.loads((result.record.path / "verdict.json").read_text())
    groups = {c["group"] for c in verdict["checks"]}
    assert groups <= {"setup", "data"}, verdict["checks"]
    text = json.dumps(verdict)
    assert "run.steps()" not in text and "progress.pattern" not in text, text


def test_unpriced_run_keeps_the_seconds_at_zero_usd(runs: dict[str, Any], tmp_path: Path) -> None:
    result = launch_job(tmp_path, tmp_path / ".acceptrun", "free", WORKLOAD)
    ledger = build_ledger(result.record)
    assert not ledger["priced"] and "no [cost]" in ledger["unpriced_reason"]
    assert ledger["total_usd"] == 0 and ledger["billed_s"] == ledger["wall_s"] > 0
    _sums_to_billed(ledger)


def test_cost_add_show_summary_and_whatif(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, record = runs["ws"], runs["clean"].record
    assert cli(ws, "cost", "add", record.run_id, "--human-minutes", "30", "--rate", "120",
               "--note", "reviewed the loss curve") == 0  # fmt: skip
    assert cli(ws, "cost", "add", record.run_id, "--switching-usd", "5") == 0
    ledger = json.loads((record.path / "ledger.json").read_text())
    assert ledger["totals"]["human_usd"] == 60 and ledger["totals"]["switching_usd"] == 5
    # Compute: whole minutes of the run's wall time at 1 USD a second (one minute on a quiet
    # machine, more when a busy one slowed the start-up).
    billed = ledger["billed_s"]
    assert billed == 60 * -(-ledger["wall_s"] // 60) and ledger["compute"]["usd"] == billed
    assert ledger["total_usd"] == pytest.approx(60 + billed + 5 + ledger["totals"]["storage_usd"])
    capsys.readouterr()

    assert cli(ws, "cost", "show", record.run_id) == 0
    shown = capsys.readouterr().out
    assert "productive" in shown and "30 min at $120.00/h = $60.00" in shown

    assert cli(ws, "cost", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["runs"] == 3 and summary["accepted"] == 2
    assert summary["cost_per_accepted_run"] == pytest.approx(summary["total_usd"] / 2)
    assert cli(ws, "cost") == 0
    text = capsys.readouterr().out
    assert "3 runs, 2 accepted" in text
    assert f"cost per accepted run: ${summary['total_usd'] / 2:,.2f}" in text
    assert "where the money went: " in text and "% of spend was " in text
    assert cli(ws, "cost", "--spec", "pf") == 0
    assert "no accepted run yet" in capsys.readouterr().out

    assert cli(ws, "cost", "whatif", record.run_id, "--on", "lambda:gpu_1x_h100_sxm5") == 0
    projected = capsys.readouterr().out
    assert projected.startswith("PROJECTION (not a measurement)")
    assert "same measured wall time" in projected
    # The same wall time, billed in the same whole minutes at 3.78 USD/h (0.063 USD a minute).
    assert f"compute     {'$' + format_usd(billed / 60 * 0.063):>12}" in projected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["cost", "show", "nope"], "no run 'nope'", id="unknown-run"),
        pytest.param(
            ["cost", "add", "RUN", "--human-minutes", "-5", "--rate", "100"],
            "argument --human-minutes: '-5' is out of range",
            id="negative-minutes",
        ),
        pytest.param(["cost", "add", "RUN", "--human-minutes", "5"], "go together", id="no-rate"),
        pytest.param(["cost", "add", "RUN"], "nothing to add", id="nothing"),
        pytest.param(
            ["cost", "whatif", "RUN", "--on", "lambda:gpu_1x_h100_sxm"],
            "gpu_1x_h100_sxm5",
            id="unknown-instance-near-match",
        ),
        pytest.param(
            ["cost", "whatif", "RUN", "--on", "h100"], "not PROVIDER:INSTANCE", id="no-colon"
        ),
        pytest.param(["cost", "--since", "yesterday"], "not a date", id="bad-since"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    runs: dict[str, Any], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    costs = runs["clean"].record.path / "cost.jsonl"
    before = costs.read_bytes() if costs.exists() else b""
    args = [runs["clean"].record.run_id if a == "RUN" else a for a in args]
    assert cli(runs["ws"], *args) == 2
    assert message in capsys.readouterr().err
    assert (costs.read_bytes() if costs.exists() else b"") == before  # nothing half-written
