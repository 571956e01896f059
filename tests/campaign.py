"""Counts of the hostile-input campaign, for ``bench/chaos.py``.

The generative tests of docs/reliability.md ("Every input surface") call :func:`tally`
once per surface they exercise. In the suite it does nothing; with
``ACCEPTRUN_CAMPAIGN_LOG=FILE`` (set by ``bench/chaos.py``) each call appends one JSON line,
and the bench sums them into its rows: cases tried per surface, tracebacks, hangs (a
command past its bound), files touched outside the workdir, secrets found, files of the
user's overwritten. A test still asserts what it counts: the log only
reports it.

    tally("spec path fields", tried=len(cases), tracebacks=0, outside=0)
"""

from __future__ import annotations

import json
import os

__all__ = ["tally"]

# Read once, when the test modules are collected: the suite's autouse fixture removes every
# ACCEPTRUN_* variable from os.environ before each test runs.
_LOG = os.environ.get("ACCEPTRUN_CAMPAIGN_LOG")


def tally(
    surface: str,
    *,
    tried: int,
    tracebacks: int = 0,
    hangs: int = 0,
    outside: int = 0,
    secrets: int = 0,
    overwritten: int = 0,
) -> None:
    """Append one surface's counts to ``$ACCEPTRUN_CAMPAIGN_LOG`` when it is set."""
    if not _LOG:
        return
    line = json.dumps(
        {
            "surface": surface,
            "tried": tried,
            "tracebacks": tracebacks,
            "hangs": hangs,
            "outside": outside,
            "secrets": secrets,
            "overwritten": overwritten,
        }
    )
    with open(_LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")
