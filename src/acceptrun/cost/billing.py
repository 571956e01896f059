"""The billing model: what a provider charges for a stretch of time or storage.

Timelines are unix seconds. Compute is billed from the start rule's moment (launch, or
the end of health checks), rounded up to the provider's increment, with a minimum::

    price = catalog.lookup("lambda", "gpu_1x_h100_sxm5")   # per minute, from health check
    seconds = billed_seconds(t_launch, t_terminate, price, health_check_s=90.0)
    usd = compute_cost(seconds, price)

Storage is billed per GiB-month in one-hour increments (Lambda filesystems), for as long
as the filesystem exists, mounted or not.
"""

from __future__ import annotations

import math

from acceptrun._util.units import format_bytes, format_usd
from acceptrun.cost.catalog import Price

__all__ = [
    "HOURS_PER_MONTH",
    "billed_seconds",
    "compute_cost",
    "format_bytes",
    "format_usd",
    "monthly_storage_cost",
    "storage_cost",
]

GIB = 1024**3  # bytes
# Hours in a billing month. Lambda's billing page works its filesystem example with 720 h
# (30 days: 1000 GiB for 24 h at 0.20 USD/GiB-month = 6.67 USD), not the 730 h average
# month, so the ledger matches the provider's own arithmetic.
HOURS_PER_MONTH = 720.0
# Float timestamps carry rounding noise (120.00000000001 s must not bill a third minute):
# a fraction of an increment below this is treated as exact.
_EPSILON = 1e-9


def _round_up(seconds: float, increment_s: float) -> float:
    """``seconds`` rounded up to a whole number of ``increment_s``."""
    return math.ceil(seconds / increment_s - _EPSILON) * increment_s


def billed_seconds(start: float, end: float, price: Price, *, health_check_s: float = 0.0) -> float:
    """Seconds billed for an instance launched at ``start`` and terminated at ``end``.

    Billing starts at ``start`` (start rule "launch") or ``start + health_check_s``
    ("health_check"); the billed time is rounded up to ``price.increment_s`` and is at
    least ``price.minimum_s`` when anything ran; 0 when ``end`` is not after the start.
    Example: per-minute billing, 61 s -> 120 s.
    """
    if health_check_s < 0:
        raise ValueError(f"health_check_s: {health_check_s!r} is not valid; expected 0 or more s")
    begin = start + health_check_s if price.start_rule == "health_check" else start
    ran = end - begin
    if ran <= 0:
        return 0.0
    return max(_round_up(ran, price.increment_s), price.minimum_s)


def compute_cost(seconds: float, price: Price) -> float:
    """USD for ``seconds`` of billed time (already rounded by :func:`billed_seconds`)."""
    return seconds / 3600.0 * price.price_per_hour


def storage_cost(
    bytes_: int, seconds: float, price_per_gib_month: float, *, increment_s: float = 3600.0
) -> float:
    """USD for ``bytes_`` kept ``seconds``, billed in ``increment_s`` steps (one hour).

    GiB x hours (rounded up to the increment) x USD per GiB-month / 720 h per month.
    Example: 1000 GiB for 24 h at 0.20 USD/GiB-month -> 6.67 USD.
    """
    if seconds <= 0 or bytes_ <= 0:
        return 0.0
    hours = _round_up(seconds, increment_s) / 3600.0
    return bytes_ / GIB * hours * price_per_gib_month / HOURS_PER_MONTH


def monthly_storage_cost(bytes_: int, price_per_gib_month: float) -> float:
    """USD for keeping ``bytes_`` for a whole month (720 h)."""
    return max(bytes_, 0) / GIB * price_per_gib_month
