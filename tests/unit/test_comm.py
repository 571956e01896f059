"""acceptrun bench comm: all-reduce bandwidth with real gloo processes on loopback."""

from __future__ import annotations

import pytest

from acceptrun.tune.comm import busbw


def test_busbw_is_nccl_tests_definition() -> None:
    # busbw = algbw * 2(n-1)/n: equal to algbw on 2 ranks, 1.5x on 4, 0 on 1
    assert busbw(10.0, 2) == 10.0
    assert busbw(10.0, 4) == 15.0
    assert busbw(10.0, 1) == 0.0
    assert busbw(8.0, 8) == pytest.approx(14.0)
