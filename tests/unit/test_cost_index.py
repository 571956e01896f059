"""Workspace-wide cost views read each run's figures from the index, not every ledger.

``acceptrun cost`` and the board's spend page add up the figures that the index keeps
of each closed run's ledger.json (record/index.py ``costs``); these tests check they are
the same as the ledgers' own, that a ledger written again refreshes them, and that an
index of an older schema is migrated and back-filled on first read.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from acceptrun._util.sqlite import migrate
from acceptrun.cost.ledger import DETAIL_KEYS, PARTS, RESPONSIBLE, add_costs, build_ledger
from acceptrun.cost.report import claim, select_ledgers, summarize, waste_by
from acceptrun.record import index
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.ui import Board
from acceptrun.ui.spend import spend_page

PRICED = 'name = "{name}"\ncommand = ["true"]\n[cost]\nprice_per_hour = 3600\n'  # 1 USD/s
UNPRICED = 'name = "{name}"\ncommand = ["true"]\n'


def _run(ws: Workspace, name: str, klass: str, *, priced: bool = True, t0: float) -> RunRecord:
    """A closed run: one attempt that failed with ``klass`` after 10 s, then a success."""
    spec = (PRICED if priced else UNPRICED).format(name=name)
    rec = ws.create_run(name, spec_text=spec, state={"status": "finished"})
    rec.event("run_start", t=t0)
    rec.event("attempt_start", t=t0 + 1, attempt=1)
    rec.event(
        "attempt_exit", t=t0 + 11, attempt=1, outcome="failed", returncode=1, signal=None,
        started_at="2027-01-15T08:00:01Z", ended_at="2027-01-15T08:00:11Z", reason="ended",
        work={"seconds_lost": 4.0}, decision=None,
        **{"class": klass, "class_reason": f"it was {klass}", "evidence": [klass]},
    )  # fmt: skip
    rec.event("attempt_start", t=t0 + 12, attempt=2)
    rec.event(
        "attempt_exit", t=t0 + 30, attempt=2, outcome="success", returncode=0, signal=None,
        reason="exited 0", work={}, decision=None, **{"class": "success", "evidence": []},
    )  # fmt: skip
    rec.update_state(verdict="accepted" if klass != "cuda_oom" else "rejected")
    build_ledger(rec)  # written as close writes it: the index's cost row follows
    return rec


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    ws = Workspace.create(tmp_path / "ws")
    t0 = 1_800_000_000.0
    for i, (klass, priced) in enumerate(
        [("preempted", True), ("cuda_oom", True), ("success", True), ("hang", False)]
    ):
        _run(ws, f"r{i % 2}", klass, priced=priced, t0=t0 + 1000 * i)
    return ws


def _rounded(value: Any) -> Any:
    """Figures to 6 places: a sum in another order differs in its last bits."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 6) if isinstance(value, float) else value


def _ledgers(ws: Workspace) -> list[dict[str, Any]]:
    return [json.loads((ws.runs_dir / r / "ledger.json").read_text()) for r in ws.run_ids()]


def test_the_index_keeps_every_figure_the_cost_views_add_up() -> None:
    kept = set(index.COST_FIGURES)
    assert {f"compute.split_usd.{p}" for p in PARTS} <= kept
    assert {f"compute.waste.seconds.{r}" for r in RESPONSIBLE} <= kept
    details = {"productive", "checkpoint_stall", *DETAIL_KEYS}
    assert {f"compute.detail_s.{k}" for k in details} <= kept


def test_cost_from_the_index_equals_the_sums_of_the_ledgers(ws: Workspace) -> None:
    ledgers = _ledgers(ws)
    found, live = select_ledgers(ws)
    assert live == [] and len(found) == len(ledgers) == 4
    got = summarize(found)
    assert got["runs"] == 4
    assert got["accepted"] == sum(led["accepted"] is True for led in ledgers) == 3
    assert got["unpriced"] == 1
    assert got["total_usd"] == pytest.approx(sum(led["total_usd"] for led in ledgers))
    assert got["total_usd"] > 0
    for part in PARTS:
        want = sum(led["compute"]["split_usd"][part] for led in ledgers)
        assert got["split_usd"][part] == pytest.approx(want)
    for key, value in got["detail_s"].items():
        assert value == pytest.approx(
            sum(led["compute"]["detail_s"].get(key, 0.0) for led in ledgers)
        )
    # the same answer from the ledgers read from the records
    assert _rounded(summarize(ledgers)) == _rounded(got)
    for group in ("week", "provider", "run"):
        assert waste_by(found, group) == waste_by(ledgers, group)
    assert [i["run_id"] for i in claim(found)["incidents"]] == [
        i["run_id"] for i in claim(ledgers)["incidents"]
    ]
    # an item reads like its ledger
    assert {led["run_id"] for led in found} == {led["run_id"] for led in ledgers}


def test_filters_read_the_index_rows(ws: Workspace) -> None:
    found, _ = select_ledgers(ws, spec="r0")
    assert {led["name"] for led in found} == {"r0"} and len(found) == 2
    found, _ = select_ledgers(ws, provider="custom")
    assert len(found) == 3  # the unpriced run has no provider


def test_a_ledger_written_again_refreshes_its_row(ws: Workspace) -> None:
    before = summarize(select_ledgers(ws)[0])["totals"]["human_usd"]
    record = ws.get_run(ws.run_ids()[0])
    add_costs(record, human_minutes=30, rate_per_hour=100.0)
    build_ledger(record)  # what `acceptrun cost add` does
    after = summarize(select_ledgers(ws)[0])["totals"]["human_usd"]
    assert after == pytest.approx(before + 50.0)


def test_the_spend_page_shows_the_indexed_totals(ws: Workspace) -> None:
    page = spend_page(Board.for_workspaces([ws]))
    total = sum(led["total_usd"] for led in _ledgers(ws))
    assert f"${total:,.2f}" in page
    assert "<h2>By spec</h2>" in page and ">r0<" in page and ">r1<" in page


def test_an_index_of_the_older_schema_is_migrated_and_back_filled(ws: Workspace) -> None:
    want = _rounded(summarize(_ledgers(ws)))
    ws.index_path.unlink()
    with contextlib.closing(sqlite3.connect(ws.index_path, isolation_level=None)) as conn:
        migrate(conn, ws.index_path, index.INDEX_MIGRATIONS[:1])  # as the last release left it
        for record in ws.records():
            r = index.row_from_state(record, record.state)
            conn.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (r.run_id, r.name, r.status, r.verdict, r.mode, r.created_at, r.ended_at,
                 r.duration_s, r.attempts, r.path),
            )  # fmt: skip
    assert _rounded(summarize(select_ledgers(ws)[0])) == want  # read from the records
    rows = index.read_costs(ws.index_path)
    assert all(r.digest is not None for r in rows)  # and written back: the next read is fast
    assert _rounded(summarize(select_ledgers(ws)[0])) == want


def test_figures_left_in_the_index_add_up_as_the_ledgers_do(ws: Workspace) -> None:
    # What `acceptrun cost` reads: the figures stay in the index, SQLite adds them up.
    ledgers = _ledgers(ws)
    found, _ = select_ledgers(ws, figures=False)
    assert len(found) == 4 and not any(r.figures for r in found.rows)
    want = _rounded(summarize(ledgers))
    assert _rounded(summarize(found)) == want == _rounded(summarize(select_ledgers(ws)[0]))
    for group in ("week", "provider", "run"):  # the figures are read when a split asks
        assert waste_by(found, group) == waste_by(ledgers, group)
    # a filter chooses some of the runs: those alone are added up
    r0, _ = select_ledgers(ws, spec="r0", figures=False)
    assert len(r0) == 2
    assert _rounded(summarize(r0)) == _rounded(summarize([x for x in ledgers if x["name"] == "r0"]))


def test_sums_per_group_from_the_index_equal_the_ledgers_per_group(ws: Workspace) -> None:
    ledgers = {led["run_id"]: led for led in _ledgers(ws)}
    sums = index.sum_costs(ws.index_path, {rid: led["name"] for rid, led in ledgers.items()})
    assert set(sums) == {"r0", "r1"}
    at = index.COST_FIGURES.index("totals.compute_usd")
    for name, got in sums.items():
        want = sum(led["totals"]["compute_usd"] for led in ledgers.values() if led["name"] == name)
        assert got[at] == pytest.approx(want) and want > 0
    # every run in one group: added up without a table of them, to the same figures
    everything = index.sum_costs(ws.index_path, dict.fromkeys(ledgers, ""))[""]
    assert everything[at] == pytest.approx(sum(s[at] for s in sums.values()))
    assert len(everything) == len(index.COST_FIGURES) + len(index.DETAILS)


def test_a_run_read_from_its_record_adds_to_those_left_in_the_index(ws: Workspace) -> None:
    first = ws.run_ids()[0]
    with contextlib.closing(sqlite3.connect(ws.index_path)) as conn:
        conn.execute("DELETE FROM costs WHERE run_id = ?", (first,))  # an older index's run
        conn.commit()
    found, _ = select_ledgers(ws, figures=False)
    held = [r.run_id for r in found.rows if r.figures]
    assert held == [first]  # read from its record, with its figures; the rest in the index
    assert _rounded(summarize(found)) == _rounded(summarize(_ledgers(ws)))
