"""Patterns a user writes run on RE2, in time linear in the input; what RE2 lacks is refused.

The fields are read off the spec declaration (every field of format "regex"), the refused
constructs off the helper's own table (_util/userregex.UNSUPPORTED), so a field or a
construct added tomorrow is covered here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from tests.builders import RecordBuilder

from acceptrun._util.userregex import (
    MAX_PROGRAM,
    UNSUPPORTED,
    compile_user_pattern,
    pattern_problem,
    program_size,
)
from acceptrun.errors import SpecError
from acceptrun.record.workspace import RunRecord
from acceptrun.spec import model
from acceptrun.spec.fields import rules_of
from acceptrun.spec.model import parse_spec
from acceptrun.supervisor import progress
from acceptrun.supervisor.progress import ProgressReader, _LogTail, match_line
from conftest import wait_for


def _regex_fields() -> list[str]:
    """``section.field`` of every spec field declared with format "regex"."""
    out = []
    for section in dataclasses.fields(model.RunSpec):
        cls = getattr(model, str(section.type), section.type)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            out += [
                f"{section.name}.{f.name}"
                for f in dataclasses.fields(cls)
                if rules_of(f).format == "regex"
            ]
    return out


REGEX_FIELDS = _regex_fields()
# Constructs refused by their shape rather than by a table row: (pattern, its name).
BY_SHAPE = [
    (r"(?P<q>a)iter (?P<step>\d+)\1", r"backreference \1"),
    (r"(?x) iter (?P<step>\d+)", "inline flag (?x)"),
    (r"(?a)iter (?P<step>\w+)", "inline flag (?a)"),
    (r"(?u)iter (?P<step>\w+)", "inline flag (?u)"),
    (r"(?L)iter (?P<step>\w+)", "inline flag (?L)"),
]
CONSTRUCTS = [(example, name) for _text, name, _fix, example in UNSUPPORTED] + BY_SHAPE


def test_the_declaration_has_regex_fields() -> None:
    assert {"progress.pattern", "serving.ready_log"} <= set(REGEX_FIELDS)


@pytest.mark.parametrize("field", REGEX_FIELDS)
@pytest.mark.parametrize(("pattern", "construct"), CONSTRUCTS, ids=[c for _, c in CONSTRUCTS])
def test_a_construct_re2_lacks_is_refused_naming_the_field_and_the_construct(
    field: str, pattern: str, construct: str
) -> None:
    section, name = field.split(".")
    text = f'name = "t"\ncommand = ["x"]\n[{section}]\n{name} = {json.dumps(pattern)}\n'
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    message = str(info.value)
    assert f"{field}: {pattern!r}" in message, message
    assert construct in message and "RE2, a linear-time engine" in message, message
    with pytest.raises(SpecError, match=re.escape(field)):
        compile_user_pattern(pattern, where=field)


@pytest.mark.parametrize(("pattern", "construct"), CONSTRUCTS, ids=[c for _, c in CONSTRUCTS])
def test_each_refusal_says_how_to_do_without_the_construct(pattern: str, construct: str) -> None:
    problem = pattern_problem(pattern)
    assert problem is not None and problem.count(";") == 1, problem
    assert problem.split("; ")[1].strip(), problem  # the fix


def test_a_refused_pattern_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    for pattern, _ in CONSTRUCTS:
        assert pattern_problem(pattern) is not None
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # RE2's C++ logging is off


def test_a_syntax_error_keeps_re2s_words_and_names_the_engine() -> None:
    problem = pattern_problem("iter (?P<step>\\d+")
    assert problem is not None and problem.startswith("missing )"), problem
    assert "https://github.com/google/re2/wiki/Syntax" in problem


def test_a_pattern_too_large_to_match_a_line_quickly_is_refused_with_its_size() -> None:
    # The size is read off the RE2 object the wrapper keeps: a release that hides it
    # would let any size through, so this fails first.
    small = program_size(compile_user_pattern(r"iter (?P<step>\d+)", where="t"))
    assert small is not None and 0 < small < 100
    assert program_size(compile_user_pattern(r"\p{L}+ (?P<step>\d+)", where="t")) < MAX_PROGRAM
    problem = pattern_problem(r"(?P<step>\d*)([a-z]+.?){1000}y")
    assert problem is not None and "13,008 instructions" in problem, problem
    assert f"over {MAX_PROGRAM:,}" in problem and "fewer times" in problem, problem


# Catastrophic backtracking on Python's re; each runs in linear time on RE2, or is refused.
CATASTROPHIC = [
    r"(x+x+)+y",
    r"(a|aa)+$",
    r"(a*)*b",
    r"(.*a){20}",
    r"^(\w+\s?)*$",
    r"(a+)+$",
    r"([a-zA-Z]+)*$",
    r"(\d+\.?)+x",
    r"^(([a-z])+.)+[A-Z]([a-z])+$",
    r"(a|a?)+b",
    r"(.*,){12}x",
    r"^(a+)+(?=b)",  # refused: lookahead
    r"(\w+)\1+$",  # refused: backreference
    r"(?>a+)+b",  # refused: atomic group
]
HOSTILE = 64 * 1024  # characters of hostile input: forever on a backtracking engine (40 do)


def _hostile_units(pattern: str) -> list[str]:
    """Inputs a backtracking engine fails slowly on: its literals, repeated, and generic ones."""
    literal = "".join(sorted({c for c in pattern if c.isalnum() or c in " ,."}))
    return list(dict.fromkeys(["a", "x", "a ", literal[:1] or "a", literal or "a"]))


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_pattern_is_refused_or_runs_on_re2(pattern: str) -> None:
    """Refused, or compiled on RE2 (linear in the input by construction) and done with a
    64 KiB of the input that makes a backtracking engine run for ever. No timing here: the
    linear pace is bench/hostile_output.py's figure (a timed ratio read 4x as 16x on a
    loaded machine, where a 4 MiB input falls out of the CPU's caches)."""
    problem = pattern_problem(pattern)
    if problem is not None:
        assert "is not supported" in problem, problem
        return
    rx = compile_user_pattern(pattern, where="progress.pattern")
    assert type(rx).__module__.startswith("re2"), type(rx)
    for unit in _hostile_units(pattern):
        hostile = (unit * (HOSTILE // len(unit) + 1))[:HOSTILE] + "!"
        rx.search(hostile)  # returns: a backtracking engine would not, within the suite


def test_named_groups_read_the_same_on_re2_and_re() -> None:
    pat = r"step (?P<step>\d+)/(?P<total_steps>\d+) loss=(?P<loss>\S+) (?P<phase>\w+)"
    line = "step 3/10 loss=0.25, train"
    expected = {"step": 3, "total_steps": 10, "loss": 0.25}
    assert match_line(compile_user_pattern(pat, where="t"), line) == expected
    assert match_line(re.compile(pat), line) == expected
    # Spans are in characters, not UTF-8 bytes: text before the step holds non-ASCII.
    rx = compile_user_pattern(r"itér (?P<step>\d+): loss (?P<loss>[0-9.eE+-]+)", where="t")
    values = match_line(rx, "é→ itér 12: loss nan")  # the zeroed line's spans read the real one
    assert values is not None and values["step"] == 12 and math.isnan(values["loss"])


def test_unicode_digits_are_no_step_on_re2() -> None:
    # Python's \d matches "٣" (ARABIC-INDIC DIGIT THREE), RE2's does not: docs/spec.md.
    rx = compile_user_pattern(r"iter (?P<step>\d+)", where="t")
    assert match_line(rx, "iter ٣") is None and match_line(rx, "iter 3") == {"step": 3}


def test_a_log_read_is_bounded_and_skips_what_it_cannot_keep_up_with(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "stdout.log"
    line = b"iter 7: loss 0.5\n"
    count = 3 * progress.READ_MAX // len(line)
    log.write_bytes(line * count)
    tail = _LogTail(log)
    lines = tail.lines()
    # The newest READ_MAX bytes, less the head of the line they start inside.
    assert len(lines) in (progress.READ_MAX // len(line), progress.READ_MAX // len(line) - 1)
    assert {text for text, _arrived in lines} == {"iter 7: loss 0.5"}
    unread = (count - len(lines)) * len(line)
    assert unread - len(b"\n") <= tail.skipped <= unread  # the bytes of lines never read
    assert tail.offset == log.stat().st_size and tail.lines() == []


def test_a_line_that_never_ends_is_cut_and_holds_no_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "stdout.log"
    with open(log, "wb") as f:
        for _ in range(8):  # 8 MiB without a line break, in reads of READ_MAX
            f.write(b"x" * progress.READ_MAX)
    tail = _LogTail(log)
    got = tail.lines()
    assert got == [] and tail.partial == b"" and tail.cut  # a skipped line's tail: no line
    with open(log, "ab") as f:
        f.write(b"x" * 100 + b"\niter 3: loss 1\n" + b"y" * (progress._MAX_LINE + 10))
    got = tail.lines()
    assert [text for text, _arrived in got] == ["iter 3: loss 1", "y" * progress._MAX_LINE]
    assert tail.partial == b""


def test_a_poll_matches_within_its_budget_and_leaves_the_rest_for_the_next(
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    record: RunRecord = RecordBuilder(tmp_path).record
    spec = parse_spec(
        'name = "t"\ncommand = ["x"]\n[progress]\npattern = "iter (?P<step>\\\\d+)"\n'
    )
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    reader = ProgressReader(record, spec, 1, out, err)
    out.write_text("".join(f"iter {i}\n" for i in range(1, 6)))
    monkeypatch.setattr(progress, "POLL_BUDGET_S", 0.0)  # spent after the first line
    for step in range(1, 6):  # one line each poll: the reader moves on, however slow
        reader.poll()
        assert reader.last_step == step
    monkeypatch.setattr(progress, "FINAL_BUDGET_S", 0.0)
    out.write_text(out.read_text() + "iter 6\niter 7\niter 8\n")
    reader.poll(final=True)  # the rest is dropped, and a warning says so
    assert reader.last_step == 6
    warnings = [e["message"] for e in record.events("progress_warning")]
    assert any("2 lines of stdout.log were not matched" in w for w in warnings), warnings


def test_the_reader_thread_reads_steps_until_stopped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    record: RunRecord = RecordBuilder(tmp_path).record
    spec = parse_spec(
        'name = "t"\ncommand = ["x"]\n[progress]\npattern = "iter (?P<step>\\\\d+)"\n'
    )
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    reader = ProgressReader(record, spec, 1, out, err)
    reader.start()
    try:
        out.write_text("iter 1\niter 2\niter 3\n")
        wait_for(lambda: reader.last_step == 3, 30, what="step 3 read on the reader's thread")
    finally:
        assert reader.stop()  # the thread ended within its hang guard
    assert reader._thread is not None and not reader._thread.is_alive()
    assert [e["step"] for e in record.events("step")] == [1, 2, 3]
