"""Processes that leave the attempt's tree are still ended (supervisor/containment.py).

A black-box workload starts two processes that a process-group kill and the environment
marker both miss: ``setsid env -i python ...`` and a double-forked daemon that execs
through ``env -i``. Each case runs under each mechanism this machine gives (forced with
``ACCEPTRUN_CONTAINMENT``): after a normal end of ``acceptrun run`` both are gone, and
after a SIGKILL of the supervisor the watchdog ends them within the grace period and its
``kill_sent`` lists them. Without any mechanism the run says so loudly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from notify_receivers import watchdog_of
from supervisor_kill_harness import cli_env, events, run_dir
from tests.campaign import tally

from acceptrun.supervisor.containment import MECHANISMS, supported
from conftest import wait_for

MARK = "acceptrun-escaped-descendant"  # in the escaped processes' argv, for the cleanup

# Each escaped process writes its pid, then sleeps until killed.
ESCAPED = f"import os, signal, sys; open(sys.argv[1], 'w').write(str(os.getpid())); signal.pause() # {MARK}"

WORKLOAD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    marks, mode = os.environ["MARKS"], os.environ["MODE"]
    py, code = sys.executable, os.environ["ESCAPED"]
    # 1. a new session and an empty environment: no group, no marker
    subprocess.Popen(["setsid", "env", "-i", py, "-c", code, os.path.join(marks, "setsid.pid")])
    # 2. a daemon: fork, setsid, fork, the middle one exits at once (the daemon is an
    #    orphan before any listing can see its parent), then exec with no environment
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/usr/bin/env", ["env", "-i", py, "-c", code, os.path.join(marks, "daemon.pid")])
        os._exit(0)
    os.wait()
    deadline = time.monotonic() + 300  # a hang guard: the two pid files come at once
    while not all(os.path.exists(os.path.join(marks, n)) for n in ("setsid.pid", "daemon.pid")):
        if time.monotonic() > deadline:
            raise SystemExit("the escaped processes never wrote their pids")
        time.sleep(0.02)  # polls a file, guesses no speed
    open(os.path.join(marks, "ready"), "w").close()
    if mode == "hold":
        while True:
            signal.pause()  # until the supervisor's stop or the watchdog's kill
    """
)

MECHANISMS_HERE = [m for m in supported() if m != "none"]


def _job(tmp_path: Path, mode: str) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    (job / "work.py").write_text(WORKLOAD)
    (job / "spec.toml").write_text(
        f'name = "escape"\ncommand = ["{sys.executable}", "work.py"]\n'
        f"[env]\nMARKS = {json.dumps(str(job))}\nMODE = {json.dumps(mode)}\n"
        f"ESCAPED = {json.dumps(ESCAPED)}\n"
        '[limits]\nmax_restarts = 0\nrestart_backoff = 0\ngrace_period = "2s"\n'
    )
    return job


def _env(ws: Path, mechanism: str) -> dict[str, str]:
    env = cli_env(ws)
    env["ACCEPTRUN_CONTAINMENT"] = mechanism
    return env


def _pid(job: Path, name: str) -> int:
    return int((job / f"{name}.pid").read_text())


def _alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and MARK in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _cleanup(job: Path) -> list[int]:
    """Kill any escaped process a failing case left; the pids that were still there."""
    left = []
    for name in ("setsid", "daemon"):
        with contextlib.suppress(OSError, ValueError):
            pid = _pid(job, name)
            if _alive(pid):
                left.append(pid)
                os.kill(pid, signal.SIGKILL)
    return left


def _mechanism(rdir: Path) -> Any:
    (start,) = events(rdir, "attempt_start")
    return (start.get("containment") or {}).get("mechanism")


@pytest.mark.parametrize("mechanism", [pytest.param(m, id=m) for m in MECHANISMS_HERE])
def test_escaped_processes_end_with_a_normal_exit(tmp_path: Path, mechanism: str) -> None:
    job, ws = _job(tmp_path, "exit"), tmp_path / "ws"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "acceptrun", "run", "spec.toml"],
            cwd=job, env=_env(ws, mechanism), capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip
        assert (job / "ready").exists(), done.stdout + done.stderr
        pids = [_pid(job, "setsid"), _pid(job, "daemon")]
        rdir = run_dir(ws)
        assert rdir is not None
        assert _mechanism(rdir) == mechanism
        # `acceptrun run` returned: nothing of the attempt runs any more.
        assert [p for p in pids if _alive(p)] == []
        (killed,) = events(rdir, "strays_killed")
        assert set(pids) <= set(killed["pids"]) and killed["containment"] == mechanism
        assert "Traceback" not in done.stderr
    finally:
        left = _cleanup(job)
    tally("escaped descendants", tried=1, tracebacks=0, outside=len(left))
    assert left == []


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", [pytest.param(m, id=m) for m in MECHANISMS_HERE])
def test_escaped_processes_end_after_the_supervisor_dies(tmp_path: Path, mechanism: str) -> None:
    job, ws = _job(tmp_path, "hold"), tmp_path / "ws"
    log = open(job / "supervisor.log", "ab")  # noqa: SIM115 - the child holds it
    sup = subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "run", "spec.toml"],
        cwd=job, env=_env(ws, mechanism), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(lambda: (job / "ready").exists(), what="the escaped processes' pid files")
        pids = [_pid(job, "setsid"), _pid(job, "daemon")]

        def listed() -> bool:
            # The supervisor lists the attempt's processes each second: kill it once the
            # list (what the watchdog reads) names both, never on a guess.
            rdir = run_dir(ws)
            if rdir is None:
                return False
            with contextlib.suppress(OSError, ValueError):
                held = json.loads((rdir / "attempts/1/processes.json").read_text())
                return set(pids) <= {r["pid"] for r in held["processes"]}
            return False

        wait_for(listed, what="processes.json listing both escaped processes")
        # The watchdog starts right after the attempt's first listing; on a loaded machine
        # the escaped processes can be in that listing before it exists: wait for it.
        wait_for(lambda: watchdog_of(sup.pid), what="the attempt's watchdog")
        sup.send_signal(signal.SIGKILL)
        sup.wait()
        rdir = run_dir(ws)
        assert rdir is not None
        assert _mechanism(rdir) == mechanism

        # The watchdog asks every process of the attempt left after its leader to stop
        # (stop_sent), and kills what is still there when the grace period ends.
        def told() -> list[dict[str, Any]]:
            return [e for e in events(rdir, "stop_sent") + events(rdir, "kill_sent")
                    if e.get("by") == "watchdog"]  # fmt: skip

        def explain() -> str:
            # Everything the watchdog wrote (supervisor_lost first), whether it is still
            # running, and the supervisor's last lines: where it stopped is then on record.
            import psutil

            by = [e for e in events(rdir) if e.get("by") == "watchdog"]
            alive = [
                p.pid for p in psutil.process_iter(["cmdline"])
                if "_watchdog.py" in " ".join(p.info["cmdline"] or ()) and str(rdir) in " ".join(p.info["cmdline"] or ())
            ]  # fmt: skip
            return (
                f"watchdog events: {by}; watchdog still running: {alive}; "
                f"supervisor.log: {(job / 'supervisor.log').read_text()[-2000:]}"
            )

        wait_for(
            lambda: not any(_alive(p) for p in pids), timeout=90, what="the escaped end",
            explain=explain,
        )  # fmt: skip
        # Each signal is recorded before it is sent: the processes' end implies the record.
        assert set(pids) <= {pid for e in told() for pid in e["pids"]}, told()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        log.close()
        left = _cleanup(job)
    tally("escaped descendants", tried=1, tracebacks=0, outside=len(left))
    assert left == []


def test_no_mechanism_is_said_loudly(tmp_path: Path) -> None:
    job, ws = _job(tmp_path, "exit"), tmp_path / "ws"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "acceptrun", "run", "spec.toml"],
            cwd=job, env=_env(ws, "none"), capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip
        rdir = run_dir(ws)
        assert rdir is not None
        assert _mechanism(rdir) == "none"
        (warned,) = events(rdir, "containment_unavailable")
        assert "setsid" in warned["why"] and "ACCEPTRUN_CONTAINMENT=none" in warned["why"]
        assert "no cgroup and no child subreaper" in done.stdout + done.stderr
    finally:
        _cleanup(job)


def test_the_mechanisms_here_are_named() -> None:
    """Which ones this machine gives, so a run of the suite says what it proved."""
    here = supported()
    assert here[-1] == "none" and set(here) <= set(MECHANISMS)
    if sys.platform.startswith("linux"):
        assert "subreaper" in here
