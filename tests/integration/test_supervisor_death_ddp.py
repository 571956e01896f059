"""SIGKILL of the supervisor of a 2-process run: torchrun and both ranks end with it.

The single-process case is tests/integration/test_supervisor_death.py; here the workload is
``resources.processes = 2``: a torchrun agent and two gloo ranks on CPU, each rank in a
session of its own (torchrun starts them so). Both ranks stop at a gate in the middle of
step ``GATE`` (a file each writes, then they wait for ``go``): the supervisor is killed
there, so the kill lands mid-step whatever the machine's speed; the gate opens once the
stop has reached the ranks (rank 0's ``stop_requested``). No
rank and no torchrun may survive (the pids seen before the kill, and every process that
carries the run id), the ranks finish the step in flight and checkpoint it together,
``acceptrun ls`` reads "interrupted", and ``acceptrun resume`` continues from that
checkpoint to ACCEPTED with final weights bitwise equal to an uninterrupted 2-process run.
"""

from __future__ import annotations

import json
import signal
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from notify_receivers import watchdog_of
from supervisor_kill_harness import after_the_kill, cli, events, processes_of, run_dir, start_run

from conftest import wait_for

pytestmark = pytest.mark.slow

TOTAL, EVERY, GATE = 20, 5, 12

DDP = textwrap.dedent(
    """
    import hashlib, os, time
    import torch
    import torch.distributed as dist
    from torch import nn
    import acceptrun

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt)
    for step in run.steps(start, int(os.environ["TOTAL"])):
        if step == int(os.environ["GATE"]) and not os.path.exists("go"):
            open("at-gate-%d" % rank, "w").write(str(os.getpid()))  # mid-step: kill now
            while not os.path.exists("go"):
                time.sleep(0.01)
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(step, loss=loss.item())
        run.maybe_checkpoint(step)
    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
        open("weights.sha256", "w").write(digest.hexdigest())
    dist.barrier()
    run.finish()
    dist.destroy_process_group()
    """
)


def _job(root: Path, name: str, *, gate: bool) -> Path:
    job = root / name
    job.mkdir(parents=True)
    (job / "train.py").write_text(DDP)
    if not gate:
        (job / "go").touch()
    (job / "spec.toml").write_text(
        f'name = "{name}"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
        f'[env]\nTOTAL = "{TOTAL}"\nGATE = "{GATE}"\n'
        "[resources]\nprocesses = 2\n"
        f"[checkpoint]\nevery_steps = {EVERY}\nkeep_last = 2\n"
        '[limits]\nmax_restarts = 0\nrestart_backoff = 0\ngrace_period = "300s"\n'
    )
    return job


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final weights of an uninterrupted 2-process run."""
    root = tmp_path_factory.mktemp("ddp-reference")
    job = _job(root, "reference", gate=False)
    proc = start_run(job, root / "ws")
    assert proc.wait(timeout=600) == 0, (job / "supervisor.log").read_text()[-3000:]
    return (job / "weights.sha256").read_text()


def _command_lines(pid: int) -> dict[int, str]:
    """Every descendant of ``pid``: its command line ("" for one that could not be read)."""
    out = {}
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            out[proc.pid] = " ".join(proc.cmdline())
        except psutil.Error:
            out[proc.pid] = ""
    return out


def _gone(proc: psutil.Process) -> bool:
    """Ended (or a zombie): the process itself, not another one given its pid since."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _processes(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue  # already gone
    return out


def test_killed_supervisor_of_torchrun_leaves_no_rank_and_resumes_bitwise(
    tmp_path: Path, reference: str
) -> None:
    job, ws = _job(tmp_path, "killed", gate=True), tmp_path / "ws"
    sup = start_run(job, ws)
    try:
        gates = [job / "at-gate-0", job / "at-gate-1"]
        wait_for(lambda: all(g.exists() and g.read_text() for g in gates), 300, 0.05, "the gate")
        # The attempt's watchdog runs (started right after the leader), never a guess.
        wait_for(lambda: watchdog_of(sup.pid), what="the attempt's watchdog")
        # Read before the kill: torchrun's agent may be a zombie a moment after it.
        tree = _command_lines(sup.pid)
        ranks = {int(g.read_text()) for g in gates}
        agents = [pid for pid, cmd in tree.items() if "torch.distributed.run" in cmd]
        # Known by pid and start time: once reaped, a busy machine reuses a pid quickly.
        procs = _processes([*agents, *ranks])
    finally:
        sup.send_signal(signal.SIGKILL)
        sup.wait()
    assert len(agents) == 1 and ranks <= set(tree), (agents, ranks, tree)
    rdir = run_dir(ws)
    assert rdir is not None
    # The gate opens once the stop has reached a rank (rank 0 records its SIGTERM; the ranks
    # agree on a stop at the next boundary by MAX): the signal travels through torchrun's
    # agent, and the ranks' own look at the supervisor runs at most once a second, so a
    # gate opened at once lets fast steps run on before either lands.
    wait_for(
        lambda: [e for e in events(rdir, "stop_requested") if e.get("attempt") == 1],
        300, 0.05, "the stop to reach the ranks", explain=lambda: after_the_kill(rdir, job),
    )  # fmt: skip
    (job / "go").touch()  # the step in flight finishes; its supervisor is gone
    # Within the grace period and some slack (the grace is long so that the checkpoint at
    # the stop beats it on a loaded machine; a quick stop ends the wait sooner); a process
    # in its exit has no environment to read any more, so the pids seen before the kill are
    # waited for too.

    def none_left() -> bool:
        return all(_gone(proc) for proc in procs) and not processes_of(rdir.name)

    wait_for(
        none_left, 420, 0.1, f"torchrun {agents} and the ranks {sorted(ranks)} to end",
        explain=lambda: after_the_kill(rdir, job),
    )  # fmt: skip
    assert not events(rdir, "kill_sent"), json.dumps(events(rdir, "kill_sent"))  # graceful

    ls = cli(ws, "ls")
    row = next(line for line in ls.stdout.splitlines() if rdir.name in line)
    assert row.split()[1] == "interrupted", ls.stdout
    assert [e["attempt"] for e in events(rdir, "supervisor_lost")], "nobody saw it go"

    resumed = cli(ws, "resume", rdir.name, "--quiet", timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    state = json.loads((rdir / "run.json").read_text())
    assert (state["status"], state["verdict"]) == ("finished", "accepted"), state
    # The ranks finished the step in flight and checkpointed it together, as for any stop.
    stopped = events(rdir, "stopped")
    assert sorted((e["rank"], e["checkpoint"]) for e in stopped) == [(0, GATE), (1, GATE)]
    starts = [e for e in events(rdir, "attempt_start") if e["attempt"] == 2]
    assert starts and starts[0]["resume_step"] == GATE, starts
    assert (job / "weights.sha256").read_text() == reference, "not bitwise equal"
