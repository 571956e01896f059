"""Half the corpus's shapes (alternate ones) run for real, killed and resumed: corpus_runs.py."""

from __future__ import annotations

import pytest
from corpus_runs import SHAPES, check_shape

from conftest import Project


@pytest.mark.slow
@pytest.mark.parametrize("name", SHAPES[0::2])
def test_shape_killed_at_a_random_step_resumes_on_its_true_figures(
    project: Project, name: str
) -> None:
    check_shape(project, name)
