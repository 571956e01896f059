"""One meaning per word, one colour per part: record/glossary.py decides both for every view.

The parts come from their declarations (the ledger's PARTS, the time breakdown's parts
that ``show`` prints), so a part added tomorrow is covered here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from acceptrun.cost.ledger import PARTS
from acceptrun.record.glossary import MODEL_THROUGHPUT, WALL_THROUGHPUT, colour, label, tone
from acceptrun.report.svg import stacked_bar
from acceptrun.report.terminal import PART_NAMES

ALL_PARTS = sorted({*PARTS, *PART_NAMES})


def _fills(svg: str) -> dict[str, str]:
    """Each part's bar colour, by its name in the bar's tooltip."""
    return dict(
        (name, fill) for fill, name in re.findall(r'fill="(#[0-9a-f]{6})"><title>([^:<]+):', svg)
    )


@pytest.mark.parametrize("part", ALL_PARTS)
def test_a_part_wears_its_tones_colour_wherever_it_stands(part: str) -> None:
    """The report's cost bar and the board's spend bar list parts in other orders (the
    board adds storage): a part's colour is its tone's, never its position's."""
    others = [p for p in ALL_PARTS if p != part]
    first = _fills(stacked_bar([(part, 1.0), *((p, 1.0) for p in others)], title="a", unit=str))
    last = _fills(stacked_bar([("storage", 1.0), *((p, 1.0) for p in others), (part, 1.0)],
                              title="b", unit=str))  # fmt: skip
    assert first[part] == last[part] == colour(part)


def test_the_ledgers_idle_is_no_step_and_work_thrown_away_is_bad() -> None:
    assert label("idle") == "no step"  # billed time with no step; "idle" is the device's
    assert tone("wasted") == tone("restarts") == "bad"
    assert tone("productive") == tone("compute") == "good"
    assert tone("idle") == "watch" and colour("a part nobody named") is None
    legend = stacked_bar([("idle", 1.0), ("productive", 3.0)], title="t", unit=str)
    assert "no step" in legend and ">idle " not in legend


def test_a_batch_runs_two_throughputs_are_named_for_what_they_measure(tmp_path: Path) -> None:
    """A batch run showed "median 1493 samples/s" beside "164.1 items/s" with nothing
    saying one is model time and the other wall time over the attempts."""
    from acceptrun.inference.summary import batch_checks
    from acceptrun.record.workspace import Workspace
    from acceptrun.report.sections.inference import batch_lines
    from acceptrun.spec.model import parse_spec

    text = 'name = "b"\ncommand = ["python", "x.py"]\n[inference]\ninput = "in.jsonl"\n'
    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run("b", spec_text=text, state={"status": "finished"})
    summary = {"items": 10, "outputs": 10, "coverage": 1.0, "items_per_s": 164.1, "seconds": 2}
    record.write_json("inference.json", summary)
    (speed,) = [c for c in batch_checks(record, parse_spec(text)) if c[1] == "items/s"]
    assert speed[4].startswith(f"{WALL_THROUGHPUT} 164.1 items/s over the attempts"), speed
    assert any(f"{WALL_THROUGHPUT}: " in line for line in batch_lines(summary))
    assert MODEL_THROUGHPUT != WALL_THROUGHPUT
