"""The resilience campaign's parts without a run: the registry, the campaign file, scoring.

Each kind injected for real, scored against its ground truth: tests/integration/test_campaign.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.run.drills.campaign import FAMILIES, KINDS, kind_named, parse_campaign
from acceptrun.run.drills.campaign.kinds import Expect, Reference
from acceptrun.run.drills.campaign.plan import default_step
from acceptrun.run.drills.campaign.score import KindResult, score_kind
from acceptrun.run.drills.campaign.scorecard import overall_state, summary
from acceptrun.spec.load import parse_spec
from acceptrun.workload.inject import ACTIONS, LAUNCH_ACTIONS, parse_faults

REF = Reference(steps=list(range(40)), checkpoints=[7, 15, 23, 31, 39])


def _spec(limits: str = "", env: str = "", processes: int = 1) -> object:
    text = f'name = "t"\ncommand = ["python", "t.py"]\n[resources]\nprocesses = {processes}\n'
    text += f"[limits]\n{limits}\n[env]\n{env}\n"
    return parse_spec(text)


def test_the_registry_holds_twenty_kinds_or_more_each_with_a_family_and_a_unique_name() -> None:
    names = [k.name for k in KINDS]
    assert len(names) >= 20 and len(set(names)) == len(names)
    assert {k.family for k in KINDS} == set(FAMILIES)
    assert kind_named("sigkill").family == "process"
    with pytest.raises(ValueError, match="unknown fault kind 'sigkil'"):
        kind_named("sigkil")


def test_every_injectable_kind_is_a_fault_the_inject_grammar_reads() -> None:
    actions = {a.split("=")[0] for a in ACTIONS}
    for kind in KINDS:
        if kind.fault is None:
            continue
        *first, fault = parse_faults(kind.injection(12))
        assert fault.action in actions and fault.step == 12, kind.name
        # Faults fired as a later attempt starts (rdzv) come before the step fault.
        assert all(f.action in LAUNCH_ACTIONS and f.attempt > 1 for f in first), kind.name
        assert fault.after_checkpoint == kind.after_checkpoint


def test_a_kind_that_cannot_be_injected_always_says_why() -> None:
    spec = _spec('hang_window = "1m"\nmax_loss = 10.0')
    for kind in KINDS:
        if kind.fault is None and not kind.outside:
            assert kind.why_not_tried(spec, REF), kind.name


def test_requirements_name_the_spec_key_that_makes_a_kind_possible() -> None:
    bare = _spec()
    assert "limits.hang_window" in (kind_named("hang").why_not_tried(bare, REF) or "")
    assert "limits.max_loss" in (kind_named("loss_spike").why_not_tried(bare, REF) or "")
    assert kind_named("nan").why_not_tried(bare, REF) is None  # NaN is always a divergence
    no_restart = _spec("max_restarts = 0")
    assert "max_restarts" in (kind_named("sigkill").why_not_tried(no_restart, REF) or "")
    # A stalled loader is told from a hang only when heartbeats reach the supervisor in time.
    slow_beat = _spec('hang_window = "5s"')
    assert "heartbeat" in (kind_named("loader_stalled").why_not_tried(slow_beat, REF) or "")
    fast_beat = _spec('hang_window = "5s"', env='ACCEPTRUN_HEARTBEAT_S = "1"')
    assert kind_named("loader_stalled").why_not_tried(fast_beat, REF) is None
    assert "one process" in (kind_named("rank_killed").why_not_tried(bare, REF) or "")
    two = _spec("", processes=2)
    assert kind_named("rank_killed").why_not_tried(two, REF) is None
    assert kind_named("straggler").why_not_tried(two, REF) is None
    assert "one process" in (kind_named("straggler").why_not_tried(bare, REF) or "")
    rdzv = kind_named("rendezvous_refused")
    assert rdzv.why_not_tried(_spec("max_restarts = 2", processes=2), REF) is None
    assert "one process" in (rdzv.why_not_tried(bare, REF) or "")
    one_restart = _spec("max_restarts = 1", processes=2)
    assert "limits.max_restarts = 1" in (rdzv.why_not_tried(one_restart, REF) or "")
    own = parse_spec(
        'name = "t"\ncommand = ["torchrun", "--nproc-per-node", "2", "t.py"]\n'
        "[resources]\nprocesses = 2\n"
    )
    assert "its own torchrun" in (rdzv.why_not_tried(own, REF) or "")
    cut = kind_named("mirror_unreachable")
    assert "[checkpoint] mirror" in (cut.why_not_tried(bare, REF) or "")
    head = 'name = "t"\ncommand = ["python", "t.py"]\n[checkpoint]\nmirror = '
    assert cut.why_not_tried(parse_spec(head + '"out/mirror"\n'), REF) is None
    assert "remote" in (cut.why_not_tried(parse_spec(head + '"s3://b/m"\n'), REF) or "")


def test_a_black_box_is_tried_with_the_kinds_fired_from_outside_its_script_only() -> None:
    read = parse_spec(
        'name = "t"\ncommand = ["python", "t.py"]\n[limits]\nmax_restarts = 1\n'
        '[checkpoint]\nwatch = ["out/ckpt.pt"]\n[progress]\npattern = "iter (?P<step>\\\\d+)"\n'
    )
    unread = _spec("max_restarts = 1")
    tried = [k.name for k in KINDS if k.why_not_tried(read, REF, client=False) is None]
    assert tried == ["sigkill", "sigterm", "supervisor_killed", "supervisor_stopped"]
    for kind in KINDS:
        if kind.name not in tried:
            assert "not applicable to a black box" in (
                kind.why_not_tried(read, REF, client=False) or ""
            ), kind.name
    # A step fault needs the steps read from the output; the supervisor's own faults do not.
    assert "[progress] pattern" in (kind_named("sigkill").why_not_tried(unread, REF, False) or "")
    assert kind_named("supervisor_killed").why_not_tried(unread, REF, client=False) is None


def test_divergence_kinds_expect_the_specs_own_action() -> None:
    assert kind_named("nan").expect(_spec()).action == "stop"
    assert kind_named("nan").expect(_spec('on_divergence = "rollback"')).action == "rollback"


def test_the_default_step_lies_between_the_first_two_checkpoints() -> None:
    step = default_step(REF.checkpoints)
    assert REF.checkpoints[0] < step < REF.checkpoints[1]
    assert default_step([5]) == 6


def test_a_campaign_file_lists_kinds_and_pins_steps() -> None:
    campaign = parse_campaign('kinds = ["nan", "sigkill"]\n[steps]\nsigkill = 12\n')
    assert [k.name for k in campaign.kinds] == ["nan", "sigkill"]
    assert campaign.step_for(kind_named("sigkill"), 9) == 12
    assert campaign.step_for(kind_named("nan"), 9) == 9
    assert len(parse_campaign("").kinds) == len(KINDS)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param('kinds = ["sigkil"]', ["'sigkil'", "did you mean 'sigkill'"], id="typo"),
        pytest.param('kinds = "sigkill"', ["expected a list"], id="not-a-list"),
        pytest.param('kinds = ["nan", "nan"]', ["listed twice"], id="twice"),
        pytest.param("[steps]\nsigkill = -1", ["steps.sigkill = -1", "0 or more"], id="step"),
        pytest.param("[steps]\nnope = 3", ["steps.nope", "not a fault kind"], id="step-kind"),
        pytest.param('kind = ["nan"]', ["'kind'", "did you mean 'kinds'"], id="key"),
        pytest.param("kinds = [", ["TOML syntax error"], id="toml"),
    ],
)
def test_a_bad_campaign_file_is_refused_with_the_thing_and_the_fix(
    text: str, words: list[str]
) -> None:
    with pytest.raises(UserError) as err:
        parse_campaign(text, source="c.toml")
    assert "campaign file c.toml" in str(err.value)
    for word in words:
        assert word in str(err.value)


def _result(state: str, **kw: object) -> KindResult:
    return KindResult("k", "process", tried=True, final_state=state, **kw)  # type: ignore[arg-type]


def test_the_campaigns_final_state_is_the_weakest_of_its_runs() -> None:
    assert overall_state([_result("bitwise"), _result("not_comparable")]) == "bitwise"
    assert overall_state([_result("bitwise"), _result("within_tolerance")]) == "within_tolerance"
    assert overall_state([_result("bitwise"), _result("differs")]) == "differs"
    assert overall_state([_result("not_comparable")]) == "not_comparable"
    untried = KindResult("k", "process", tried=False, final_state="differs")
    assert overall_state([untried, _result("bitwise")]) == "bitwise"


def test_the_summary_counts_tried_kinds_only() -> None:
    results = [
        _result("bitwise", detect_s=0.5, recover_s=2.0, lost_steps=3, compute_s=10.0, lost_s=1.0),
        _result("bitwise", detect_s=1.5, recover_s=4.0, lost_steps=2, compute_s=10.0, lost_s=2.0),
        KindResult("x", "storage", tried=False, detect_s=99.0, lost_steps=99, compute_s=99.0),
    ]
    s = summary(results, reference_compute_s=10.0)
    assert s["detect_s_median"] == float(np.median([0.5, 1.5])) and s["detect_s_max"] == 1.5
    assert s["recover_s_median"] == 3.0 and s["lost_steps"] == 5
    assert s["compute_s"] == 30.0 and s["lost_share"] == round(3.0 / 30.0, 4)


def _stopped_run(root: Path, klass: str) -> RunRecord:
    """A record of a run that a fault stopped, as the supervisor writes it."""
    root.mkdir()
    rec = RunRecord(root)
    rec.event("fault_injected", sync=True, action="diskfull", step=12, attempt=1)
    rec.event("attempt_exit", sync=True, attempt=1, outcome="failed", returncode=1,
              duration_s=1.0, work={"steps_lost": 4, "seconds_lost": 0.2}, **{"class": klass})  # fmt: skip
    return rec


def test_a_fault_named_wrong_is_scored_wrong(tmp_path: Path) -> None:
    kind = kind_named("disk_full")
    expect = kind.expect(_spec())
    ref = RunRecord(tmp_path)
    right = score_kind(kind, expect, "diskfull@step=12", ref, _stopped_run(tmp_path / "a", "disk_full"), 0.0, 0.0)  # fmt: skip
    wrong = score_kind(kind, expect, "diskfull@step=12", ref, _stopped_run(tmp_path / "b", "failed"), 0.0, 0.0)  # fmt: skip
    assert right.named_right and right.said == {
        **(right.said or {}),
        "class": "disk_full",
        "action": "stop",
    }
    assert not wrong.named_right and (wrong.said or {})["whose"] == "unknown"
    assert right.lost_steps == 4 and right.detect_s is not None and right.detect_s >= 0
    assert right.final_state == "not_comparable" and "stopped" in (right.final_state_why or "")


def test_a_fault_that_never_fired_is_never_named_right(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    rec = RunRecord(tmp_path / "r")
    rec.event("attempt_exit", sync=True, attempt=1, outcome="success", returncode=0,
              duration_s=1.0, work={}, **{"class": "success"})  # fmt: skip
    kind = kind_named("sigkill")
    got = score_kind(
        kind, Expect("killed", "unknown", "restart"), "kill@step=3", rec, rec, 0.0, 0.0
    )
    assert not got.named_right and got.truth == {"what": kind.what, "fired": False}


def test_a_kind_that_damages_a_checkpoint_lands_after_the_second_one() -> None:
    kind = kind_named("ckpt_truncated")
    step = default_step(REF.checkpoints, kind.nth_checkpoint)
    assert REF.checkpoints[1] < step < REF.checkpoints[2]
    assert default_step([5], 2) == 6  # a lone checkpoint: the step after it


def test_bitflip_flips_the_top_exponent_bit_of_the_first_value_in_place() -> None:
    from types import SimpleNamespace

    from acceptrun.workload.inject import _bitflip, _first_array

    for dtype in (np.float64, np.float32, np.float16):
        weights = np.full(3, 0.25, dtype=dtype)
        run = SimpleNamespace(_objects={"step": 3, "weights": weights})
        assert _first_array(run)[0] == "weights"  # a number is no array: skipped
        _bitflip(run, None)
        assert abs(float(weights[0])) > 1e3 and weights[1] == 0.25, (
            dtype
        )  # 2**-2 -> 2**(2**(e-1)-2)
        _bitflip(run, None)
        assert weights[0] == 0.25  # the same bit again: back as it was


def test_spike_multiplies_the_pending_loss() -> None:
    from types import SimpleNamespace

    from acceptrun.workload.inject import SPIKE_FACTOR, _spike

    run = SimpleNamespace(_pending={"loss": 2.0})
    _spike(run, None)
    assert run._pending["loss"] == 2.0 * SPIKE_FACTOR


def test_a_straggler_slows_k_steps_and_is_recorded_once(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from acceptrun.workload import inject

    (tmp_path / "r").mkdir()
    faults = parse_faults("slow=3@step=2")
    run = SimpleNamespace(
        attempt=1, _checkpointer=None, _faults=faults, record=RunRecord(tmp_path / "r")
    )
    due = []  # the step each fault left to fire is due at, after each step
    for step in range(6):
        inject.fire(run, step, "after_step")
        due.append([f.step for f in run._faults])
    assert due == [[2], [2], [3], [4], [], []]  # steps 2, 3 and 4 slowed, then nothing
    assert [e["step"] for e in run.record.events("fault_injected")] == [2]  # recorded once


def test_a_slowed_save_is_named_right_only_when_the_commit_shows_it(tmp_path: Path) -> None:
    kind = kind_named("ckpt_dir_slow")
    expect = kind.expect(_spec())
    runs = []
    for name, seconds in (("slow", 2.1), ("fast", 0.01)):
        (tmp_path / name).mkdir()
        rec = RunRecord(tmp_path / name)
        rec.event("fault_injected", sync=True, action="slowckpt", step=12, attempt=1)
        rec.event("checkpoint_commit", sync=True, step=15, seconds=seconds, attempt=1)
        rec.event("attempt_exit", sync=True, attempt=1, outcome="success", returncode=0,
                  duration_s=1.0, work={}, **{"class": "success"})  # fmt: skip
        runs.append(score_kind(kind, expect, "slowckpt@step=12", rec, rec, 0.0, 0.0))
    slow, fast = runs
    assert slow.named_right and (slow.said or {})["save_s"] == 2.1
    assert not fast.named_right and (fast.said or {})["class"] == "success"
