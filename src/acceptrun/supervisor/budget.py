"""``limits.budget_usd`` for one supervisor: what the run has spent, a warning at each share
crossed, and the moment the stop must start.

The spend is billed as the provider bills it (acceptrun.cost.billing: per-second or
per-hour rounding, minimums) from the launch. The stop starts when the bill at the end of
the grace period (plus one poll) would pass the budget, so the checkpoint-then-exit still
fits inside it. One warning per share of ``notify.budget_fractions`` crossed (0.8 by
default), and one first when a stop starts below them all (a long grace period).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec

__all__ = ["BudgetWatch"]


class BudgetWatch:
    """The run's spend against ``limits.budget_usd`` (none without a price or a budget)."""

    def __init__(
        self,
        record: RunRecord,
        spec: RunSpec,
        *,
        price: Any,
        billing_start: float,
        lookahead_s: float,
        say: Callable[[str], None],
    ) -> None:
        self.record = record
        self.spec = spec
        self.price = price  # a cost.catalog.Price, or None
        self.billing_start = billing_start  # unix s: when billing started (the launch)
        self.lookahead_s = lookahead_s  # the grace period and one poll: the stop's length
        self.say = say
        self._crossed: set[float] = set()  # the shares of the budget warned of
        self._warned = False

    def spend(self, at: float | None = None) -> float | None:
        """Compute spend in USD by ``at`` (now), as the provider bills it; None without a price."""
        if self.price is None:
            return None
        from acceptrun.cost.billing import billed_seconds, compute_cost

        end = time.time() if at is None else at
        return compute_cost(billed_seconds(self.billing_start, end, self.price), self.price)

    def exhausted(self, attempt: int) -> str | None:
        """Warn at each share crossed; the reason to stop when the stop must start now."""
        budget = self.spec.limits.budget_usd
        if budget is None or self.price is None:
            return None
        spent = self.spend()
        assert spent is not None
        ahead = self.spend(time.time() + self.lookahead_s)
        stopping = ahead is not None and ahead > budget
        for fraction in sorted(set(self.spec.notify.budget_fractions)):
            crossed = spent >= fraction * budget or (stopping and not self._warned)
            if fraction in self._crossed or not crossed:
                continue
            self._crossed.add(fraction)
            self._warned = True
            self.record.event(
                "budget_warning", sync=True, attempt=attempt, spent_usd=round(spent, 4),
                budget_usd=budget, fraction=fraction,
            )  # fmt: skip
            self.say(
                f"budget: {spent:.2f} of {budget:.2f} USD spent ({100 * spent / budget:.0f}%, "
                f"past {100 * fraction:.0f}%)"
            )
        if not stopping:
            return None
        self.record.event(
            "budget_stop", sync=True, attempt=attempt, spent_usd=round(spent, 4), budget_usd=budget
        )
        return f"budget {budget:g} USD would be passed ({spent:.2f} USD spent, {self.price.label})"
