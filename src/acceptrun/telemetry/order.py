"""Exact order statistics of step times, in memory that does not grow with the steps.

The step log holds step times as whole microseconds (record/steplog.py), so a run's
steady step times are a multiset of integers: :class:`Hist` keeps each distinct value
once with its count. Its size is the run's spread of step times in microseconds (a
100 ms step with 5 ms of jitter: about 10^4 values, 160 KB), not its number of steps, so
the summary of 10^7 steps holds what the summary of 10^6 held. Every percentile, median
and mean read from it is exact: the k-th value divided by 10^6 is the very float64 the
step log's reader decodes (``k / 1e6``).

:class:`ArrayOrder` gives the same figures from an array of float64 seconds, for the
few records whose step times are not whole microseconds (a format-1 record written by
hand): it holds every value.

>>> h = Hist()
>>> h.add(np.array([30, 10, 20, 20], dtype=np.int64))
>>> h.values.tolist(), h.counts.tolist(), h.kth(3)
([10, 20, 30], [1, 2, 1], 30)
>>> median(HistOrder(h)), HistOrder(h).mean()
(2e-05, 2e-05)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

__all__ = ["ArrayOrder", "Hist", "HistOrder", "Order", "median", "quantile", "whole_us"]

US = 1_000_000
_DENSE = 1 << 20  # a chunk whose values span less is counted with bincount, not sorted


def whole_us(seconds: Any) -> Any:
    """``seconds`` (finite) in whole microseconds as int64, or None when one is not: then
    ``k / 1e6`` is the very float each held, so sums and order statistics of the integers
    are those of the floats."""
    us = np.rint(seconds * 1e6)
    if not bool(np.all((us / 1e6 == seconds) & (np.abs(us) < 2**53))):
        return None
    return us.astype(np.int64)


class Hist:
    """A multiset of integers (microseconds): each distinct value once, with its count."""

    def __init__(self) -> None:
        self._values = np.empty(0, dtype=np.int64)
        self._counts = np.empty(0, dtype=np.int64)
        self._pending: list[tuple[Any, Any]] = []
        self._pending_size = 0
        self._cum: Any = None

    def add(self, us: Any) -> None:
        """Add an int64 array of values."""
        if not us.size:
            return
        lo, hi = int(us.min()), int(us.max())
        if hi - lo < _DENSE:
            c = np.bincount(us - lo)
            nz = np.flatnonzero(c)
            v, c = nz.astype(np.int64) + lo, c[nz].astype(np.int64)
        else:
            v, c = np.unique(us, return_counts=True)
        self._pending.append((v, c))
        self._pending_size += int(v.size)
        self._cum = None
        if self._pending_size > max(1 << 18, int(self._values.size)):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        vs = np.concatenate([self._values, *(v for v, _c in self._pending)])
        cs = np.concatenate([self._counts, *(c for _v, c in self._pending)])
        self._pending, self._pending_size = [], 0
        values, inverse = np.unique(vs, return_inverse=True)
        counts = np.zeros(values.size, dtype=np.int64)
        np.add.at(counts, inverse, cs)
        self._values, self._counts = values, counts

    @property
    def values(self) -> Any:
        """The distinct values, ascending (int64)."""
        self._merge()
        return self._values

    @property
    def counts(self) -> Any:
        """How many times each of :attr:`values` was added (int64)."""
        self._merge()
        return self._counts

    @property
    def n(self) -> int:
        self._merge()
        return int(self._counts.sum())

    def kth(self, r: int) -> int:
        """The r-th smallest value (0-based)."""
        self._merge()
        if self._cum is None:
            self._cum = np.cumsum(self._counts)
        return int(self._values[int(np.searchsorted(self._cum, r, side="right"))])

    def total(self) -> int:
        """The exact sum of the values."""
        self._merge()
        if not self._values.size:
            return 0
        big = max(abs(int(self._values.min())), abs(int(self._values.max())))
        if big * max(1, int(self._counts.sum())) < 2**62:
            return int(np.dot(self._values, self._counts))
        return sum(int(v) * int(c) for v, c in zip(self._values, self._counts, strict=True))

    def with_values(self, us: Any) -> Hist:
        """A copy with the values of ``us`` (int64) added."""
        self._merge()
        out = Hist()
        out._values, out._counts = self._values.copy(), self._counts.copy()
        out.add(us)
        return out

    @property
    def nbytes(self) -> int:
        return int(self._values.nbytes + self._counts.nbytes)


class Order(Protocol):
    """The order statistics of step times, in seconds."""

    @property
    def n(self) -> int: ...

    def kth(self, r: int) -> float: ...

    def mean(self) -> float: ...


class HistOrder:
    """Order statistics of a :class:`Hist` of microseconds, in seconds."""

    def __init__(self, hist: Hist) -> None:
        self.hist = hist
        self.n = hist.n

    def kth(self, r: int) -> float:
        return self.hist.kth(r) / 1e6

    def mean(self) -> float:
        """The exact mean of the microseconds, correctly rounded to seconds."""
        return float(Fraction(self.hist.total(), self.n * US))


class ArrayOrder:
    """Order statistics of float64 seconds (partitioned in place: the order is spent)."""

    def __init__(self, seconds: Any) -> None:
        self.a = seconds
        self.n = int(seconds.size)
        self._at: set[int] = set()

    def prepare(self, ranks: list[int]) -> None:
        """Partition once at every rank that will be read."""
        self.a.partition(ranks)
        self._at = set(ranks)

    def kth(self, r: int) -> float:
        if r not in self._at:
            self.prepare([r])
        return float(self.a[r])

    def mean(self) -> float:
        return math.fsum(self.a) / self.n


def quantile(order: Order, q: float) -> float:
    """Linear interpolation between the order statistics around ``q * (n - 1)``."""
    n = order.n
    if n == 1:
        return order.kth(0)
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    a, b = order.kth(lo), order.kth(hi)
    return a + (b - a) * (pos - lo)


def median(order: Order) -> float:
    """statistics.median of the values."""
    n = order.n
    m = n // 2
    if n % 2:
        return order.kth(m)
    return (order.kth(m - 1) + order.kth(m)) / 2


def ranks(n: int, qs: tuple[float, ...]) -> list[int]:
    """The ranks :func:`quantile` reads for each of ``qs``."""
    out: set[int] = set()
    for q in qs:
        lo = math.floor(q * (n - 1))
        out |= {lo, min(lo + 1, n - 1)}
    return sorted(out)
