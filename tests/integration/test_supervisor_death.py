"""SIGKILL of the supervisor (`acceptrun run`) itself: nothing unsupervised, nothing unrecorded.

At each moment (preflight, mid-step, mid-checkpoint, during close) the supervisor is
killed once the moment is seen in the record (an event or a file, never a sleep), then:
no process of the run survives, `acceptrun ls` and `show` read "interrupted", and
`acceptrun resume` ends ACCEPTED with final weights bitwise equal to an uninterrupted run
and no committed checkpoint step lost. A black box that ignores SIGTERM ends too, after
its grace period, with a helper that left its process group.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import psutil
import pytest
from supervisor_kill_harness import (
    MOMENTS,
    events,
    kill_and_resume,
    make_job,
    processes_of,
    reference_digest,
    run_dir,
    start_run,
)

from conftest import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("reference")
    return reference_digest(root, root / "ws")


@pytest.mark.parametrize("moment", MOMENTS)
def test_killed_supervisor_leaves_no_orphan_and_resumes_bitwise(
    tmp_path: Path, reference: str, moment: str
) -> None:
    ws = tmp_path / "ws"
    res = kill_and_resume(make_job(tmp_path, moment), ws, moment, reference=reference, step=10)
    assert res.preflight_hit, "the preflight kill landed after the first attempt started"
    assert res.orphans == [], f"processes of the run outlived its supervisor: {res.orphans}"
    assert res.shown == "interrupted"
    assert res.show_says_interrupted
    assert res.resume_rc == 0, res.notes
    assert res.accepted
    assert res.bitwise
    assert res.lost_steps == 0
    rdir = run_dir(ws)
    assert rdir is not None
    resumes = [e for e in events(rdir, "audit") if e.get("action") == "resume"]
    assert len(resumes) == 1 and resumes[0]["interrupted"] is not None
    if moment in ("step", "checkpoint"):
        # The watchdog (and the client at its step boundary) saw the supervisor go.
        lost = events(rdir, "supervisor_lost")
        assert lost and {e["attempt"] for e in lost} == {1}
        exit1 = (rdir / "attempts" / "1" / "exit.json").read_text()
        assert '"interrupted"' in exit1
    ledger = (rdir / "ledger.json").read_text()
    assert '"interrupted"' in ledger


def _watchdog_of(pid: int) -> bool:
    """Whether the supervisor ``pid`` has started its attempt's watchdog."""
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if "_watchdog.py" in " ".join(child.cmdline()):
                return True
    return False


def test_black_box_ignoring_sigterm_ends_after_its_grace(tmp_path: Path) -> None:
    job = make_job(tmp_path, "blackbox", black_box=True, grace="2s")
    ws = tmp_path / "ws"
    sup = start_run(job, ws)
    started = job / "started-1"
    try:
        wait_for(lambda: started.exists() and started.read_text(), what="the black box's start")
        # The watchdog is started right after the workload; on a loaded machine a quick
        # black box can be up first, and this test is about the grace, not that moment.
        wait_for(lambda: _watchdog_of(sup.pid), what="the attempt's watchdog")
    finally:
        sup.send_signal(signal.SIGKILL)
        sup.wait()
    helper = int(started.read_text())
    rdir = run_dir(ws)
    assert rdir is not None
    wait_for(lambda: not processes_of(rdir.name), timeout=60, what="no process of the run")

    def helper_gone() -> bool:
        try:
            return psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert helper_gone(), "the helper in a session of its own survived"
    lost = events(rdir, "supervisor_lost")
    assert [e["by"] for e in lost] == ["watchdog"]
    # It ignored SIGTERM, so the watchdog killed it at the end of the grace period, and
    # the record says so (the stop was not graceful).
    (killed,) = events(rdir, "kill_sent")
    assert (killed["by"], killed["signal"]) == ("watchdog", "SIGKILL"), killed
    assert killed["after_s"] >= 2.0 and "grace period (2 s) ran out" in killed["reason"]
