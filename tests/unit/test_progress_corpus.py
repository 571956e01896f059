"""The printed progress of widely used training scripts, read right (tests/corpus/shapes/).

Each recorded log is fed to a :class:`ProgressReader` as a workload prints it: in chunks
cut at random bytes (deterministic seeds), a poll after each. For every shape the step
events' steps equal the recorded truth, strictly increasing, none dropped, with every
recorded loss at its true step; and the same holds when the script is killed at a
random line and resumed from the last epoch (or step) before it, whose attempt 2 reads
on the run's axis without being offset. Shapes are enumerated from the corpus folder, so
a shape added there is covered here.
"""

from __future__ import annotations

import itertools
import random
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from tests.builders import RecordBuilder

from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import parse_spec
from acceptrun.supervisor.axis import StepAxis
from acceptrun.supervisor.progress import ProgressReader
from campaign import tally

CORPUS = Path(__file__).parents[1] / "corpus" / "shapes"
SHAPES = sorted(p.stem for p in CORPUS.glob("*.toml"))


def _resumable(name: str) -> bool:
    """Whether a script of this shape can resume past its first step line (not all can:
    a log of one epoch has no resume point after its first line)."""
    meta = tomllib.loads((CORPUS / f"{name}.toml").read_text())
    return any(i > meta["truth"][0][0] for i in meta["resume_lines"])


RESUMABLE = [name for name in SHAPES if _resumable(name)]
_PIECE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def _load(name: str) -> tuple[dict[str, Any], list[bytes]]:
    meta = tomllib.loads((CORPUS / f"{name}.toml").read_text())
    # The log's lines with their endings, indexed as the reader splits them.
    pieces = [p for p in _PIECE.findall((CORPUS / f"{name}.log").read_bytes()) if p.strip(b"\r\n")]
    return meta, pieces


def _spec(meta: dict[str, Any]) -> Any:
    return parse_spec(
        tomli_w.dumps({"name": "corpus", "command": ["x"], "progress": meta["progress"]})
    )


def _feed(reader: ProgressReader, out: Path, data: bytes, rng: random.Random) -> None:
    """Append ``data`` in chunks cut at random bytes, a poll after each, then the last poll."""
    at = 0
    while at < len(data):
        cut = min(len(data), at + rng.randint(1, 400))
        with open(out, "ab") as f:
            f.write(data[at:cut])
        reader.poll()
        at = cut
    reader.poll(final=True)


def _attempt(
    tmp: Path, record: RunRecord, meta: dict[str, Any], data: bytes, attempt: int,
    resume_step: int | None, rng: random.Random,
) -> list[dict[str, Any]]:  # fmt: skip
    out, err = tmp / f"stdout{attempt}.log", tmp / f"stderr{attempt}.log"
    out.touch()
    axis = StepAxis(attempt, resume_step, lambda kind, f: record.event(kind, attempt=attempt, **f))
    reader = ProgressReader(record, _spec(meta), attempt, out, err, axis=axis)
    _feed(reader, out, data, rng)
    return [e for e in record.events("step") if e["attempt"] == attempt]


def _check(steps: list[dict[str, Any]], truth: list[list[Any]]) -> None:
    got = [e["step"] for e in steps]
    assert got == [s for _i, s, _l in truth], got
    assert all(a < b for a, b in itertools.pairwise(got))
    for event, (_i, step, loss) in zip(steps, truth, strict=True):
        assert event["loss"] == pytest.approx(loss, abs=5e-5), (step, event)


def _quiet(record: RunRecord, meta: dict[str, Any]) -> None:
    """No counter went back unexplained: nothing restarted within an attempt, nothing dropped.

    A resumed script that prints no epoch (a bare per-epoch bar) counts its batches from
    the start of the epoch again: the axis offsets it by the resumed step, and says so.
    """
    warnings = list(record.events("progress_warning"))
    assert warnings == [], warnings
    restarted = list(record.events("step_counter_restarted"))
    if re.search(r"\(\?P<(epoch|step)>", meta["progress"]["pattern"]):
        assert restarted == [], restarted
    else:
        assert all(e["attempt"] == 2 and e["offset"] == e["resumed_from"] for e in restarted)


def test_most_shapes_are_killed_and_resumed_too() -> None:
    # The shapes left out of the resume test are named here, not skipped in silence.
    assert len(RESUMABLE) >= 15, sorted(set(SHAPES) - set(RESUMABLE))


def test_the_corpus_holds_fifteen_shapes_or_more() -> None:
    assert len(SHAPES) >= 15, SHAPES
    for name in SHAPES:
        assert (CORPUS / f"{name}.log").is_file(), name


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_is_read_at_its_true_steps(tmp_path: Path, name: str) -> None:
    meta, pieces = _load(name)
    record = RecordBuilder(tmp_path).record
    steps = _attempt(tmp_path, record, meta, b"".join(pieces), 1, None, random.Random(name))
    _check(steps, meta["truth"])
    _quiet(record, meta)
    tally(f"progress-corpus:{name}", tried=len(meta["truth"]))


@pytest.mark.parametrize("name", RESUMABLE)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_shape_killed_and_resumed_is_read_at_its_true_steps(
    tmp_path: Path, name: str, seed: int
) -> None:
    meta, pieces = _load(name)
    rng = random.Random(f"{name}/{seed}")
    truth = meta["truth"]
    # Killed at a random step line past the first resume point; resumed from the last
    # resume point before it, whose step is the save's: the step line just before it.
    starts = [i for i in meta["resume_lines"] if i > truth[0][0]]
    resume_line = rng.choice(starts)
    kill_line = rng.randint(resume_line, truth[-1][0])
    saved = max(s for i, s, _l in truth if i < resume_line)
    record = RecordBuilder(tmp_path).record
    one = _attempt(tmp_path, record, meta, b"".join(pieces[: kill_line + 1]), 1, None, rng)
    _check(one, [t for t in truth if t[0] <= kill_line])
    two = _attempt(tmp_path, record, meta, b"".join(pieces[resume_line:]), 2, saved, rng)
    _check(two, [t for t in truth if t[0] >= resume_line])
    _quiet(record, meta)
    tally(f"progress-corpus-resumed:{name}", tried=len(one) + len(two))
