"""bench/serving_load.py runs at its tiny size and prints its figures (see test_benches.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import run_smoke


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_bench_serving_load_runs_at_tiny_size(tmp_path: Path) -> None:
    run_smoke("serving_load.py", tmp_path)
