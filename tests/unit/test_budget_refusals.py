"""Budgets refused before launch: less than one billing increment, an unknown instance with
its near matches (the graceful stop of a real run: tests/integration/test_budget.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun.errors import UserError
from acceptrun.run.launch import launch
from budget_job import make


def test_budget_below_one_increment_is_refused_before_launch(tmp_path: Path) -> None:
    spec, ws = make(tmp_path, "budget_usd = 0.5", cost="price_per_hour = 3600.0")
    with pytest.raises(UserError, match="budget"):
        launch(spec, workspace=ws, echo=False)
    assert not list((ws / "runs").iterdir())


def test_unknown_instance_lists_near_matches(tmp_path: Path) -> None:
    spec, ws = make(tmp_path, "", cost='provider = "lambda"\ninstance = "gpu_1x_h100_sxn5"')
    with pytest.raises(UserError, match="gpu_1x_h100_sxm5"):
        launch(spec, workspace=ws, echo=False)
