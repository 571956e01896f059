"""A multi-node attempt as one Slurm job step: signal translation around srun and torchrun.

A spec with ``resources.nodes = N > 1`` runs inside an allocation of N nodes (``acceptrun
submit --backend slurm``). The supervisor, on the first node, starts::

    python -m acceptrun.workload.slurm_step srun -- srun --nodes N --ntasks-per-node 1 ... \\
        python -m acceptrun.workload.slurm_step task -- python -m torch.distributed.run \\
            --nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...

so every attempt (and every restart after a node failure) is a new srun step inside the
same allocation. Two small wrappers carry the supervisor's graceful stop to every rank:

- ``srun`` side: srun answers SIGTERM, SIGINT, SIGHUP and SIGQUIT by SIGKILLing the whole
  step ("forcing job termination"), which would lose the checkpoint a stop is for; it
  forwards SIGUSR1 and SIGUSR2 unchanged. This wrapper turns the supervisor's stop
  signals into one SIGUSR1 to srun, and passes SIGUSR2 (dump stacks) on.
- ``task`` side (one per node): turns that SIGUSR1 back into SIGTERM to torchrun's agent,
  which forwards it to its ranks (``PET_SIGNALS_TO_HANDLE``). slurmstepd delivers a
  forwarded signal to every process of the step, not only to this wrapper, so torchrun
  and the ranks are started with SIGUSR1 ignored (its default action would end them
  before they checkpoint); they get the stop as SIGTERM, from here. It also writes one
  line to stderr when torchrun ends: the node, the task, and how torchrun ended. With
  srun's own ``srun: error: NODE: task I: ...`` lines that is the per-node evidence the
  supervisor classifies (``node_lost``, supervisor/classify.py).

A wrapper whose child was killed by a signal dies of the same signal, so srun reports the
task as Slurm would without it. The supervisor's SIGKILL (a stop past its grace period)
reaches both wrapper and srun (one process group); srun's death ends the step on every
node. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import types

__all__ = ["NODE_LINE", "main"]

# The line each node's wrapper writes when torchrun ends, e.g.
# "acceptrun-node: node=n2 task=1 torchrun killed by SIGKILL" (classify reads it).
NODE_LINE = "acceptrun-node:"
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def main(argv: list[str] | None = None) -> int:
    """``slurm_step srun -- ARGV`` or ``slurm_step task -- ARGV``: run ARGV, translate signals."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] not in ("srun", "task") or args[1] != "--":
        print(
            "usage: python -m acceptrun.workload.slurm_step {srun|task} -- COMMAND [ARGS...] "
            f"(got {args!r}); acceptrun starts this itself for resources.nodes > 1",
            file=sys.stderr,
        )
        return 2
    role, command = args[0], args[2:]
    try:
        # The task side: torchrun and its ranks inherit SIGUSR1 ignored (see above).
        child = subprocess.Popen(command, preexec_fn=_ignore_usr1 if role == "task" else None)
    except OSError as exc:
        print(f"acceptrun: could not start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    if role == "srun":
        _forward_as(child, {s: signal.SIGUSR1 for s in _STOPS} | {signal.SIGUSR2: signal.SIGUSR2})
    else:
        _forward_as(
            child,
            {signal.SIGUSR1: signal.SIGTERM, signal.SIGUSR2: signal.SIGUSR2}
            | {s: s for s in _STOPS},
        )
    rc = _wait(child)
    if role == "task":
        node = os.environ.get("SLURMD_NODENAME", "?")
        task = os.environ.get("SLURM_PROCID", "?")
        how = f"killed by {_name(-rc)}" if rc < 0 else f"exited {rc}"
        print(f"{NODE_LINE} node={node} task={task} torchrun {how}", file=sys.stderr, flush=True)
    if rc < 0:
        # Die of the same signal: srun then reports this task as it would report torchrun.
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


def _forward_as(
    child: subprocess.Popen[bytes], table: dict[signal.Signals, signal.Signals]
) -> None:
    """Handlers that send ``table[received]`` to ``child``; a stop goes on once only."""
    sent: set[signal.Signals] = set()

    def handler(signum: int, frame: types.FrameType | None) -> None:
        out = table[signal.Signals(signum)]
        if out in (signal.SIGUSR1, signal.SIGTERM) and out in sent:
            return  # srun and torchrun take one stop; a repeat could escalate to a kill
        sent.add(out)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(out)

    for received in table:
        signal.signal(received, handler)


def _ignore_usr1() -> None:
    """In the child before exec: an ignored signal stays ignored across exec and fork."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _wait(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return child.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


if __name__ == "__main__":
    sys.exit(main())
