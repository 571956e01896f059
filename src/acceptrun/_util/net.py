"""Small network helpers."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` now ("" = every interface); whoever binds it next wins.

    For a rendezvous store or a benchmark's workers that bind it moments later: another
    process could take it in between, which the caller's bind then reports.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
