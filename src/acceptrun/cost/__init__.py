"""What runs cost: the price catalog and the provider billing model.

- :mod:`~acceptrun.cost.catalog`: prices with their sources (packaged ``prices.toml``,
  overridable per workspace), the spec's price, budget checks, the ``prices`` table;
- :mod:`~acceptrun.cost.billing`: billed seconds (start rule, increments, minimums),
  compute and storage cost in USD.
"""

from __future__ import annotations

from acceptrun.cost.billing import (
    HOURS_PER_MONTH,
    billed_seconds,
    compute_cost,
    monthly_storage_cost,
    storage_cost,
)
from acceptrun.cost.catalog import (
    BILLING_MODES,
    START_RULES,
    Catalog,
    Price,
    check_budget,
    format_prices,
    load_catalog,
    price_for,
)

__all__ = [
    "BILLING_MODES",
    "HOURS_PER_MONTH",
    "START_RULES",
    "Catalog",
    "Price",
    "billed_seconds",
    "check_budget",
    "compute_cost",
    "format_prices",
    "load_catalog",
    "monthly_storage_cost",
    "price_for",
    "storage_cost",
]
