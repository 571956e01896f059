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

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(),
    reason="the watchdog reads a process's start time from /proc (Linux); without /proc "
    "it knows the leader by its pid alone, and there is no start time to test",
)

_spec = importlib.util.spec_from_file_location(
    "acceptrun_watchdog", Path(supervisor_pkg.__file__).with_name("_watchdog.py")
)
assert _spec is not None and _spec.loader is not None
watchdog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(watchdog)  # run by path in production too: it imports no acceptrun


def test_a_live_process_is_the_leader_only_with_its_own_start_time() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
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


# The harness: a child subreaper (so the attempt's leader becomes its child when the
# supervisor dies, and it reaps it), which gives the reaped leader's pid to a new
# process in a session of its own, through ns_last_pid. It prints what it saw as JSON.
HARNESS = r"""
import ctypes, json, os, signal, subprocess, sys, time
import psutil
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
workspace, spec, events = sys.argv[1], sys.argv[2], None
sup = subprocess.Popen(
    [sys.executable, "-m", "acceptrun", "--workspace", workspace, "run", "-q", spec],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)

def wait(what, ok, timeout=300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = ok()
        if got:
            return got
        time.sleep(0.02)
    print(json.dumps({"error": f"timed out waiting for {what}"}))
    sys.exit(1)

leader = int(wait("the leader", lambda: os.path.exists("leader.pid") and open("leader.pid").read()))
def watchdog():
    for p in psutil.Process(sup.pid).children():
        if "_watchdog.py" in " ".join(p.cmdline()):
            return p
dog = wait("the watchdog", watchdog)
runs = os.path.join(workspace, "runs")
events = os.path.join(runs, os.listdir(runs)[0], "events.jsonl")
sup.kill()
sup.wait()
wait("supervisor_lost", lambda: "supervisor_lost" in open(events).read())
os.kill(leader, signal.SIGKILL)  # it ignores SIGTERM; it dies now, and is reaped here
os.waitpid(leader, 0)
impostor = None
for _ in range(500):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(leader - 1))
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    if p.pid == leader:
        impostor = p
        break
    p.kill()
    p.wait()
if impostor is None:
    print(json.dumps({"skip": "on a busy machine another process took the reaped pid on "
                      "each of 500 tries; the identity checks above ran"}))
    sys.exit(0)
try:
    dog.wait(timeout=120)  # its grace period is 600 s: it must not wait for the impostor
    ended = True
except psutil.TimeoutExpired:
    ended = False
alive = impostor.poll() is None
impostor.kill()
impostor.wait()
if not ended:
    dog.kill()
print(json.dumps({"watchdog_ended": ended, "impostor_alive": alive, "events": open(events).read()}))
"""

LEADER = """
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop it never honours
open("leader.pid", "w").write(str(os.getpid()))
signal.pause()  # until the harness kills it
"""


def test_a_reaped_leaders_pid_given_to_another_process_is_left_alone(tmp_path: Path) -> None:
    """The supervisor dies, its leader is reaped, and a new process in a session of its
    own gets the leader's pid: the watchdog ends at once, and that process and its group
    are untouched (it waited out its grace period for it, then SIGKILLed its group)."""
    import json
    import os

    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip(
            "giving a reaped pid to a chosen process needs root (a writable "
            "/proc/sys/kernel/ns_last_pid); the identity checks above ran without it"
        )
    (tmp_path / "work.py").write_text(LEADER)
    (tmp_path / "spec.toml").write_text(
        f'name = "reuse"\ncommand = [{json.dumps(sys.executable)}, "work.py"]\n'
        '[limits]\ngrace_period = "600s"\nmax_restarts = 0\n'
    )
    (tmp_path / "harness.py").write_text(HARNESS)
    out = subprocess.run(
        [sys.executable, "harness.py", str(tmp_path / "ws"), "spec.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    assert result["watchdog_ended"], "the watchdog waited for another process given the pid"
    assert result["impostor_alive"], "the watchdog signalled another process given the pid"
    assert '"kind": "kill_sent"' not in result["events"], result["events"]
