"""Lost work is exact, bounded or unknown (record/lost.py), and an unknown is never 0."""

from __future__ import annotations

import pytest

from acceptrun.record.lost import LostWork, lost_work


@pytest.mark.parametrize(
    ("work", "steps", "seconds"),
    [
        ({"steps_lost": 40, "steps_lost_range": [40, 40], "seconds_lost": 80}, "40 steps", "1m20s"),
        ({"steps_lost": 1, "steps_lost_range": [1, 1]}, "1 step", "0.0s"),
        ({"steps_lost": 0, "steps_lost_range": [0, 499]}, "at most 499 steps", "0.0s"),
        ({"steps_lost": 100, "steps_lost_range": [100, 149]}, "between 100 and 149 steps", "0.0s"),
        ({"steps_lost": 0, "steps_lost_range": [0, None]}, "an unknown number of steps", "0.0s"),
        ({"steps_lost": 7, "lost_at_least": True, "seconds_lost": 5}, "at least 7 steps",
         "at least 5.0s"),
        ({"steps_lost": 9, "lost_at_most": True}, "at most 9 steps", "0.0s"),  # older record
        ({"steps_lost": 0, "steps_lost_range": [0, 0], "seconds_lost": 80,
          "seconds_lost_at_most": True}, "0 steps", "at most 1m20s"),
    ],
)  # fmt: skip
def test_each_form_of_the_figure(work: dict[str, object], steps: str, seconds: str) -> None:
    lost = LostWork.of_work(work)
    assert lost.steps_text() == steps
    assert lost.seconds_text() == seconds
    assert lost.text().startswith(f"{steps}, {seconds} (")


def test_a_sum_with_an_unknown_part_has_no_upper_bound() -> None:
    attempts = [
        {"outcome": "failed", "work": {"steps_lost": 5, "steps_lost_range": [5, 5]}},
        {"outcome": "failed", "work": {"steps_lost": 0, "steps_lost_range": [0, None]}},
        {"outcome": "success", "work": {"steps_lost": 99}},  # a success lost nothing
    ]
    total = lost_work(attempts)
    assert (total.low, total.high, total.steps_text()) == (5, None, "at least 5 steps")
    assert not total.exact and total.known
    assert lost_work([]).text() == "0 steps, 0.0s (0.0 device-s)"


def test_progress_unknown_after_a_step_is_said_and_kept_through_a_sum() -> None:
    """Lines dropped as unordered after step 40: no upper bound, and the step it ran from."""
    work = {"steps_lost": 7, "steps_lost_range": [7, None], "steps_unknown_after": 40}
    one = LostWork.of_work(work)
    assert one.steps_text() == "at least 7 steps (progress unknown after step 40)"
    both = one + LostWork.of_work({"steps_lost": 3, "steps_lost_range": [3, 3]})
    assert both.unknown_after == 40 and both.high is None
    assert both.to_dict()["steps_unknown_after"] == 40
    assert "progress unknown after step 40" in both.to_dict()["lost"]
