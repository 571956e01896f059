"""The batch-size search: the largest batch that fits, then the candidates worth timing.

Pure logic over a ``fits(batch_size) -> bool`` probe, so it is the same on a GPU (the
probe catches ``torch.OutOfMemoryError`` and empties the cache) and on a CPU (the probe
runs under an address-space limit and catches the allocator's failure). No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["SearchResult", "batch_candidates", "find_max_batch"]


@dataclass
class SearchResult:
    """The outcome of :func:`find_max_batch`."""

    max_batch: int
    """The largest batch size that fitted; 0 when not even ``start`` did."""
    probes: list[tuple[int, bool]] = field(default_factory=list)
    """Every batch size probed, in order, and whether it fitted."""
    capped: bool = False
    """True when ``limit`` fitted: the real boundary lies above the search range."""


def find_max_batch(
    fits: Callable[[int], bool], *, start: int = 1, limit: int = 4096, multiple: int = 1
) -> SearchResult:
    """Largest batch size in [start, limit] (a multiple of ``multiple`` above it) that fits.

    Doubles from ``start`` until a probe fails or ``limit`` is reached, then bisects
    between the last size that fitted and the first that did not. It assumes memory
    grows with the batch (if b does not fit, no larger b fits). Probes: about
    2 * log2(max_batch / start).

    >>> find_max_batch(lambda b: b <= 300, start=8).max_batch
    300
    """
    if start < 1 or limit < start or multiple < 1:
        raise ValueError(
            f"need 1 <= start <= limit and multiple >= 1, got {start}, {limit}, {multiple}"
        )
    result = SearchResult(max_batch=0)

    def probe(b: int) -> bool:
        ok = bool(fits(b))
        result.probes.append((b, ok))
        return ok

    if not probe(start):
        return result
    good = start
    bad: int | None = None
    while bad is None:
        nxt = min(good * 2, limit)
        if nxt == good:  # good == limit: everything asked for fits
            result.capped = True
            break
        if probe(nxt):
            good = nxt
        else:
            bad = nxt
    if bad is not None:
        # Bisect on multiples of `multiple` (tensor-core friendly sizes on a GPU).
        while True:
            mid = (good + bad) // 2
            mid -= mid % multiple
            if mid <= good:
                break
            if probe(mid):
                good = mid
            else:
                bad = mid
    result.max_batch = good
    return result


def batch_candidates(
    default: int, max_batch: int, *, count: int = 3, multiple: int = 1
) -> list[int]:
    """Batch sizes worth timing: ``max_batch``, then halvings, all above ``default``.

    The largest batch is not always the fastest (cache effects, padding to tile
    sizes, the allocator near its limit), hence a few sizes spread by factors of two.

    >>> batch_candidates(8, 300)
    [300, 150, 75]
    """
    out: list[int] = []
    b = max_batch
    while b > default and len(out) < count:
        rounded = b - b % multiple if b >= multiple and b != max_batch else b
        if rounded > default and rounded not in out:
            out.append(rounded)
        b //= 2
    return out
