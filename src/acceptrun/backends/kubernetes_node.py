"""The node agent of the Kubernetes export: pods 1..N-1 of a multi-node run.

::

    python -m acceptrun.backends.kubernetes_node --workspace /acceptrun --run-id RUN

Pod 0 runs the supervisor (``acceptrun run``); the other pods of the Indexed Job
(:mod:`acceptrun.backends.kubernetes`) run this. For each attempt the supervisor starts
(its ``attempt_start`` event in the record on the shared checkpoint volume), the agent
starts this node's torchrun with the same contract environment as pod 0's: run record,
attempt, checkpoint to resume from, and itself as the ranks' supervisor (a rank stops
when the agent dies). It ends that torchrun when the attempt's ``exit.json`` appears
(pod 0 ended the attempt), and exits 0 once the run is accepted.

SIGTERM (the pod's deletion: preemption, drain) is forwarded to torchrun: every rank
agrees to stop at the step boundary, checkpoints and exits; the supervisor classifies
the attempt ``preempted`` and starts the next one, which the replacement pod's agent
joins. The agent then exits 143.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from acceptrun.record.workspace import RunRecord

__all__ = ["main", "pending_attempt", "run_node"]

POLL_S = 2.0  # seconds between looks at the record: the supervisor starts attempts seconds apart


def pending_attempt(record: RunRecord, after: int) -> tuple[int, int | None] | None:
    """The newest attempt after ``after`` that the supervisor started and has not ended.

    Returns ``(attempt, resume_step)`` from its ``attempt_start`` event, or None.
    """
    # The supervisor makes attempts/<n>/ before it writes the event: look there first, so
    # that a node waiting between attempts does not re-read a long events.jsonl.
    started = [int(p.name) for p in record.path.glob("attempts/*") if p.name.isdigit()]
    if not started or max(started) <= after:
        return None
    newest: dict[str, Any] | None = None
    for event in record.events("attempt_start"):
        if int(event.get("attempt") or 0) > after:
            newest = event
    if newest is None:
        return None
    number = int(newest["attempt"])
    if record.exists(f"attempts/{number}/exit.json"):
        return None  # it ended before this node came: wait for the next one
    step = newest.get("resume_step")
    return number, None if step is None else int(step)


def run_node(
    workspace: Path,
    run_id: str,
    *,
    poll_s: float = POLL_S,
    say: Callable[[str], None] = print,
) -> int:
    """Join each attempt of ``run_id`` on this node until the run is accepted.

    The torchrun agent started here gets the same contract environment as pod 0's, with
    this process as its supervisor (a rank stops when it dies). SIGTERM (the pod's
    deletion) is forwarded to it: every rank agrees to stop, checkpoints and exits, and
    the supervisor on pod 0 classifies the attempt as preempted and restarts it.
    Returns 0 once the run is accepted, 143 after SIGTERM.
    """
    from acceptrun.checkpoint.owner import open_run_store
    from acceptrun.spec.model import load_spec
    from acceptrun.supervisor.process import contract_env
    from acceptrun.workload.distributed import launch_command

    record = RunRecord(Path(workspace) / "runs" / run_id)
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    last = 0
    while not stopping:
        state = record.read_json("run.json", {}) if record.path.exists() else {}
        if isinstance(state, dict) and state.get("verdict") == "accepted":
            say(f"acceptrun node: run {run_id} was accepted")
            return 0
        pending = pending_attempt(record, last)
        if pending is None:
            time.sleep(poll_s)
            continue
        attempt, step = pending
        spec = load_spec(record.spec_path)
        store = open_run_store(record, spec, retention=False)  # the run's own, owner checked
        ckpt_dir = store.root
        info = store.get(step) if step is not None else None
        # Rank 0 verifies and broadcasts the path it loads; the others need to know only
        # that there is one.
        resume = str(info.path) if info is not None else ""
        env = contract_env(
            os.environ, spec, record, attempt=attempt, resume_from=resume, checkpoint_dir=ckpt_dir
        )
        argv = launch_command(spec, env)
        say(f"acceptrun node: joining attempt {attempt} of run {run_id}")
        child = subprocess.Popen(argv, cwd=spec.workdir_path, env=env)
        while child.poll() is None:
            if record.exists(f"attempts/{attempt}/exit.json"):
                _end(child, float(spec.limits.grace_period))  # pod 0 ended the attempt
                break
            time.sleep(poll_s)
        say(f"acceptrun node: attempt {attempt} ended here with exit status {child.wait()}")
        last = attempt
    if child is not None:
        child.wait()
    return 143


def _end(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after the grace period: the attempt is over elsewhere."""
    child.terminate()
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m acceptrun.backends.kubernetes_node --workspace WS --run-id RUN``."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m acceptrun.backends.kubernetes_node",
        description="join each attempt of a run that the supervisor on pod 0 starts",
    )
    p.add_argument("--workspace", required=True, type=Path, help="the shared workspace")
    p.add_argument("--run-id", required=True, help="the run pod 0 supervises")
    args = p.parse_args(argv)
    return run_node(args.workspace, args.run_id)


if __name__ == "__main__":
    sys.exit(main())
