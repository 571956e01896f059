"""Who caused the waste: every failure class has a responsibility, and the ledger splits by it.

The cases come from the class declaration (record.status.FailureClass): a class added
tomorrow fails here until it is mapped in record.status.RESPONSIBILITY.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from acceptrun.cost.ledger import RESPONSIBLE, build_ledger
from acceptrun.cost.report import claim, format_claim, parse_since, summarize, waste_by
from acceptrun.record.status import RESPONSIBILITY, FailureClass, Responsibility
from acceptrun.record.workspace import RunRecord, Workspace

SPEC = 'name = "r"\ncommand = ["true"]\n[cost]\nprice_per_hour = 3600\n'  # 1 USD per second


def test_every_failure_class_has_a_responsibility() -> None:
    unmapped = [c.value for c in FailureClass if c not in RESPONSIBILITY]
    assert not unmapped, f"map these in record.status.RESPONSIBILITY: {unmapped}"
    assert set(RESPONSIBILITY) == set(FailureClass)
    assert RESPONSIBILITY[FailureClass.SUCCESS] is Responsibility.NONE
    others = {v for k, v in RESPONSIBILITY.items() if k is not FailureClass.SUCCESS}
    assert others <= {Responsibility(r) for r in RESPONSIBLE}


def _failed_run(ws: Workspace, klass: FailureClass, *, injected: bool = False) -> RunRecord:
    """A run whose one attempt ran 10 s before failing with ``klass``, then one success."""
    rec = ws.create_run(f"r-{klass.value}", spec_text=SPEC, state={"status": "finished"})
    t0 = 1_800_000_000.0
    outcome = {"success": "success", "idle": "idle"}.get(klass.value, "failed")
    lines = ["injected fault: term@time=3s"] if injected else [f"evidence of {klass.value}"]
    rec.event("run_start", t=t0)
    rec.event("attempt_start", t=t0 + 1, attempt=1)
    rec.event(
        "attempt_exit", t=t0 + 11, attempt=1, outcome=outcome, returncode=1, signal=None,
        started_at="2027-01-15T08:00:01Z", ended_at="2027-01-15T08:00:11Z",
        reason="ended", work={"seconds_lost": 0.0}, decision=None,
        **{"class": klass.value, "class_reason": f"it was {klass.value}", "evidence": lines},
    )  # fmt: skip
    rec.event("attempt_start", t=t0 + 12, attempt=2)
    rec.event(
        "attempt_exit", t=t0 + 20, attempt=2, outcome="success", returncode=0, signal=None,
        reason="exited 0", work={}, decision=None, **{"class": "success", "evidence": []},
    )  # fmt: skip
    return rec


@pytest.mark.parametrize("klass", list(FailureClass), ids=[c.value for c in FailureClass])
def test_the_ledger_books_a_failed_attempts_waste_to_its_classes_responsibility(
    tmp_path: Path, klass: FailureClass
) -> None:
    ws = Workspace.create(tmp_path / "ws")
    ledger = build_ledger(_failed_run(ws, klass))
    first = ledger["compute"]["attempts"][0]
    expected = RESPONSIBILITY[klass].value
    assert first["responsibility"] == (expected if klass.value != "success" else "none")
    assert first["evidence"]["class"] == klass.value
    assert first["evidence"]["lines"] == [f"evidence of {klass.value}"]
    assert first["evidence"]["reason"] == f"it was {klass.value}"
    assert ledger["compute"]["attempts"][1]["responsibility"] == "none"
    waste = ledger["compute"]["waste"]
    wasted = ledger["compute"]["split_s"]["wasted"]
    assert sum(waste["seconds"].values()) == pytest.approx(wasted, abs=1e-5)
    assert sum(waste["usd"].values()) == pytest.approx(
        ledger["compute"]["split_usd"]["wasted"], abs=1e-5
    )
    if outcome_is_failure := first["outcome"] == "failed":
        assert first["split_s"]["wasted"] == pytest.approx(10.0)
        assert waste["seconds"][expected] == pytest.approx(10.0)
        assert first["wasted_usd"] == pytest.approx(10.0)
    assert outcome_is_failure == (klass.value not in ("success", "idle"))
    provider = [i["class"] for i in claim([ledger])["incidents"]]
    assert provider == ([klass.value] if expected == "provider" else [])


def test_an_injected_fault_is_no_claim_unless_drills_are_asked_for(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    ledger = build_ledger(_failed_run(ws, FailureClass.PREEMPTED, injected=True))
    assert ledger["compute"]["attempts"][0]["evidence"]["injected"] is True
    assert claim([ledger])["incidents"] == []
    shown = claim([ledger], drills=True)
    assert [i["injected"] for i in shown["incidents"]] == [True]
    assert shown["wasted_usd"] == 0.0  # a drill is shown, never counted
    assert "injected by a drill" in format_claim(shown)


@pytest.mark.parametrize("klass", [FailureClass.PREEMPTED, FailureClass.KILLED])
def test_an_injected_fault_is_booked_as_a_drill(tmp_path: Path, klass: FailureClass) -> None:
    """A drill's fault was asked for: its waste is "drill", never "unknown" or the provider's."""
    ws = Workspace.create(tmp_path / "ws")
    ledger = build_ledger(_failed_run(ws, klass, injected=True))
    first = ledger["compute"]["attempts"][0]
    assert first["responsibility"] == "drill"
    waste = ledger["compute"]["waste"]["seconds"]
    assert waste["drill"] == pytest.approx(10.0)
    assert waste["unknown"] == waste["provider"] == 0.0
    assert summarize([ledger])["waste_usd"]["drill"] == pytest.approx(10.0)


def test_the_split_groups_by_run_week_and_provider(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    ledgers = [
        build_ledger(_failed_run(ws, c))
        for c in (FailureClass.PREEMPTED, FailureClass.USER_ERROR, FailureClass.FAILED)
    ]
    s = summarize(ledgers)
    assert s["waste_usd"] == pytest.approx(
        {"provider": 10.0, "workload": 10.0, "unknown": 10.0, "drill": 0.0}
    )
    runs = waste_by(ledgers, "run")
    assert len(runs) == 3 and all(sum(r["usd"].values()) == pytest.approx(10.0) for r in runs)
    (week,) = waste_by(ledgers, "week")
    assert week["runs"] == 3 and week["usd"]["provider"] == pytest.approx(10.0)
    (provider,) = waste_by(ledgers, "provider")
    assert provider["provider"] == "custom" and provider["runs"] == 3
    text = format_claim(claim(ledgers))
    assert "1 provider-caused incident" in text and "preempted" in text
    assert "user_error" not in text and "evidence: evidence of preempted" in text


@pytest.mark.parametrize(
    ("text", "ago_s"), [("7d", 7 * 86400), ("12h", 12 * 3600), ("2w", 14 * 86400), ("30m", 1800)]
)
def test_since_takes_a_time_ago(text: str, ago_s: float) -> None:
    now = datetime(2027, 1, 15, 12, 0, tzinfo=UTC)
    assert (now - parse_since(text, now=now)).total_seconds() == ago_s


def test_the_spend_page_splits_waste_by_whose_failure(tmp_path: Path) -> None:
    from acceptrun.ui import Board
    from acceptrun.ui.spend import spend_page

    ws = Workspace.create(tmp_path / "ws")
    for c in (FailureClass.GPU_FAULT, FailureClass.CUDA_OOM):
        build_ledger(_failed_run(ws, c))
    page = spend_page(Board.for_workspaces([ws]))
    assert "Wasted, by whose failure" in page
    for group in ("week", "provider", "run"):
        assert f"<h3>per {group}</h3>" in page
    # per provider: one row, 10 USD the provider's (gpu_fault), 10 the workload's (cuda_oom)
    row = page.split("<h3>per provider</h3>")[1].split("</table>")[0]
    assert "<td>custom</td><td class=num>2</td>" in row
    assert row.count("$10.00") == 2, row


# ---- the machine after the run ----------------------------------------------------------------


def test_the_machine_after_the_run_is_said_not_counted_without_its_stop_time(
    tmp_path: Path,
) -> None:
    from acceptrun.cost.report import format_ledger

    ledger = build_ledger(_failed_run(Workspace.create(tmp_path / "ws"), FailureClass.SUCCESS))
    after = ledger["after_run"]
    assert after["counted"] is False and after["seconds"] is None
    assert "not counted" in after["why"] and "--machine-stopped-at" in after["why"]
    # The SkyPilot export's default teardown bounds it: 5 minutes at 1 USD a second.
    assert after["estimate_max_s"] == 300 and after["estimate_max_usd"] == pytest.approx(300)
    assert ledger["compute"]["detail_s"]["idle.after_run"] == 0
    text = format_ledger(ledger)
    assert (
        "after the run: not counted" in text
        and "SkyPilot export, at most $300.00 more (an estimate)" in text
    )


def test_a_recorded_stop_time_books_the_tail_as_idle(tmp_path: Path) -> None:
    from acceptrun.cost.ledger import add_costs

    rec = _failed_run(Workspace.create(tmp_path / "ws"), FailureClass.SUCCESS)
    before = build_ledger(rec)
    run_end = max(s["end"] for s in before["segments"])
    add_costs(rec, machine_stopped_at=run_end + 120.0, note="sky status said STOPPED")
    ledger = build_ledger(rec)
    after = ledger["after_run"]
    assert after["counted"] is True and after["seconds"] == pytest.approx(120.0)
    assert ledger["compute"]["detail_s"]["idle.after_run"] == pytest.approx(120.0)
    assert ledger["billed_s"] == pytest.approx(before["billed_s"] + 120.0)
    split = ledger["compute"]["split_s"]
    assert sum(split.values()) == pytest.approx(ledger["billed_s"], abs=1e-5)
    assert ledger["compute"]["usd"] == pytest.approx(before["compute"]["usd"] + 120.0)


def test_teardown_keep_says_the_cluster_bills_until_sky_down(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    rec = ws.create_run(
        "kept", spec_text=SPEC + '[skypilot]\nteardown = "keep"\n', state={"status": "finished"}
    )
    rec.event("run_start", t=1_800_000_000.0)
    after = build_ledger(rec)["after_run"]
    assert not after["counted"] and after["estimate_max_s"] is None
    assert "until `sky down`" in after["why"]
