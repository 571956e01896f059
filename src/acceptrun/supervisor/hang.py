"""A hung workload: its stacks collected, then the attempt's group SIGKILLed.

A hung main thread never runs a Python signal handler, so a graceful stop would only burn
the grace period; the stacks say where it was stuck. SIGUSR2 asks the client's
faulthandler to write ``stacks.txt``; without an answer within 2 s, ``py-spy dump`` (when
installed) reads them from outside. Dumps land raw (faulthandler writes from C in the
workload's signal handler): each goes through the redactor before the record names it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from acceptrun._util.egress import redact_file
from acceptrun.record.workspace import RunRecord
from acceptrun.supervisor.process import ChildProcess
from acceptrun.workload.contract import STACKS_FILE

__all__ = ["stop_hung"]

FAULTHANDLER_WAIT_S = 2.0  # seconds the client's faulthandler has to write its stacks
PY_SPY_TIMEOUT_S = 20.0


def stop_hung(record: RunRecord, child: ChildProcess, adir: Path, attempt: int) -> None:
    """Collect the stacks of the attempt's workload into ``adir``, then SIGKILL its group."""
    stacks = adir / STACKS_FILE
    before = _size(stacks)
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signal.SIGUSR2)  # the client's faulthandler writes stacks.txt
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    while time.monotonic() < deadline and _size(stacks) == before:
        time.sleep(0.05)
    py_spy = shutil.which("py-spy")
    if _size(stacks) == before and py_spy:
        try:
            dump = subprocess.run(
                [py_spy, "dump", "--pid", str(child.pid)],
                capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S, check=False,
            )  # fmt: skip
            with open(stacks, "a") as f:  # redacted below, with the workload's dumps
                f.write(dump.stdout or dump.stderr)
        except (OSError, subprocess.TimeoutExpired):
            pass
    got = _size(stacks) > before
    for dump_file in adir.glob("stacks*.txt"):
        redact_file(dump_file)
    record.event("stacks", sync=True, attempt=attempt, path=str(stacks) if got else None)
    child.signal_group(signal.SIGKILL)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
