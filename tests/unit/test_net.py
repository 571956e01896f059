"""free_port: a port outside the kernel's ephemeral range, free now, repeatable by seed."""

from __future__ import annotations

import socket

from acceptrun._util.net import ephemeral_range, free_port


def test_ports_come_from_outside_the_ephemeral_range_and_bind() -> None:
    low, high = ephemeral_range()
    for i in range(50):
        port = free_port("127.0.0.1", seed=f"run-a{i}")
        assert not low <= port <= high, (port, low, high)
        assert 10000 <= port <= 65535
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free, as said


def test_a_seed_gives_the_same_port_and_a_port_in_use_is_skipped() -> None:
    first = free_port("127.0.0.1", seed="run-a1")
    assert free_port("127.0.0.1", seed="run-a1") == first
    assert free_port("127.0.0.1", seed="run-a2") != first  # each attempt its own
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        other = free_port("127.0.0.1", seed="run-a1")
        assert other != first
        low, high = ephemeral_range()
        assert not low <= other <= high
