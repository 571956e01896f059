"""Rank processes of a worker script, started by hand (no torchrun), for the sharded tests.

``start_ranks(worker, mode, root, world, out)`` starts ``python WORKER MODE ROOT WORLD OUT
RANK`` for each rank (one thread each: OMP_NUM_THREADS=1); ``finish_ranks`` waits for all
of them, kills every one when the group overstays ``timeout`` (never leaving ranks behind)
and returns their exit codes and their output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT = 300  # seconds per group of ranks; generous for a loaded two-core machine


def start_ranks(
    worker: Path, mode: str, root: Path, world: int, out: Path
) -> list[subprocess.Popen[str]]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return [
        subprocess.Popen(
            [sys.executable, str(worker), mode, str(root), str(world), str(out), str(r)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]


def finish_ranks(
    procs: list[subprocess.Popen[str]], what: str, timeout: float = TIMEOUT
) -> tuple[list[int], str]:
    """Wait for every rank (killing all of them past ``timeout``); exit codes and output."""
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:  # never leave ranks behind
            p.kill()
            p.wait()
        pytest.fail(f"{what} did not finish in {timeout} s")
    return [p.returncode for p in procs], "\n".join(logs)
