"""`acceptrun drill --campaign`: a reduced campaign, every kind injected for real, each
scored against the ground truth written here (a fault named wrong fails the test).

One campaign for the module (a reference run and one run per kind of every family,
examples/campaign's NumPy loop: about a second a run); each test reads one family.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project

ROOT = Path(__file__).resolve().parents[2]

# The ground truth: what acceptrun must say of each kind, (class, whose, action).
TRUTH = {
    "sigkill": ("killed", "unknown", "restart"),
    "hang": ("hang", "workload", "restart"),
    "supervisor_killed": ("interrupted", "unknown", "restart"),  # then `acceptrun resume`
    "supervisor_stopped": ("success", "none", "none"),  # frozen past the hang window
    "nan": ("diverged", "workload", "stop"),
    "param_bitflip": ("diverged", "workload", "stop"),
    "ckpt_truncated": ("killed", "unknown", "restart"),
    "disk_full": ("disk_full", "workload", "stop"),
    "loader_stalled": ("data_stall", "unknown", "restart"),
    "ckpt_dir_slow": ("success", "none", "none"),  # one write 2 s slower: no failure, shown
}
NOT_TRIED = ("rank_killed", "data_changed")  # one process; no [data] to change
OUTSIDE = ("supervisor_killed", "supervisor_stopped")
KILL_STEP = 12

CAMPAIGN = f"""
kinds = {json.dumps([*TRUTH, *NOT_TRIED])}
[steps]
sigkill = {KILL_STEP}
"""


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("campaign")
    project = Project(root=root / "proj", workspace=root / ".acceptrun")
    shutil.copytree(ROOT / "examples" / "campaign", project.root)
    spec = project.root / "spec.toml"
    spec.write_text(
        spec.read_text().replace('["python", "train.py"]', json.dumps([PYTHON, "train.py"]))
    )
    (project.root / "c.toml").write_text(CAMPAIGN)
    proc = project.cli("drill", "--campaign", "c.toml", "--json", "spec.toml", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    card = json.loads(proc.stdout)
    ref = RunRecord(project.runs_dir / card["reference_run"])
    cert = json.loads(ref.file("campaign.json").read_text())
    return {"card": card, "cert": cert, "ref": ref, "project": project}


def _kinds(campaign: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k["kind"]: k for k in campaign["cert"]["kinds"]}


def _check_family(campaign: dict[str, Any], family: str) -> None:
    kinds = _kinds(campaign)
    mine = [name for name in TRUTH if kinds[name]["family"] == family]
    assert mine, family
    for name in mine:
        k = kinds[name]
        said = (k["said"]["class"], k["said"]["whose"], k["said"]["action"])
        assert k["tried"] and k["truth"]["fired"], k
        assert said == TRUTH[name], f"{name}: acceptrun said {said}, the truth is {TRUTH[name]}"
        assert k["named_right"], k
        # A restart ends where the uninterrupted run did, bit for bit; a stop has no end.
        want = "not_comparable" if TRUTH[name][2] == "stop" else "bitwise"
        assert k["final_state"] == want, k
        if name in OUTSIDE:  # fired at the supervisor by the campaign: no fault in the record
            continue
        assert TRUTH[name][0] == "success" or k["detect_s"] >= 0
        run = RunRecord(campaign["project"].runs_dir / k["run"])
        fired = list(run.events("fault_injected"))
        assert len(fired) == 1 and k["fault"].startswith(fired[0]["action"])


def test_process_kinds_are_named_right_and_resume_bitwise(campaign: dict[str, Any]) -> None:
    _check_family(campaign, "process")
    kill = _kinds(campaign)["sigkill"]
    assert kill["truth"]["step"] >= KILL_STEP  # pinned by the campaign file, after a checkpoint
    assert kill["lost_steps"] > 0 and kill["recover_s"] is not None
    killed = _kinds(campaign)["supervisor_killed"]
    assert killed["detect_s"] is not None and killed["recover_s"] is not None
    run = RunRecord(campaign["project"].runs_dir / killed["run"])
    (resume,) = [e for e in run.events("audit") if e.get("action") == "resume"]
    assert resume["interrupted"]["attempt"] == 1  # the resume took over the dead supervisor's run


def test_numerics_kinds_are_named_diverged_and_stop(campaign: dict[str, Any]) -> None:
    _check_family(campaign, "numerics")
    flip = _kinds(campaign)["param_bitflip"]
    assert flip["truth"]["where"] == "weights"  # the array the script gave run.restore()


def test_storage_kinds_quarantine_a_damaged_checkpoint(campaign: dict[str, Any]) -> None:
    _check_family(campaign, "storage")
    torn = _kinds(campaign)["ckpt_truncated"]
    run = RunRecord(campaign["project"].runs_dir / torn["run"])
    (quarantined,) = run.events("checkpoint_quarantine")
    assert torn["truth"]["where"].startswith(quarantined["path"])
    (restored,) = run.events("restored")
    assert restored["step"] < quarantined["step"]  # the checkpoint before the damaged one
    slow = _kinds(campaign)["ckpt_dir_slow"]["said"]
    assert slow["save_s"] >= 2.0  # the slowed write, as the commit event timed it


def test_kinds_not_injectable_here_are_not_tried_and_say_why(campaign: dict[str, Any]) -> None:
    kinds = _kinds(campaign)
    for name in NOT_TRIED:
        assert not kinds[name]["tried"] and not kinds[name]["named_right"]
        assert kinds[name]["why_not_tried"]
    card = campaign["card"]
    assert card["tried"] == len(TRUTH) == card["named_right"]
    assert card["final_state"] == "bitwise"
    assert {k["kind"] for k in card["kinds"]} == {*TRUTH, *NOT_TRIED}


def test_the_certificate_is_in_the_reference_record_and_meets_the_verdict(
    campaign: dict[str, Any],
) -> None:
    ref, cert = campaign["ref"], campaign["cert"]
    assert cert["spec_hash"] == ref.state["spec_hash"] and cert["ok"]
    assert cert["provenance"]["hashes"]["packages"]
    (drill,) = ref.events("drill")
    assert drill["drill"] == "campaign" and drill["ok"] and drill["tried"] == len(TRUTH)
    verdict = json.loads(ref.file("verdict.json").read_text())
    (check,) = [c for c in verdict["checks"] if c["name"] == "drill campaign"]
    assert check["status"] == "pass"
    assert "resilience campaign" in ref.file("report.html").read_text()
    # The board's run page shows the same section, from the record.
    from acceptrun.ui.pages import _render_report_body

    body, _ = _render_report_body(ref)
    assert '<h2 id="campaign">resilience campaign</h2>' in body
    assert all(f"<td>{kind}</td>" in body for kind in TRUTH)
