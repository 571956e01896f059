"""Batch inference runs: every input item gets exactly one output, through kills and ranks.

Real ``acceptrun run`` processes run a small labelling workload over a text file: once
uninterrupted (the reference), and again SIGKILLed by the test at random moments after
shard commits (the supervisor restarts it; committed shards are skipped, a half-written
one is redone), which must end with byte-identical output shards. Also: failed items
listed with their errors, the coverage and error-rate checks rejecting a run, a
half-written shard left on disk never counting, two ranks without overlap, and the input
forms (text, JSONL with an id field, a directory, an fsspec URL).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun.errors import SpecError, UserError
from acceptrun.inference.summary import percentile
from acceptrun.spec.model import parse_spec
from acceptrun.workload.items import iter_items, iter_shards

# ---- the input and the spec (no process) -----------------------------------------------------


def test_inputs_text_jsonl_directory_and_url(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text('{"key": "x", "t": 1}\n\n{"key": "y", "t": 2}\n')
    (tmp_path / "d" / "b.txt").write_text("third\nfourth\n")
    (tmp_path / "d" / ".hidden").write_text("not an item\n")
    items = list(iter_items(str(tmp_path / "d")))
    assert [(i.id, i.value) for i in items] == [
        (0, {"key": "x", "t": 1}),
        (1, {"key": "y", "t": 2}),
        (2, "third"),
        (3, "fourth"),
    ]
    keyed = list(iter_items(str(tmp_path / "d" / "a.jsonl"), id_field="key"))
    assert [i.id for i in keyed] == ["x", "y"]
    url = list(iter_items(f"file://{tmp_path / 'd'}"))
    assert [i.value for i in url] == [i.value for i in items]
    shards = list(iter_shards(str(tmp_path / "d"), 3))
    assert [len(s.items) for s in shards] == [3, 1]
    assert shards[0].input_hash != shards[1].input_hash


def test_input_errors_name_the_line_and_the_fix(tmp_path: Path) -> None:
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"key": 1}\n{"key": 1}\n')
    with pytest.raises(UserError, match=r"dup.jsonl:2 is not unique"):
        list(iter_items(str(dup), id_field="key"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(UserError, match=r'bad.jsonl:2 is not JSON.*format = "text"'):
        list(iter_items(str(bad)))
    with pytest.raises(UserError, match="does not exist"):
        list(iter_items(str(tmp_path / "nothing.txt")))


def test_inference_section_validation() -> None:
    base = 'name = "t"\ncommand = ["python", "x.py"]\n'
    spec = parse_spec(base)
    assert not spec.inference.enabled
    spec = parse_spec(base + '[inference]\ninput = "in.jsonl"\nmax_error_rate = 0.01\n')
    assert spec.inference.enabled and spec.inference.min_coverage == 1.0
    with pytest.raises(SpecError, match=r"inference\.input"):
        parse_spec(base + "[inference]\nshard_size = 10\n")
    with pytest.raises(SpecError, match=r"inference\.shard_size: 0"):
        parse_spec(base + '[inference]\ninput = "x"\nshard_size = 0\n')
    with pytest.raises(SpecError, match=r"inference\.max_error_rate: 2\.0"):
        parse_spec(base + '[inference]\ninput = "x"\nmax_error_rate = 2\n')


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (
        50.0,
        90.0,
        99.0,
    )
    assert percentile([], 50) is None
