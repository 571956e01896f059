"""acceptrun gc: retention and age rules across a workspace, dry run first."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from acceptrun.checkpoint.store import LATEST, QUARANTINE, CheckpointStore
from acceptrun.cli.main import main
from acceptrun.errors import UserError
from acceptrun.record.workspace import Workspace, now_iso
from acceptrun.run.retention import GcOptions, format_gc, parse_age, plan_gc
from builders import run_with_checkpoints, steps_on_disk

DAY = 86400.0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def finished(verdict: str, ended_days_ago: float = 0.0) -> dict[str, Any]:
    ended = now_iso(time.time() - ended_days_ago * DAY)
    return {"status": "finished", "verdict": verdict, "ended_at": ended}


def gc(capsys: pytest.CaptureFixture[str], ws: Workspace, *args: str) -> tuple[int, str]:
    code = main(["--workspace", str(ws.root), "gc", *args])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace.create(tmp_path / ".acceptrun")


def test_dry_run_lists_and_deletes_nothing(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = run_with_checkpoints(ws, tmp_path, "a", [10, 20, 30, 40], **finished("accepted"))
    before = sorted(p.relative_to(record.path) for p in record.path.rglob("*"))

    code, out = gc(capsys, ws)

    assert code == 0
    assert "dry run" in out and record.run_id in out
    assert "finished/accepted" in out and "2/4" in out  # keep_last = 2 by default
    assert sorted(p.relative_to(record.path) for p in record.path.rglob("*")) == before
    assert not list(record.events("checkpoint_delete"))


def test_apply_frees_exactly_the_planned_bytes_and_records_events(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = run_with_checkpoints(
        ws, tmp_path, "b", [10, 20, 30, 40, 50], extra="[checkpoint]\nkeep_every = 20\n",
        **finished("rejected"),
    )  # fmt: skip
    (record.outputs_dir / "model").mkdir(parents=True)
    (record.outputs_dir / "model" / "w.bin").write_bytes(b"x" * 100)
    doomed = [record.checkpoints_dir / f"step-{s}" for s in (10, 30)]  # not last 2, not %20
    expected = sum(dir_bytes(p) for p in doomed)
    plans = plan_gc(ws, GcOptions())
    assert [d.step for d in plans[0].delete] == [10, 30]
    assert plans[0].nbytes == expected

    code, out = gc(capsys, ws, "--apply")

    assert code == 0 and "freed" in out
    assert steps_on_disk(record) == [20, 40, 50]
    assert (record.outputs_dir / "model" / "w.bin").exists()
    assert record.exists("run.json") and record.exists("spec.toml")
    deletes = list(record.events("checkpoint_delete"))
    assert [(e["step"], e["reason"]) for e in deletes] == [(10, "gc"), (30, "gc")]
    assert sum(e["bytes"] for e in deletes) == expected
    assert not any(p.name.startswith(".deleting-") for p in record.checkpoints_dir.iterdir())
    assert (record.checkpoints_dir / LATEST).read_text() == "step-50\n"
    _, again = gc(capsys, ws)  # nothing left to do
    assert record.run_id not in again


def test_keep_best_is_kept_like_the_store_keeps_it(ws: Workspace, tmp_path: Path) -> None:
    losses = {10: 3.0, 20: 0.5, 30: 2.0, 40: 1.0, 50: 1.5}
    record = run_with_checkpoints(
        ws, tmp_path, "best", list(losses), metrics=losses,
        extra='[checkpoint]\nkeep_best = "loss:min"\n', **finished("accepted"),
    )  # fmt: skip
    (plan,) = plan_gc(ws, GcOptions())
    store = CheckpointStore(record.checkpoints_dir, keep_last=2, keep_best=("loss", "min"))
    assert [d.step for d in plan.delete] == [10, 30]
    assert store.apply_retention() == [10, 30]  # the store itself agrees


def test_old_accepted_run_keeps_its_newest_verified_checkpoint(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = run_with_checkpoints(ws, tmp_path, "old", [10, 20, 30], **finished("accepted", 40))
    recent = run_with_checkpoints(ws, tmp_path, "new", [10, 20], **finished("accepted", 1))
    # The newest checkpoint of the old run is corrupt: the one before is its lineage.
    (old.checkpoints_dir / "step-30" / "weights.bin").write_bytes(b"garbage")

    code, out = gc(capsys, ws, "--older-than", "30d", "--apply")

    assert code == 0
    assert steps_on_disk(old) == [20]
    assert (old.checkpoints_dir / LATEST).read_text() == "step-20\n"
    assert steps_on_disk(recent) == [10, 20]  # ended a day ago: retention only
    assert old.run_id in out and recent.run_id not in out


@pytest.mark.parametrize(
    ("flags", "left"),
    [
        pytest.param([], [], id="rejected-loses-all"),
        pytest.param(["--keep-rejected"], [20, 30], id="keep-rejected"),
    ],
)
def test_old_rejected_run(
    ws: Workspace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    left: list[int],
) -> None:
    record = run_with_checkpoints(ws, tmp_path, "rej", [10, 20, 30], **finished("rejected", 40))
    gc(capsys, ws, "--older-than", "30d", "--apply", *flags)
    assert steps_on_disk(record) == left
    assert (record.checkpoints_dir / LATEST).exists() == bool(left)


def test_quarantine_is_kept_unless_asked(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = run_with_checkpoints(ws, tmp_path, "q", [10, 20, 30], **finished("accepted"))
    store = CheckpointStore(record.checkpoints_dir)
    moved = store.quarantine(record.checkpoints_dir / "step-10", "failed verification: test")
    qbytes = dir_bytes(moved)

    gc(capsys, ws, "--apply")
    assert moved.is_dir()  # evidence stays

    (plan,) = plan_gc(ws, GcOptions(include_quarantine=True))
    assert plan.nbytes == qbytes and (plan.kept, plan.total) == (2, 3)
    gc(capsys, ws, "--apply", "--include-quarantine")
    assert not moved.exists() and (record.checkpoints_dir / QUARANTINE).is_dir()
    assert steps_on_disk(record) == [20, 30]
    (event,) = [e for e in record.events("checkpoint_delete") if e["rule"] == "quarantined"]
    assert event["step"] == 10 and event["reason"] == "gc" and event["bytes"] == qbytes


def test_bad_older_than_names_the_value(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    # Refused as the command line is parsed: argparse's usage error names the flag.
    with pytest.raises(SystemExit) as exit_:
        gc(capsys, ws, "--older-than", "forever")
    out = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "argument --older-than: 'forever' is not a duration" in out and "30d" in out
    with pytest.raises(UserError, match="forever"):
        parse_age("forever")
    assert parse_age("30d") == 30 * DAY


def test_table_without_prices_shows_bytes_and_dash(ws: Workspace, tmp_path: Path) -> None:
    run_with_checkpoints(ws, tmp_path, "t", [10, 20, 30], **finished("accepted"))
    plans = plan_gc(ws, GcOptions())
    for plan in plans:
        plan.price_per_gib_month = None
    text = format_gc(plans, applied=False)
    header, row, total = text.splitlines()[1:4]
    assert header.split() == [
        "RUN", "STATUS/VERDICT", "CHECKPOINTS", "BYTES", "FREED", "USD/MONTH", "SAVED",
    ]  # fmt: skip
    assert row.split()[-2:] == ["KiB", "-"] and row.split()[2] == "2/3"
    assert total.startswith("TOTAL") and total.endswith("-")
    assert os.path.isdir(plans[0].delete[0].path)  # formatting deletes nothing


def test_storage_price_from_the_catalog(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (ws.root / "prices.toml").write_text(
        '[[price]]\nprovider = "test"\ninstance = "box"\ngpus = 1\nprice_per_hour = 1.0\n'
        'billing = "per_second"\nstart_rule = "launch"\nstorage_per_gib_month = 1048576.0\n'
        'source = "test"\ndate = "2026-01-01"\n'
    )  # USD per GiB-month chosen so that 1 KiB costs 1 USD a month
    cost = '[cost]\nprovider = "test"\ninstance = "box"\n'
    priced = run_with_checkpoints(
        ws, tmp_path, "p", [10, 20, 30], extra=cost, **finished("accepted")
    )
    plain = run_with_checkpoints(ws, tmp_path, "u", [10, 20, 30], **finished("accepted"))
    bad = '[cost]\nprovider = "test"\ninstance = "nope"\n'
    broken = run_with_checkpoints(
        ws, tmp_path, "x", [10, 20, 30], extra=bad, **finished("accepted")
    )
    nbytes = dir_bytes(priced.checkpoints_dir / "step-10")

    _, out = gc(capsys, ws)

    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert rows[priced.run_id][-1] == f"{nbytes / 1024:.2f}"
    assert rows[plain.run_id][-1] == "-" and rows[broken.run_id][-1] == "-"
    assert rows["TOTAL"][-1] == f"{nbytes / 1024:.2f}"
    assert f"note {broken.run_id}: no storage price" in out and "'nope'" in out
