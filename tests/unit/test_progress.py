"""Progress of an unmodified script: step events from its log lines and TensorBoard files.

Every test runs a real ``acceptrun run`` on a script that never imports acceptrun.
"""

from __future__ import annotations


def test_match_line_reads_named_groups() -> None:
    import re

    from acceptrun.supervisor.progress import match_line

    pat = re.compile(r"step (?P<step>\d+)/(?P<total_steps>\d+) loss=(?P<loss>\S+) (?P<phase>\w+)")
    # total_steps is an int; a trailing comma is not part of a number; "train" is no value.
    assert match_line(pat, "step 3/10 loss=0.25, train") == {
        "step": 3,
        "total_steps": 10,
        "loss": 0.25,
    }
    assert match_line(pat, "nothing here") is None
    number = re.compile(r"iter (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)")
    assert str(match_line(number, "iter 4: loss nan")) == "{'step': 4, 'loss': nan}"
    assert match_line(number, "iter 5: loss -inf") == {"step": 5, "loss": float("-inf")}
    assert match_line(number, "inference iter 6: loss 1e-3") == {"step": 6, "loss": 0.001}
