"""The warm restart (limits.warm_restart): a standby takes over a killed attempt, and a
clean finish leaves no standby behind.

Each script waits on files and events, never on the clock: the active attempt holds a
step until the standby has reached ``run.restore()`` (it touches a file there), or until
the record says the standby was skipped (too little memory on this machine: that branch
is then what is checked, its figures and the cold start it says why of).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from supervisor_kill_harness import processes_of

from acceptrun.record.recovery import restarts
from acceptrun.run.launch import launch

pytestmark = pytest.mark.timeout(300)

# Plain values only (no torch import): each attempt starts in a fraction of a second.
SCRIPT = """
import json, os, sys, time
from pathlib import Path
import acceptrun

run = acceptrun.init()
print("set up before restore", flush=True)
if os.environ.get("ACCEPTRUN_STANDBY_FD"):  # a standby: it reached run.restore()
    Path(f"standby-{os.environ['ACCEPTRUN_ATTEMPT']}.ready").touch()
state = {"acc": 0, "history": []}
start = run.restore(state=state)

def standby_there(n):
    '''The standby for attempt n is waiting, or the supervisor skipped it.'''
    if Path(f"standby-{n}.ready").exists():
        return True
    events = Path(os.environ["ACCEPTRUN_RUN_DIR"], "events.jsonl").read_text()
    return '"standby_skipped"' in events

HOLD_AT = int(sys.argv[1])  # the step at which attempt 1 waits for its standby
for step in run.steps(start, 12):
    if step == HOLD_AT and run.attempt == 1:
        deadline = time.monotonic() + 120  # a hang guard only
        while not standby_there(2) and time.monotonic() < deadline:
            time.sleep(0.02)
    state["acc"] = (state["acc"] * 31 + step) % 1000003
    state["history"].append(step)
    run.log(step, loss=float(state["acc"]))
    run.maybe_checkpoint(step)
Path(f"final-{run.attempt}.json").write_text(json.dumps(state))
"""

SPEC = """
[limits]
max_restarts = 2
restart_backoff = 0
warm_restart = true
[checkpoint]
every_steps = 2
"""


def _run(project: Any, hold_at: int, inject: list[str] | None = None) -> Any:
    spec = project.spec(SCRIPT, command=[sys.executable, "work.py", str(hold_at)], extra=SPEC)
    return launch(spec, workspace=project.workspace, echo=False, inject=inject or [])


def _no_room_for_a_standby(record: Any) -> bool:
    """Whether the supervisor skipped the standby for want of memory on this machine; if
    so, that branch is checked as documented (its figures, the next attempt cold and why)
    and the caller has nothing warm left to check."""
    skipped = list(record.events("standby_skipped"))
    if not skipped:
        return False
    (skip,) = skipped
    assert skip["why"].startswith("no memory for a standby") and skip["available_mib"] >= 0
    assert not list(record.events("standby_start"))
    for start in list(record.events("attempt_start"))[1:]:
        assert start["start_mode"] == "cold" and start["cold_why"] == skip["why"], start
    return True


def test_a_killed_attempt_s_standby_takes_over(project: Any) -> None:
    result = _run(project, hold_at=6, inject=["kill@step=7"])
    record = result.record
    assert result.verdict.accepted, result.verdict
    if _no_room_for_a_standby(record):
        return

    starts = list(record.events("attempt_start"))
    assert [s["start_mode"] for s in starts] == ["cold", "warm"]
    # The standby's process is attempt 2's: started while attempt 1 ran.
    (standby,) = [e for e in record.events("standby_start") if e["for_attempt"] == 2]
    assert standby["attempt"] == 1 and starts[1]["pid"] == standby["pid"]
    # Before its go nothing of attempt 2 reached the record: its workload_start comes
    # after its attempt_start, and its output held until then is in its log now.
    events = list(record.events())
    go = events.index(next(e for e in events if e["kind"] == "attempt_start" and e["attempt"] == 2))
    workload = {"workload_start", "step", "heartbeat", "restored"}
    assert not [e for e in events[:go] if e.get("attempt") == 2 and e["kind"] in workload]
    assert "set up before restore" in (record.attempt_dir(2) / "stdout.log").read_text()

    # It resumed from the newest checkpoint attempt 1 committed, and ends as an
    # uninterrupted run of the same script does.
    committed = [e["step"] for e in record.events("checkpoint_commit") if e["attempt"] == 1]
    (restored,) = record.events("restored")
    assert restored["attempt"] == 2 and restored["step"] == max(committed)
    steps2 = sorted(e["step"] for e in record.events("step") if e["attempt"] == 2)
    assert steps2 == list(range(max(committed) + 1, 12))
    (split,) = restarts(record)
    assert split.mode == "warm" and split.cold_why is None
    (check,) = [c for c in result.verdict.checks if c.name == "recovery"]
    assert "(1 warm)" in check.evidence and "attempt 2 warm" in check.evidence
    warm_final = json.loads((project.root / "final-2.json").read_text())

    for name in ("final-2.json", "standby-2.ready", "standby-3.ready"):
        (project.root / name).unlink(missing_ok=True)
    reference = _run(project, hold_at=-1)
    assert reference.verdict.accepted
    assert json.loads((project.root / "final-1.json").read_text()) == warm_final
    assert processes_of(record.run_id) == [] and processes_of(reference.record.run_id) == []


def test_a_clean_finish_leaves_no_standby(project: Any) -> None:
    result = _run(project, hold_at=11)  # the last step waits for the standby to be there
    record = result.record
    assert result.verdict.accepted, result.verdict
    if _no_room_for_a_standby(record):
        return
    assert (project.root / "standby-2.ready").exists()  # it was waiting in run.restore()
    (standby,) = record.events("standby_start")
    assert standby["for_attempt"] == 2
    # One attempt; the standby never became one and left nothing: no attempt folder, no
    # event of attempt 2, no process of the run.
    assert [s["attempt"] for s in record.events("attempt_start")] == [1]
    assert not record.attempt_dir(2).exists()
    assert not [e for e in record.events() if e.get("attempt") == 2]
    assert processes_of(record.run_id) == []
    assert not Path(f"/proc/{standby['pid']}").exists() or _zombie(standby["pid"])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True
