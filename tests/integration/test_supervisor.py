"""The supervisor on real child processes: attempts, restarts, signals, limits, groups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.run.launch import launch
from acceptrun.spec.model import load_spec
from acceptrun.supervisor import Supervisor


def exit_json(record: RunRecord, attempt: int) -> dict[str, Any]:
    data = record.read_json(f"attempts/{attempt}/exit.json")
    assert isinstance(data, dict), f"attempts/{attempt}/exit.json missing"
    return data


def kinds(record: RunRecord, *only: str) -> list[str]:
    return [e["kind"] for e in record.events(*only)]


def attempt_numbers(record: RunRecord) -> list[int]:
    return sorted(int(p.name) for p in (record.path / "attempts").iterdir())


def gone(pid: int, command: str | None = None) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for init to reap it counts).

    ``command``: a word of its command line; a process without it was given the pid
    since (a busy machine reuses a reaped pid within seconds), so the one meant is gone.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z" or (
        command is not None and command not in cmdline
    )


# ---- outcomes -----------------------------------------------------------------------------


def test_exit_0_is_accepted_with_logs(project: Any) -> None:
    spec = project.spec(
        """
        import sys
        print("hello from stdout")
        print("hello from stderr", file=sys.stderr)
        """
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    assert result.verdict.accepted and result.exit_code == 0
    rec = result.record
    assert rec.read_json("verdict.json")["verdict"] == "accepted"
    ex = exit_json(rec, 1)
    assert ex["outcome"] == "success" and ex["returncode"] == 0 and ex["signal"] is None
    assert "hello from stdout" in (rec.attempt_dir(1) / "stdout.log").read_text()
    assert "hello from stderr" in (rec.attempt_dir(1) / "stderr.log").read_text()
    assert rec.state["status"] == "finished" and rec.state["verdict"] == "accepted"
    assert kinds(rec, "attempt_start", "attempt_exit") == ["attempt_start", "attempt_exit"]


def test_failing_workload_is_restarted_then_given_up(project: Any) -> None:
    spec = project.spec(
        "import sys; print('failing'); sys.exit(3)",
        extra="[limits]\nmax_restarts = 2\nrestart_backoff = 0.1\n",
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    rec = result.record
    assert attempt_numbers(rec) == [1, 2, 3]
    for n in (1, 2, 3):
        ex = exit_json(rec, n)
        assert (ex["outcome"], ex["returncode"], ex["attempt"]) == ("failed", 3, n)
    give_up = list(rec.events("give_up"))
    assert len(give_up) == 1 and "max_restarts = 2" in give_up[0]["reason"]
    restarts = list(rec.events("restart"))
    assert [r["backoff_s"] for r in restarts] == pytest.approx([0.1, 0.2])
    assert result.supervision is not None and not result.supervision.succeeded
    assert not result.verdict.accepted and result.exit_code == 1
    assert rec.read_json("verdict.json")["verdict"] == "rejected"
    assert rec.state["attempts"] == 3


def test_fails_once_then_succeeds_on_attempt_2(project: Any) -> None:
    spec = project.spec(
        """
        import os, sys
        attempt = int(os.environ["ACCEPTRUN_ATTEMPT"])
        print("attempt", attempt)
        sys.exit(0 if attempt >= 2 else 1)
        """,
        extra="[limits]\nmax_restarts = 3\nrestart_backoff = 0.1\n",
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    rec = result.record
    assert result.verdict.accepted and result.exit_code == 0
    assert attempt_numbers(rec) == [1, 2]
    assert exit_json(rec, 1)["outcome"] == "failed"
    assert exit_json(rec, 2)["outcome"] == "success"
    (restart,) = rec.events("restart")
    assert restart["attempt"] == 2 and restart["after"] == "failed"
    assert restart["backoff_s"] == pytest.approx(0.1)
    restarts_check = next(c for c in result.verdict.checks if c.name == "restarts")
    assert restarts_check.evidence.startswith("1 of at most 3")
    assert "attempt 2" in (rec.attempt_dir(2) / "stdout.log").read_text()


@pytest.mark.parametrize(
    ("signum", "name"),
    [
        pytest.param(signal.SIGKILL, "SIGKILL", id="sigkill"),
        pytest.param(signal.SIGSEGV, "SIGSEGV", id="sigsegv"),
        # Real-time signals have no signal.Signals member; the supervisor must still classify.
        pytest.param(signal.SIGRTMIN + 1, f"signal {signal.SIGRTMIN + 1}", id="sigrtmin+1"),
    ],
)
def test_killed_by_a_real_signal(project: Any, signum: int, name: str) -> None:
    spec = project.spec(
        f"import os, signal, faulthandler\nfaulthandler.disable()\nos.kill(os.getpid(), {int(signum)})\n",
        extra="[limits]\nmax_restarts = 0\n",
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    ex = exit_json(result.record, 1)
    assert ex["outcome"] == "signaled"
    assert ex["signal"] == name and ex["returncode"] is None
    assert not result.verdict.accepted and result.exit_code == 1


# ---- limits ----------------------------------------------------------------------------------


def test_wall_time_stops_the_workload(project: Any) -> None:
    spec = project.spec(
        "import time\ntime.sleep(60)\n",
        extra='[limits]\nwall_time = "1s"\ngrace_period = "60s"\nmax_restarts = 3\n',
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    rec = result.record
    assert attempt_numbers(rec) == [1]  # wall time is never a reason to restart
    ex = exit_json(rec, 1)
    # Stopped at the wall time by the SIGTERM, not after the 60 s sleep (which exits 0),
    # and not before the wall time since the launch, however slow the start-up.
    assert ex["outcome"] == "wall_time" and ex["signal"] == "SIGTERM"
    assert ex["duration_s"] < 60
    (stop,) = rec.events("stop_sent")
    assert stop["signal"] == "SIGTERM" and "wall time" in stop["reason"]
    (start,) = rec.events("run_start")
    assert stop["t"] - start["t"] >= 1.0
    assert not list(rec.events("kill_sent"))  # default SIGTERM ends it within the grace
    assert not result.verdict.accepted and result.exit_code == 1
    exit_check = next(c for c in result.verdict.checks if c.name == "exit")
    assert exit_check.fix is not None and "wall_time" in exit_check.fix


def test_workload_ignoring_sigterm_is_killed_after_the_grace_period(project: Any) -> None:
    spec = project.spec(
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(60)
        """,
        extra='[limits]\nwall_time = "1s"\ngrace_period = "1s"\n',
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    rec = result.record
    ex = exit_json(rec, 1)
    assert ex["duration_s"] < 60  # 1 s wall time + 1 s grace, then SIGKILL: not the sleep
    assert ex["outcome"] == "wall_time" and ex["signal"] == "SIGKILL"
    (kill,) = rec.events("kill_sent")
    assert kill["signal"] == "SIGKILL" and kill["after_s"] >= 1.0
    assert kinds(rec, "stop_sent", "kill_sent") == ["stop_sent", "kill_sent"]


# ---- stop requests -----------------------------------------------------------------------------

STEPPING_WORKLOAD = """
import time
import acceptrun

run = acceptrun.init()
for step in run.steps(100_000):
    time.sleep(0.02)
    run.log(step, loss=1.0 / (step + 1))
"""


def signal_cli_run(
    project: Any,
    spec: Path,
    poll: Callable[..., Any],
    signum: int,
    disposition: Any = signal.SIG_DFL,
) -> tuple[subprocess.CompletedProcess[str], RunRecord]:
    """Run ``acceptrun run SPEC`` as a real process; once 3 steps are logged, send it ``signum``.

    ``disposition`` is what the process inherits for ``signum``: SIG_DFL as from a terminal
    (even when pytest itself runs as a background job, where `&` leaves SIGINT ignored), or
    SIG_IGN as under nohup. Returns the finished process and its record.
    """
    argv = [sys.executable, "-m", "acceptrun", "--workspace", str(project.workspace)]
    proc = subprocess.Popen(
        [*argv, "run", str(spec)],
        cwd=project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signum, disposition),
    )
    try:
        run_id = poll(lambda: project.run_ids(), what="the run record")[0]
        rec = RunRecord(project.runs_dir / run_id)
        poll(lambda: len(list(rec.events("step"))) >= 3, what="three step events")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)  # a guard against a hang, not a figure
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), rec


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["sigterm", "sigint", "sighup"]
)
def test_stop_request_to_the_supervisor_ends_at_a_step_boundary(
    project: Any, poll: Callable[..., Any], signum: int
) -> None:
    spec = project.spec(
        STEPPING_WORKLOAD,
        extra='[limits]\nmax_restarts = 3\nrestart_backoff = 0.1\ngrace_period = "300s"\n',
    )
    proc, rec = signal_cli_run(project, spec, poll, signum)

    # It ended at the next step boundary, not at the grace period's SIGKILL (no kill_sent
    # below): the events say so, whatever the machine's speed.
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "REJECTED" in proc.stdout
    assert rec.read_json("verdict.json")["verdict"] == "rejected"
    assert attempt_numbers(rec) == [1]  # a stop is never restarted
    ex = exit_json(rec, 1)
    assert ex["outcome"] == "stopped", ex
    assert ex["returncode"] == 143  # the client exits like a process ended by SIGTERM
    assert signal.Signals(signum).name in ex["reason"]
    (stopped,) = rec.events("stopped")  # written by the client at a step boundary
    steps = [e["step"] for e in rec.events("step")]
    assert stopped["step"] == steps[-1] + 1 and steps == list(range(len(steps)))
    assert not list(rec.events("restart")) and not list(rec.events("kill_sent"))
    (end,) = rec.events("workload_end")
    assert end["status"] == "stopped"


def test_second_ctrl_c_kills_at_once(project: Any, poll: Callable[..., Any]) -> None:
    spec = project.spec(
        """
        import pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path("ready").write_text("1")
        time.sleep(60)
        """,
        extra='[limits]\ngrace_period = "30s"\n',
    )
    argv = [sys.executable, "-m", "acceptrun", "--workspace", str(project.workspace)]
    proc = subprocess.Popen(
        [*argv, "run", str(spec)],
        cwd=project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        poll(lambda: (project.root / "ready").exists(), what="the workload to start")
        rec = RunRecord(project.runs_dir / project.run_ids()[0])
        proc.send_signal(signal.SIGINT)
        poll(lambda: list(rec.events("stop_sent")), what="the stop to reach the workload")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)  # a guard against a hang, not a figure
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 1, (out, err)
    (kill,) = rec.events("kill_sent")
    assert kill["after_s"] < 30  # killed on the second Ctrl-C, not after the 30 s grace period
    ex = exit_json(rec, 1)
    assert (ex["outcome"], ex["signal"]) == ("stopped", "SIGKILL")


def test_nohup_run_ignores_sighup(project: Any, poll: Callable[..., Any]) -> None:
    """Under `nohup acceptrun run`, closing the terminal (SIGHUP) must not stop the run."""
    spec = project.spec(STEPPING_WORKLOAD.replace("100_000", "100"))
    proc, rec = signal_cli_run(project, spec, poll, signal.SIGHUP, signal.SIG_IGN)

    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert exit_json(rec, 1)["outcome"] == "success"
    assert len(list(rec.events("step"))) == 100
    assert not list(rec.events("stop_sent"))


def test_stop_during_restart_backoff_ends_without_waiting(
    project: Any, poll: Callable[..., Any]
) -> None:
    spec_path = project.spec(
        "import sys; sys.exit(1)",
        extra="[limits]\nmax_restarts = 3\nrestart_backoff = 30\n",
    )
    spec = load_spec(spec_path)
    ws = Workspace.create(project.workspace)
    rec = ws.create_run(spec.name, spec_text=spec.to_toml(), state={"mode": "supervised"})
    sup = Supervisor(rec, spec, echo=False)

    stopped_at: list[float] = []

    def stop_when_restarting() -> None:
        poll(lambda: list(rec.events("restart")), what="the restart event")
        stopped_at.append(time.monotonic())
        sup.request_stop("test stop")

    helper = threading.Thread(target=stop_when_restarting, daemon=True)
    helper.start()
    result = sup.run()
    helper.join(5)

    # The run ended soon after the stop request, not after the 30 s backoff (measured from
    # the request, so the attempt's start-up on a busy machine does not count).
    assert time.monotonic() - stopped_at[0] < 30
    assert len(result.attempts) == 1 and result.attempts[0].outcome == "failed"
    assert result.stop_reason is not None and "test stop" in result.stop_reason
    assert attempt_numbers(rec) == [1]


def test_stop_arriving_as_an_attempt_fails_is_not_lost(project: Any) -> None:
    """A stop that lands between a failed attempt's exit and the backoff wait is honoured.

    ``say`` runs exactly there, so calling request_stop from it reproduces a signal
    arriving at that moment, without any timing luck.
    """
    spec_path = project.spec(
        "import sys; sys.exit(1)",
        extra="[limits]\nmax_restarts = 3\nrestart_backoff = 30\n",
    )
    spec = load_spec(spec_path)
    rec = Workspace.create(project.workspace).create_run(
        spec.name, spec_text=spec.to_toml(), state={"mode": "supervised"}
    )
    sup: Supervisor
    stopped_at: list[float] = []

    def say(message: str) -> None:
        if "restarting in" in message:
            stopped_at.append(time.monotonic())
            sup.request_stop("signal SIGTERM to the supervisor")

    sup = Supervisor(rec, spec, echo=False, say=say)
    result = sup.run()

    assert time.monotonic() - stopped_at[0] < 30  # not the 30 s backoff, and no attempt 2
    assert [a.outcome for a in result.attempts] == ["failed"]
    assert attempt_numbers(rec) == [1]


# ---- process group, environment, shell --------------------------------------------------------


def test_grandchild_does_not_outlive_the_attempt(project: Any, poll: Callable[..., Any]) -> None:
    spec = project.spec(
        """
        import subprocess
        child = subprocess.Popen(["sleep", "1000"])
        open("grandchild.pid", "w").write(str(child.pid))
        """
    )
    t0 = time.monotonic()
    result = launch(spec, workspace=project.workspace, echo=False)

    assert result.verdict.accepted
    # The grandchild sleeps 1000 s holding the log pipes: the run did not wait for it
    # (finish() freed them), however slow the machine.
    assert time.monotonic() - t0 < 500
    pid = int((project.root / "grandchild.pid").read_text())
    try:
        poll(lambda: gone(pid, "sleep 1000"), timeout=60, what=f"grandchild {pid} to end")
    finally:
        if not gone(pid, "sleep 1000"):
            os.kill(pid, signal.SIGKILL)


def test_workload_sees_the_contract_environment(project: Any) -> None:
    spec = project.spec(
        """
        import json, os
        names = [n for n in os.environ if n.startswith("ACCEPTRUN_")] + ["MY_SETTING"]
        print(json.dumps({n: os.environ.get(n) for n in names} | {"cwd": os.getcwd()}))
        """,
        extra='env = { MY_SETTING = "from the spec", ACCEPTRUN_ATTEMPT = "99" }\n',
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    rec = result.record
    seen = json.loads((rec.attempt_dir(1) / "stdout.log").read_text())
    assert seen["ACCEPTRUN_RUN_DIR"] == str(rec.path)
    assert seen["ACCEPTRUN_RUN_ID"] == rec.run_id
    assert seen["ACCEPTRUN_ATTEMPT"] == "1"  # the contract wins over the spec's env
    assert seen["ACCEPTRUN_SPEC"] == str(rec.spec_path) and rec.spec_path.is_file()
    assert seen["ACCEPTRUN_CHECKPOINT_DIR"] == str(rec.checkpoints_dir)
    assert seen["ACCEPTRUN_RESUME_FROM"] == ""
    assert seen["MY_SETTING"] == "from the spec"
    assert seen["cwd"] == str(project.root)


def test_checkpoint_dir_from_the_spec_is_passed_resolved(project: Any) -> None:
    spec = project.spec(
        "import os; print(os.environ['ACCEPTRUN_CHECKPOINT_DIR'])",
        extra='[checkpoint]\ndir = "ckpt"\n',
    )
    result = launch(spec, workspace=project.workspace, echo=False)

    out = (result.record.attempt_dir(1) / "stdout.log").read_text().strip()
    assert out == str(project.root / "ckpt" / result.record.run_id)  # the run's own store


def test_string_command_runs_through_sh(project: Any) -> None:
    spec = project.spec(command="echo hi && echo $0 >&2 && exit 0")
    result = launch(spec, workspace=project.workspace, echo=False)

    rec = result.record
    assert result.verdict.accepted
    assert (rec.attempt_dir(1) / "stdout.log").read_text() == "hi\n"
    assert (rec.attempt_dir(1) / "stderr.log").read_text().strip() == "/bin/sh"
    (start,) = rec.events("attempt_start")
    assert start["command"] == ["/bin/sh", "-c", "echo hi && echo $0 >&2 && exit 0"]


def test_string_command_exit_status_is_the_shells(project: Any) -> None:
    spec = project.spec(command="echo oops >&2; exit 4", extra="[limits]\nmax_restarts = 0\n")
    result = launch(spec, workspace=project.workspace, echo=False)

    ex = exit_json(result.record, 1)
    assert (ex["outcome"], ex["returncode"]) == ("failed", 4)
    assert "exited 4" in ex["reason"]
    assert list(result.record.events("give_up"))
