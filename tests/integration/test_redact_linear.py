"""Every redaction pattern runs in time linear in its input: megabyte inputs built from the
patterns' own literals end in a child process within a hang guard.

The guard (60 s for all inputs together) is no speed target: one input takes well under a
second where the redactor is linear, and hours where a pattern backtracks quadratically
(a 200 KB environment value once kept the close spinning for minutes).
"""

from __future__ import annotations

import subprocess
import sys

from tests.campaign import tally

MB = 1 << 20
# Each is repeated to a megabyte: the literals the patterns anchor on, and near-misses.
UNITS = ["a", "a://", "://a", "--token ", "key=", "@", "-a", "a.", "a=", "x:", "key: ",
         'token="', "Bearer ", " ", "=", "-", '"', "://@", "a@", "?sig=", "&", "+a.b_c"]  # fmt: skip
CHILD = """
import sys, time
from acceptrun._util.redact import redact_text, secrets_in
MB = int(sys.argv[1])
for unit in sys.argv[2:]:
    text = unit * (MB // len(unit))
    t0 = time.perf_counter()
    redact_text(text, secrets=("SEKRIT0xyz",))
    secrets_in(text)
    print(repr(unit), round(len(text) / (time.perf_counter() - t0) / 1e6, 1), "MB/s")
"""


def test_each_pattern_is_linear_on_megabyte_inputs() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(MB), *UNITS], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == len(UNITS), proc.stdout
    tally("redaction regexes on megabyte inputs", tried=len(UNITS))
