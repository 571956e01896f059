"""Injected faults the supervisor fires itself (``acceptrun run --inject``).

The workload's client fires its own step faults; the supervisor fires those a script
cannot: a time fault (``kill@time=30s``: SIGKILL or SIGTERM once the attempt has run that
long) for any command, and a black box's ``kill``/``term@step=N``, sent when the progress
reader has seen step N (the script may be a step or two further by then) and, for
``:after=checkpoint``, once the attempt's first checkpoint was captured. Each is a
``fault_injected`` event; the signal goes as an outside event would (``signal_stop``: the
command's process, or its group), never as a stop request.

``rdzv@attempt=K`` is fired as attempt K starts (:func:`rendezvous_fault`): acceptrun's own
one-node torchrun command meets at a c10d endpoint on a loopback port held by a
listener thread of the supervisor that accepts and closes every connection, with a
short store read timeout (``RDZV_READ_TIMEOUT_S``), so torchrun's agent fails with a
``RendezvousConnectionError`` before any rank starts; the listener is closed when the
attempt ends (:func:`close_rendezvous`). The other attempts keep ``--standalone``.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.workload.contract import ENV_ATTEMPT, ENV_INJECT, ENV_RUN_ID

__all__ = [
    "RDZV_READ_TIMEOUT_S",
    "black_box_step_faults",
    "close_rendezvous",
    "fire_step_faults",
    "fire_time_fault",
    "rendezvous_fault",
    "time_faults",
]

SignalStop = Callable[[int], None]  # sends a signal to the attempt, as an outside event would
# Seconds torchrun's c10d store waits on a read before the agent gives up: the refused
# rendezvous then ends the attempt in seconds (torch's default is 60).
RDZV_READ_TIMEOUT_S = 3
_LISTENERS: dict[tuple[str, str], _Refuser] = {}  # (run id, attempt) -> its listener


def time_faults(env: Mapping[str, str], attempt: int) -> list[Any]:
    """Injected faults with a time (``kill@time=30s``): fired by the supervisor itself."""
    text = env.get(ENV_INJECT)
    if not text:
        return []
    from acceptrun.workload import inject

    return inject.time_faults(inject.parse_faults(text), attempt)


def black_box_step_faults(env: Mapping[str, str], attempt: int) -> list[Any]:
    """Injected ``kill``/``term`` step faults, which the supervisor fires for a black box."""
    text = env.get(ENV_INJECT)
    if not text:
        return []
    from acceptrun.workload import inject

    return [f for f in inject.faults_for_attempt(text, attempt) if f.action in ("kill", "term")]


def fire_time_fault(record: RunRecord, attempt: int, fault: Any, signal_stop: SignalStop) -> None:
    """A time fault is due: record it and send its signal."""
    record.event(
        "fault_injected", sync=True, attempt=attempt, action=fault.action, after_s=fault.after_s
    )
    signal_stop(_signal_of(fault))


def fire_step_faults(
    record: RunRecord,
    attempt: int,
    faults: list[Any],
    last_step: int | None,
    checkpoint: int | None,
    signal_stop: SignalStop,
) -> str | None:
    """Fire the black box's step faults now due (taken out of ``faults``).

    ``checkpoint`` is the step of the attempt's newest commit, None before one. Returns
    the fault fired (its text, as the attempt's exit reason names it), None for none.
    """
    from acceptrun.workload.inject import due_after_checkpoint

    if last_step is None:
        return None
    fired = None
    for fault in [f for f in faults if due_after_checkpoint(f, last_step, checkpoint)]:
        faults.remove(fault)
        record.event(
            "fault_injected", sync=True, attempt=attempt, action=fault.action,
            step=fault.step, seen_step=last_step, by="supervisor",
        )  # fmt: skip
        signal_stop(_signal_of(fault))
        fired = str(fault).removesuffix(f":attempt={fault.attempt}")
    return fired


def _signal_of(fault: Any) -> int:
    return signal.SIGKILL if fault.action == "kill" else signal.SIGTERM


class _Refuser:
    """A loopback TCP listener that accepts each connection and closes it at once.

    torchrun's c10d store client connects, reads nothing and fails: the rendezvous is
    refused at the protocol, not by a closed port (which a client may wait on to open).
    """

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))  # held from now until close(): nobody else gets it
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, name="acceptrun-rdzv", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # not connected: nothing to shut down
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() on Linux
        self.sock.close()
        self.thread.join(timeout=5)


def rendezvous_fault(
    record: RunRecord, spec: Any, env: Mapping[str, str], argv: list[str]
) -> list[str]:
    """The attempt's argv: with an ``rdzv`` fault for it, meeting at a refusing listener.

    ``env`` is the attempt's environment (its injected faults, run id and attempt);
    ``argv`` the command :func:`acceptrun.workload.distributed.launch_command` built. An
    attempt without the fault, or a spec whose torchrun command acceptrun does not build
    (records nothing: the fault never fires), keeps ``argv``.
    """
    text = env.get(ENV_INJECT)
    attempt = int(env.get(ENV_ATTEMPT) or 1)
    if not text or not any(f.action == "rdzv" for f in _faults_of(text, attempt)):
        return argv
    from acceptrun.workload.distributed import builds_torchrun, with_rendezvous

    if builds_torchrun(spec) is not None:
        return argv
    key = (env.get(ENV_RUN_ID) or "", str(attempt))
    close_rendezvous(env)  # a command built twice for one attempt: one listener
    listener = _Refuser()
    _LISTENERS[key] = listener
    endpoint = f"127.0.0.1:{listener.port}"
    command = with_rendezvous(argv, endpoint, f"{key[0] or 'run'}-a{attempt}", RDZV_READ_TIMEOUT_S)
    record.event("fault_injected", sync=True, attempt=attempt, action="rdzv", by="supervisor")
    return command


def close_rendezvous(env: Mapping[str, str]) -> None:
    """The attempt has ended: close its refusing listener, if it had one."""
    key = (env.get(ENV_RUN_ID) or "", str(int(env.get(ENV_ATTEMPT) or 1)))
    listener = _LISTENERS.pop(key, None)
    if listener is not None:
        listener.close()


def _faults_of(text: str, attempt: int) -> list[Any]:
    from acceptrun.workload import inject

    return [f for f in inject.parse_faults(text) if f.attempt == attempt]
