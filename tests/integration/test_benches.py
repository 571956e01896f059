"""Every bench script runs, at tiny sizes, and prints its figures.

A benchmark that only runs on the day its figures are taken breaks unnoticed (a bench file
named like a standard-library module once shadowed ``queue`` for every script in bench/).
Each script in bench/ is listed in bench_smoke.SMOKE with arguments that make it small; a
new script without an entry fails :func:`test_every_bench_script_has_a_smoke_entry`. The
longest (bench_smoke.HEAVY) run from test files of their own (test_bench_<name>.py). These runs
prove the scripts work, not their figures: the figures come from the full sizes, on a
quiet machine (the scripts' docstrings say how).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import BENCH, HEAVY, SMOKE, run_smoke


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_bench_script_has_a_smoke_entry() -> None:
    missing = [name for name in _scripts() if name not in SMOKE]
    assert not missing, f"add tiny arguments for {missing} to SMOKE in bench_smoke.py"
    gone = [name for name in SMOKE if not (BENCH / name).exists()]
    assert not gone, f"SMOKE lists scripts that no longer exist: {gone}"
    here = Path(__file__).parent
    for script in HEAVY:
        own = here / f"test_bench_{script.removesuffix('.py')}.py"
        assert own.exists(), f"{script} is in HEAVY but has no test file {own.name}"


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a campaign at tiny size still starts dozens of processes
@pytest.mark.parametrize("script", sorted(set(SMOKE) - set(HEAVY)))
def test_bench_script_runs_at_tiny_size(script: str, tmp_path: Path) -> None:
    run_smoke(script, tmp_path)
