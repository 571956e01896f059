"""The watchdog knows the attempt's leader by pid and start time (supervisor/_watchdog.py).

Once the supervisor is gone, its reaped leader's pid can be given to another process
within seconds on a busy host; the watchdog must neither wait for that process nor
signal it or its group. Real processes: a child, its /proc entry, its reaping.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import acceptrun.supervisor as supervisor_pkg

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

_spec = importlib.util.spec_from_file_location(
    "acceptrun_watchdog", Path(supervisor_pkg.__file__).with_name("_watchdog.py")
)
assert _spec is not None and _spec.loader is not None
watchdog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(watchdog)  # run by path in production too: it imports no acceptrun


def test_a_live_process_is_the_leader_only_with_its_own_start_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = watchdog._stat(child.pid)
        assert stat is not None
        state, started = stat
        assert state in (b"R", b"S", b"D")
        assert watchdog._exists(child.pid, started) and watchdog._exists(child.pid)
        # The same pid with another start time is another process: not waited for, and
        # its group is not the leader's.
        assert not watchdog._exists(child.pid, started + 1)
        assert not watchdog._group_ours(child.pid, started + 1)
        assert watchdog._group_ours(child.pid, started)
    finally:
        child.kill()
        child.wait()
    # Reaped: no process has the pid, so only the leader's own group could hold it.
    assert not watchdog._exists(child.pid, started)
    assert watchdog._group_ours(child.pid, started)


def test_a_zombie_leader_is_not_waited_for() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = watchdog._stat(child.pid)
    assert stat is not None
    started = stat[1]
    # Not reaped yet: a zombie once it exits, still the leader's pid and group.
    import os

    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert watchdog._stat(child.pid)[0] == b"Z"  # type: ignore[index]
    assert not watchdog._exists(child.pid, started)
    assert watchdog._group_ours(child.pid, started)
    child.wait()
