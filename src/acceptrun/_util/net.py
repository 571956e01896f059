"""Small network helpers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["ephemeral_range", "free_port"]

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below this, ports that well-known services listen on are too common
_TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (bind to 0, connect); Linux's default."""
    try:
        low, high = (int(w) for w in _RANGE_FILE.read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "", seed: str | None = None) -> int:
    """A TCP port free on ``host`` now ("" = every interface), for a bind moments later.

    The port is taken from outside the kernel's ephemeral range. A port from inside it
    (what binding port 0 gives) can be handed by the kernel to any other socket in the
    seconds before the caller binds it: srun's own listening sockets took a rendezvous
    port that way, and torchrun's agents then spoke to srun. Outside the range only an
    explicit bind can take it. ``seed`` (a run and attempt) makes the choice repeatable;
    each candidate is bound here first, so a port in use is skipped. Where the range
    leaves no room (a kernel set to hand out nearly every port), the kernel picks.
    """
    low, high = ephemeral_range()
    candidates = [(_LOWEST, low - 1), (high + 1, 65535)]
    spans = [(a, b) for a, b in candidates if b >= a]
    size = sum(b - a + 1 for a, b in spans)
    rng = random.Random(seed)  # None: seeded from the OS
    for _ in range(_TRIES if size else 0):
        k = rng.randrange(size)
        for a, b in spans:
            if k <= b - a:
                port = a + k
                break
            k -= b - a + 1
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
