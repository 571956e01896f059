"""The integration tier: tests that start real processes, run in parallel by pytest-xdist.

`make test` runs this folder with ``-n <workers> --dist loadgroup``. A module-scoped
fixture (a trained reference run, a Slurm cluster, a shared workspace) is set up once per
worker that runs a test of its module, so the tests that use one are kept on one worker:
each gets the ``xdist_group`` of its module. Everything else is spread test by test.
Session-scoped fixtures (the S3 server) are per worker and bind free ports.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
        if "module" in scopes and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
