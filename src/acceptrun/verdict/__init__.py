"""The verdict: every check of a run against its spec, portability and run-to-run diffs.

>>> from acceptrun.verdict import compute_verdict, format_verdict
>>> print(format_verdict(compute_verdict(record)))
"""

from acceptrun.verdict.core import GROUPS, Check, Verdict, format_verdict
from acceptrun.verdict.decide import compute_verdict

__all__ = ["GROUPS", "Check", "Verdict", "compute_verdict", "format_verdict"]
