"""The ``>>>`` examples in the docstrings run, and say what they show.

Modules whose examples need no process run here; the client's example records a
standalone run (provenance runs git), so it runs with the integration tests
(tests/integration/test_client_doctest.py). Every module of the workload and supervisor
layers with a ``>>>`` example is in one of the two lists: a new example is run, or it
is written as a literal block (``::``), which is not.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import acceptrun

UNIT = [
    "acceptrun._util.egress",
    "acceptrun._util.redact",
    "acceptrun._util.secret_shapes",
    "acceptrun.workload.aggregates",
    "acceptrun.workload.contract",
    "acceptrun.workload.inject",
    "acceptrun.supervisor.stops",
    "acceptrun.supervisor.classify",
    "acceptrun.supervisor.progress",
    "acceptrun.telemetry.idle",
    "acceptrun.telemetry.order",
]
INTEGRATION = ["acceptrun.run.standalone"]  # tests/integration/test_client_doctest.py
CHECKED_PACKAGES = ("workload",)  # every example in these is in UNIT or INTEGRATION


@pytest.mark.parametrize("name", UNIT)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True)
    assert result.attempted > 0, f"{name} has no >>> example; take it off the list"
    assert result.failed == 0, f"{result.failed} example(s) of {name} failed (printed above)"


def test_every_example_of_the_checked_packages_is_run() -> None:
    root = Path(acceptrun.__file__).parent
    with_examples = {
        "acceptrun." + ".".join(path.relative_to(root).with_suffix("").parts)
        for package in CHECKED_PACKAGES
        for path in (root / package).rglob("*.py")
        if ">>> " in path.read_text()
    }
    assert sorted(with_examples - set(UNIT) - set(INTEGRATION)) == []
