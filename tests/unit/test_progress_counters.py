"""Progress of an unmodified script: step lines and epoch counters read into one monotone
step (no process)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from tests.builders import RecordBuilder

from acceptrun.errors import SpecError
from acceptrun.spec.model import parse_spec
from acceptrun.supervisor.process import Arrivals
from acceptrun.supervisor.progress import ProgressReader, _LogTail


def test_match_line_reads_named_groups() -> None:
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


# ---- a step axis for any counter (supervisor/counter.py) ----------------------------------

IMAGENET = r"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<batch>\d+)/(?P<total>\d+)\]\tLoss (?P<loss>\S+)"


def _reader(tmp_path: Path, progress: dict[str, Any]) -> tuple[ProgressReader, Path]:
    record = RecordBuilder(tmp_path).run().record  # run.json too: show reads it
    text = tomli_w.dumps({"name": "t", "command": ["x"], "progress": progress})
    out = tmp_path / "stdout.log"
    out.touch()
    return ProgressReader(record, parse_spec(text), 1, out, tmp_path / "stderr.log"), out


def _read(reader: ProgressReader, out: Path, lines: list[str]) -> list[dict[str, Any]]:
    """Each line written then polled, as a workload prints them; the steps it wrote."""
    for line in lines:
        with open(out, "a") as f:
            f.write(line + "\n")
        reader.poll()
    reader.poll(final=True)
    return list(reader.record.events("step"))


def _imagenet_lines() -> list[tuple[int, str]]:
    """200 steps in 4 epochs of 50 batches, a line every 5: (true step, line)."""
    return [
        (e * 50 + b, f"Epoch: [{e}][{b:>3}/50]\tLoss {1.0 / (1 + e * 50 + b):.6f}")
        for e in range(4)
        for b in range(0, 50, 5)
    ]


def test_an_epoch_counter_keeps_every_line(tmp_path: Path) -> None:
    # Was: 10 of 40 lines kept (the batch counter going back each epoch was dropped).
    reader, out = _reader(tmp_path, {"pattern": IMAGENET})
    steps = _read(reader, out, [line for _s, line in _imagenet_lines()])
    assert len(steps) == len(_imagenet_lines()) == 40


def test_an_epoch_counter_gives_the_runs_last_step(tmp_path: Path) -> None:
    # Was: "last step 46" (the first epoch's) for a run of 200 steps.
    reader, out = _reader(tmp_path, {"pattern": IMAGENET})
    truth = _imagenet_lines()
    _read(reader, out, [line for _s, line in truth])
    assert reader.last_step == truth[-1][0] == 195


def test_an_epoch_counters_loss_curve_holds_every_loss_at_its_step(tmp_path: Path) -> None:
    # Was: the loss chart ended in the first epoch (step 45 of 195).
    reader, out = _reader(tmp_path, {"pattern": IMAGENET})
    truth = _imagenet_lines()
    steps = _read(reader, out, [line for _s, line in truth])
    curve = [(e["step"], e["loss"]) for e in steps]
    assert curve == [(s, float(line.rsplit(" ", 1)[1])) for s, line in truth]


def test_an_epoch_line_sets_the_epoch_of_the_batch_lines_after_it(tmp_path: Path) -> None:
    pattern = (
        r"^Epoch (?P<epoch>\d+)/\d+$|^\s*(?P<batch>\d+)/(?P<total>\d+) \[.*loss: (?P<loss>\S+)"
    )
    reader, out = _reader(tmp_path, {"pattern": pattern, "first_epoch": 1})
    lines = []
    for e in (1, 2):
        lines.append(f"Epoch {e}/2")
        lines += [f"{b}/4 [===>..] - loss: 0.{e}{b}" for b in range(1, 5)]
    assert [e["step"] for e in _read(reader, out, lines)] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_fraction_of_epochs_is_a_step_with_the_epoch_length(tmp_path: Path) -> None:
    pattern = r"\{'loss': (?P<loss>[0-9.]+),.*'epoch': (?P<epoch>[0-9.]+)\}"
    reader, out = _reader(tmp_path, {"pattern": pattern, "epoch_length": 40})
    lines = [f"{{'loss': 0.5, 'learning_rate': 5e-05, 'epoch': {x}}}" for x in (0.25, 0.5, 1.0)]
    assert [e["step"] for e in _read(reader, out, lines)] == [10, 20, 40]


def test_a_counter_that_starts_again_is_offset_and_said_once(tmp_path: Path) -> None:
    # A global-looking step pattern on a counter that restarts each epoch: every line is
    # kept, after the last one, and one warning names the key that makes them exact.
    reader, out = _reader(tmp_path, {"pattern": r"iter: (?P<step>\d+) loss (?P<loss>\S+)"})
    lines = [f"iter: {b} loss 0.5" for _e in range(3) for b in range(0, 50, 10)]
    steps = [e["step"] for e in _read(reader, out, lines)]
    assert len(steps) == 15 and steps == sorted(set(steps))
    assert steps[:6] == [0, 10, 20, 30, 40, 41]  # at least the true step (50): a lower bound
    (warning,) = reader.record.events("progress_warning")
    assert warning["reason"] == "restarted"
    assert "from 40 to 0" in warning["message"]
    assert "progress.epoch_length (about 50 by these lines)" in warning["message"]


def test_a_counter_with_an_epoch_length_counts_its_epochs(tmp_path: Path) -> None:
    reader, out = _reader(
        tmp_path, {"pattern": r"iter: (?P<step>\d+) loss (?P<loss>\S+)", "epoch_length": 50}
    )
    lines = [f"iter: {b} loss 0.5" for _e in range(3) for b in range(0, 50, 10)]
    steps = [e["step"] for e in _read(reader, out, lines)]
    assert steps == [e * 50 + b for e in range(3) for b in range(0, 50, 10)]
    assert list(reader.record.events("progress_warning")) == []


def test_an_unordered_counter_is_dropped_counted_and_said(tmp_path: Path) -> None:
    # Two counters read by one pattern (train steps and an eval loop's): the eval lines go
    # back to the middle of the count, cannot be ordered, and are counted, not hidden.
    reader, out = _reader(tmp_path, {"pattern": r"step (?P<step>\d+) loss (?P<loss>\S+)"})
    lines = ["step 0 loss 1", "step 100 loss 1", "step 200 loss 1", "step 150 loss 2",
             "step 300 loss 1", "step 160 loss 2", "step 400 loss 1"]  # fmt: skip
    steps = [e["step"] for e in _read(reader, out, lines)]
    assert steps == [0, 100, 200, 300, 400]
    warnings = {w["reason"]: w for w in reader.record.events("progress_warning")}
    assert set(warnings) == {"unordered", "dropped"}
    assert "unknown" in warnings["unordered"]["message"]
    assert warnings["dropped"]["dropped"] == 2


@pytest.mark.parametrize(
    ("pattern", "fix"),
    [
        (r"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<batch>\d+)", "progress.epoch_length"),
        (r"\| (?P<batch>\d+) \|", "(?P<total>"),
        (r"'epoch': (?P<epoch>[0-9.]+)", "progress.epoch_length"),
    ],
)
def test_spec_says_which_key_reads_a_counted_shape(pattern: str, fix: str) -> None:
    text = tomli_w.dumps({"name": "t", "command": ["x"], "progress": {"pattern": pattern}})
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert "progress.pattern" in str(err.value) and fix in str(err.value)
    fixed = {"pattern": pattern, "epoch_length": 50}
    parse_spec(tomli_w.dumps({"name": "t", "command": ["x"], "progress": fixed}))


def test_match_line_reads_an_epoch_and_a_batch() -> None:
    from acceptrun.supervisor.progress import match_line

    rx = re.compile(IMAGENET)
    assert match_line(rx, "Epoch: [2][ 30/50]\tLoss 0.25") == {
        "epoch": 2.0, "batch": 30, "total": 50, "loss": 0.25,
    }  # fmt: skip
    assert match_line(rx, "Epoch: [x][ 30/50]\tLoss 0.25") is None


def test_show_names_a_counter_that_went_back(tmp_path: Path) -> None:
    from acceptrun.report.terminal import format_show

    reader, out = _reader(tmp_path, {"pattern": r"step (?P<step>\d+) loss (?P<loss>\S+)"})
    _read(reader, out, [f"step {n} loss 1" for n in (0, 10, 20, 30, 25, 40)])
    shown = format_show(reader.record)
    assert "progress attempt 1: progress: the step counter went back from 30 to 25" in shown
    assert "progress attempt 1: progress.pattern: 1 step lines of attempt 1 were dropped" in shown


# ---- when a line arrived: what a watched save is dated by (supervisor/external.py) -------


def _tee(out: Path, arrivals: Arrivals, chunk: bytes, t: float) -> None:
    """One chunk as the output tee writes it: appended, then noted with its read time."""
    with arrivals.lock, open(out, "ab") as f:
        f.write(chunk)
        arrivals.note(f.tell(), t)


def test_each_line_carries_the_time_its_last_byte_arrived(tmp_path: Path) -> None:
    out, arrivals = tmp_path / "stdout.log", Arrivals()
    out.touch()
    tail = _LogTail(out, 0, arrivals)
    _tee(out, arrivals, b"step 1\nstep", 100.0)  # a line cut in two by the pipe
    assert tail.lines() == [("step 1", 100.0)]
    _tee(out, arrivals, b" 2\r50%|###\rstep 3\n", 200.0)
    assert tail.lines() == [("step 2", 200.0), ("50%|###", 200.0), ("step 3", 200.0)]
    _tee(out, arrivals, b"unfinished", 300.0)
    assert tail.lines() == [] and tail.lines(final=True) == [("unfinished", 300.0)]


def test_a_save_is_dated_by_the_lines_that_arrived_before_it(tmp_path: Path) -> None:
    """A line read before the file's mtime counts, whatever its event's time; one that
    arrived after it does not, even when the reader matched both in one poll."""
    reader, out = _reader(tmp_path, {"pattern": r"step (?P<step>\d+)"})
    arrivals = Arrivals()
    reader._tails[0].arrivals = arrivals
    _tee(out, arrivals, b"step 1\n", 1000.0)
    _tee(out, arrivals, b"step 2\n", 1010.0)  # the save at 1005 comes between the two
    reader.poll()
    assert [e["step"] for e in reader.steps_before(1005.0, wait_s=0)] == [1]
    assert [e["step"] for e in reader.steps_before(1010.0, wait_s=0)] == [1, 2]
    # Matched in one poll, both events share the poll's time: only the arrival tells them.
    assert {e["source"] for e in reader.recent_steps()} == {"log"}


def test_dating_waits_for_the_lines_that_arrived_before_the_save(tmp_path: Path) -> None:
    """A save whose line is not matched yet waits for the reader's next poll (a thread
    here, as in a run), then is dated by it: not by the step before."""
    reader, out = _reader(tmp_path, {"pattern": r"step (?P<step>\d+)"})
    arrivals = Arrivals()
    reader._tails[0].arrivals = arrivals
    _tee(out, arrivals, b"step 1\n", 1.0)
    reader.poll()
    _tee(out, arrivals, b"step 2\n", 2.0)
    saved = arrivals.read_time()  # the file's mtime: after line 2 arrived
    reader.start()
    try:
        assert [e["step"] for e in reader.steps_before(saved, wait_s=60)] == [1, 2]
    finally:
        reader.stop()
