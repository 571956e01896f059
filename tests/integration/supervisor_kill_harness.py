"""Kill an ``acceptrun run`` supervisor with SIGKILL at chosen moments, then check the promises.

Shared by tests/integration/test_supervisor_death.py and bench/supervisor_kills.py. A
moment is found by waiting for an event or a file, never by sleeping a guess:

- ``preflight``: the ``run_start`` event (the preflight's device probe takes seconds);
- ``step``: the step event of step ``n`` of the current attempt;
- ``checkpoint``: the marker file the workload's slow state object writes when a save
  starts (the save then takes ``SAVE_S`` more seconds);
- ``close``: the last attempt's ``attempt_exit`` (the verdict is not written yet).

After the kill: no process of the run may survive (waited for up to the grace period),
``acceptrun ls``/``show`` must read "interrupted", and ``acceptrun resume`` must end
ACCEPTED with final weights bitwise equal to an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from acceptrun.record.steplog import StepLog

WORKLOAD = textwrap.dedent(
    """
    import hashlib, os, sys, time
    import torch
    from torch import nn
    import acceptrun

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    total = int(os.environ.get("TOTAL", "30"))
    step_s = float(os.environ.get("STEP_S", "0.05"))
    marks = os.environ.get("MARKS", ".")

    class Slow:
        "A state object whose save takes SAVE_S seconds and says when it starts."

        def __init__(self):
            self.saves = 0

        def state_dict(self):
            self.saves += 1
            open(os.path.join(marks, "saving-%s" % os.environ["ACCEPTRUN_ATTEMPT"]), "w").close()
            time.sleep(float(os.environ.get("SAVE_S", "0.3")))
            return {"saves": self.saves}

        def load_state_dict(self, state):
            self.saves = state["saves"]

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt, slow=Slow())
    for step in run.steps(start, total):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(step_s)
        run.log(step, loss=loss.item())
        run.maybe_checkpoint(step)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    open(os.environ.get("DIGEST", "weights.sha256"), "w").write(digest.hexdigest())
    """
)

# A black box: no client, SIGTERM ignored, and a helper in a session of its own that a
# process-group kill would miss. Only the watchdog's SIGKILL after the grace period ends it.
BLACK_BOX = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                              start_new_session=True)
    open("started-%s" % os.environ["ACCEPTRUN_ATTEMPT"], "w").write(str(helper.pid))
    while True:
        time.sleep(0.1)
    """
)

MOMENTS = ("preflight", "step", "checkpoint", "close")


def make_job(
    root: Path, name: str, *, total: int = 30, every: int = 5, grace: str = "30s",
    black_box: bool = False,
) -> Path:  # fmt: skip
    job = root / name
    job.mkdir(parents=True)
    (job / "train.py").write_text(BLACK_BOX if black_box else WORKLOAD)
    (job / "spec.toml").write_text(
        f'name = "{name}"\ncommand = ["{sys.executable}", "train.py"]\n'
        f'[env]\nTOTAL = "{total}"\nMARKS = "{job}"\n'
        f"[checkpoint]\nevery_steps = {every}\nkeep_last = 2\n"
        f'[limits]\nmax_restarts = 0\nrestart_backoff = 0\ngrace_period = "{grace}"\n'
    )
    return job


def cli_env(ws: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env["ACCEPTRUN_WORKSPACE"] = str(ws)
    return env


def start_run(job: Path, ws: Path) -> subprocess.Popen[bytes]:
    """``acceptrun run spec.toml`` as a process of its own (the supervisor to kill)."""
    log = open(job / "supervisor.log", "ab")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(
        [sys.executable, "-m", "acceptrun", "run", "spec.toml"],
        cwd=job, env=cli_env(ws), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def cli(ws: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "acceptrun", *args],
        env=cli_env(ws), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def run_dir(ws: Path) -> Path | None:
    # ``.creating-<id>`` is a record being made, renamed into place a moment later
    runs = [p for p in (ws / "runs").glob("[!.]*") if (p / "run.json").exists()]
    return runs[0] if len(runs) == 1 else None


def events(rdir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    if kind == "step":  # steps are in the step log (record format 2), not events.jsonl
        return StepLog(rdir).events()
    out = []
    with contextlib.suppress(OSError):
        for line in (rdir / "events.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if kind is None or ev.get("kind") == kind:
                    out.append(ev)
    return out


def processes_of(run_id: str) -> list[int]:
    """Pids of live processes whose environment carries the run id (any attempt)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("ACCEPTRUN_RUN_ID") == run_id:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def after_the_kill(rdir: Path, job: Path) -> str:
    """What a wait after the supervisor's SIGKILL shows when it fails: the watchdog's events
    (supervisor_lost first), whether a watchdog of the run still runs, every process carrying
    the run id with its state and command, and the supervisor log's end."""
    watchdog = [e for e in events(rdir) if e.get("by") == "watchdog"]
    running, left = [], []
    for proc in psutil.process_iter(["pid", "status", "cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            cmd = " ".join(proc.info["cmdline"] or ())
            if "_watchdog.py" in cmd and str(rdir) in cmd:
                running.append((proc.pid, proc.info["status"]))
            elif proc.environ().get("ACCEPTRUN_RUN_ID") == rdir.name:
                left.append((proc.pid, proc.info["status"], cmd[:120]))
    log = job / "supervisor.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(none)"
    last = [e.get("kind") for e in events(rdir)][-15:]
    return (
        f"watchdog events: {watchdog}\nwatchdog still running: {running}\n"
        f"processes of the run: {left}\nlast events: {last}\nsupervisor.log: {tail}"
    )


def waiter(timeout: float) -> Callable[[Callable[[], Any], str], Any]:
    def wait(predicate: Callable[[], Any], what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.02)

    return wait


def moment_reached(job: Path, ws: Path, moment: str, step: int) -> Callable[[], bool]:
    """A predicate that becomes true at ``moment`` of the first attempt."""

    def reached() -> bool:
        rdir = run_dir(ws)
        if rdir is None:
            return False
        if moment == "preflight":
            return bool(events(rdir, "run_start"))
        if moment == "step":
            return any(e.get("step", -1) >= step for e in events(rdir, "step"))
        if moment == "checkpoint":
            return (job / "saving-1").exists()
        if moment == "close":
            return bool(events(rdir, "attempt_exit"))
        raise ValueError(f"moment {moment!r}: expected one of {MOMENTS}")

    return reached


@dataclass
class KillResult:
    moment: str
    run_id: str = ""
    orphans: list[int] = field(default_factory=list)
    shown: str = ""  # what `acceptrun ls` shows as the run's status
    show_says_interrupted: bool = False
    preflight_hit: bool = True  # a "preflight" kill landed before the first attempt
    resume_rc: int | None = None
    accepted: bool = False
    bitwise: bool = False
    lost_steps: int = 0  # committed checkpoint steps the resume did not start from
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def kill_and_resume(
    job: Path, ws: Path, moment: str, *, reference: str | None, step: int = 10,
    timeout: float = 180.0, grace_s: float = 30.0,
) -> KillResult:  # fmt: skip
    """One kill of the supervisor at ``moment``, then the checks and the resume."""
    t0 = time.monotonic()
    res = KillResult(moment)
    wait = waiter(timeout)
    sup = start_run(job, ws)
    try:
        wait(moment_reached(job, ws, moment, step), f"moment {moment}")
    finally:
        sup.send_signal(signal.SIGKILL)
        sup.wait()
    killed_at = time.time()
    rdir = run_dir(ws)
    assert rdir is not None
    res.run_id = rdir.name
    res.preflight_hit = moment != "preflight" or not (rdir / "attempts").exists()
    # No orphan: every process of the run ends within the grace period (+ slack).
    try:
        waiter(grace_s + 30.0)(lambda: not processes_of(res.run_id), "no process of the run")
    except TimeoutError:
        res.orphans = processes_of(res.run_id)
        for pid in res.orphans:  # leave the machine clean for the next kill
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    ls = cli(ws, "ls")
    row = next((line for line in ls.stdout.splitlines() if res.run_id in line), "")
    res.shown = row.split()[1] if len(row.split()) > 1 else ""
    show = cli(ws, "show", res.run_id)
    res.show_says_interrupted = "interrupted" in show.stdout
    committed = [
        int(e["step"])
        for e in events(rdir, "checkpoint_commit")
        if isinstance(e.get("step"), int) and e["t"] <= killed_at
    ]
    # Killed before its first checkpoint, the run has nothing to resume from; `resume`
    # refuses to start over silently and must be told to.
    scratch = [] if committed else ["--from-scratch"]
    resumed = cli(ws, "resume", res.run_id, "--quiet", *scratch, timeout=timeout)
    res.resume_rc = resumed.returncode
    if resumed.returncode != 0:
        res.notes.append(f"resume exited {resumed.returncode}: {resumed.stderr[-2000:]}")
    state = json.loads((rdir / "run.json").read_text())
    res.accepted = state.get("status") == "finished" and state.get("verdict") == "accepted"
    digest = job / "weights.sha256"
    res.bitwise = reference is not None and digest.exists() and digest.read_text() == reference
    starts = [e for e in events(rdir, "attempt_start") if e.get("attempt", 0) > 1]
    resume_step = starts[0].get("resume_step") if starts else None
    if committed:
        res.lost_steps = max(0, max(committed) - (resume_step if resume_step is not None else -1))
    res.seconds = time.monotonic() - t0
    return res


def reference_digest(root: Path, ws: Path, *, total: int = 30) -> str:
    """The final weights of an uninterrupted run of the same workload."""
    job = make_job(root, "reference", total=total)
    proc = start_run(job, ws)
    rc = proc.wait(timeout=600)
    if rc != 0:
        raise RuntimeError(f"the reference run exited {rc}; see {job / 'supervisor.log'}")
    return (job / "weights.sha256").read_text()
