"""Control characters are shown as text, never acted on (_util/controls.py).

Generated from the declarations: every character of ``CONTROLS`` through the escaper, the
CLI's stream and the live echo (whole and split at every byte); every field of the spec
whose format is a name or a line with every control and bidi character, refused by
``spec check`` with the field, the character's code point and name.
"""

from __future__ import annotations

import dataclasses
import io
import os
import select
import typing
import unicodedata
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import tomli_w

from acceptrun._util.console import RedactingStream, raw_binary, styled
from acceptrun._util.controls import BIDI, CONTROLS, LiveEcho, control_named, escape_controls
from acceptrun.cli.main import main
from acceptrun.errors import SpecError
from acceptrun.spec.fields import FORMATS, fields_of, rules_of
from acceptrun.spec.model import RunSpec, parse_spec
from campaign import tally

# Bytes no terminal may see raw from a value: C0 but newline and tab, DEL, C1 in UTF-8.
RAW_BAD = [c for c in CONTROLS if c not in BIDI]


def _acted_on(text: str) -> list[str]:
    """The characters of ``text`` a terminal or a browser would act on."""
    return [c for c in text if c in CONTROLS and c != "\r"] + (
        ["\r"] if "\r" in text.replace("\r\n", "") else []
    )


@pytest.mark.parametrize("char", list(CONTROLS), ids=lambda c: f"U+{ord(c):04X}")
def test_every_control_character_is_shown_escaped(char: str) -> None:
    text = f"loss{char}ok"
    shown = escape_controls(text)
    assert _acted_on(shown) == []
    expected = f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    assert shown == f"loss{expected}ok"
    assert control_named(text) is not None and control_named(text).startswith(f"U+{ord(char):04X} ")


def test_newline_tab_and_a_crlf_line_end_stay_as_they_are() -> None:
    text = "a\tb\nc\r\n"
    assert escape_controls(text) == text
    assert escape_controls("50%\r100%") == "50%\\x0d100%"  # a bare \r rewrites the line


def test_a_name_is_named_by_code_point_and_unicode_name() -> None:
    assert control_named("bert\u202etxt") == "U+202E RIGHT-TO-LEFT OVERRIDE"
    assert control_named("a\x1bb") == "U+001B ESCAPE"
    assert control_named("a\nb") == "U+000A LINE FEED"
    assert control_named("bert-squad ünï 模型") is None


def _stream(escape: bool = True) -> tuple[RedactingStream, io.TextIOWrapper]:
    raw = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
    return RedactingStream(raw, escape=escape), raw


def _written(raw: io.TextIOWrapper) -> str:
    raw.flush()
    return raw.buffer.getvalue().decode("utf-8", errors="surrogateescape")  # type: ignore[attr-defined]


HOSTILE = (
    "boom \x1b]0;pwned\x07 \x1b]52;c;aGVsbG8=\x07 \x1b[2J\x1b[H \x1bP+q\x1b\\ \x1b_apc\x1b\\"
    " \x1b^pm\x1b\\ \x1bXsos\x1b\\ \x9b31m \x9d0;t\x9c \u202eexe.txt \u2066x\u2069 \x1b[6n\x07"
)


def test_the_cli_stream_escapes_every_line_it_prints() -> None:
    out, raw = _stream()
    print("verdict: RuntimeError:", HOSTILE, file=out)
    print("no newline at the end", HOSTILE, end="", file=out)
    out.flush()
    text = _written(raw)
    assert _acted_on(text) == [], repr(text)
    assert "\\x1b]0;pwned\\x07" in text and "\\u202eexe.txt" in text and "\\x9b31m" in text
    tally("terminal and board", tried=2 * len(HOSTILE))


def test_a_styled_stream_keeps_acceptrun_s_own_colours() -> None:
    out, raw = _stream()
    styled(out).write("\x1b[1mbold\x1b[0m\n")  # type: ignore[arg-type]
    assert _written(raw) == "\x1b[1mbold\x1b[0m\n"


def test_raw_binary_is_the_buffer_past_the_stream() -> None:
    out, raw = _stream()
    raw_binary(out).write(b"\x1b]0;mine\x07\n")  # type: ignore[arg-type]
    assert _written(raw) == "\x1b]0;mine\x07\n"


# What a progress bar or a coloured log writes: passes the live echo byte for byte.
PROGRESS = (
    b"epoch 1:  10%|\xe2\x96\x88         | 1/10 [00:01<00:09]\r"
    b"epoch 1: 100%|\xe2\x96\x88\xe2\x96\x88| 10/10\n"
    b"\x1b[A\x1b[2K\x1b[1A\x1b[K\x1b[J\x1b[0J\x1b[?25l\x1b[?25h\x1b[10D\x1b[3G\b"
    b"\x1b[32mINFO\x1b[0m \x1b[1;38;5;196mred\x1b[0m \xff\xfe undecodable\n"
)


def _echo(chunks: list[bytes]) -> bytes:
    sink = io.BytesIO()
    echo = LiveEcho(sink)
    for chunk in chunks:
        echo.write(chunk)
    echo.finish()
    return sink.getvalue()


def _splits(data: bytes) -> list[list[bytes]]:
    """``data`` whole, and cut in two at every byte."""
    return [[data]] + [[data[:i], data[i:]] for i in range(1, len(data))]


def test_the_live_echo_passes_progress_bars_and_colours() -> None:
    cases = _splits(PROGRESS)
    for chunks in cases:
        assert _echo(chunks) == PROGRESS, chunks
    tally("terminal and board", tried=len(cases))


def test_the_live_echo_escapes_titles_clipboard_strings_c1_and_bidi() -> None:
    data = HOSTILE.encode() + b" \x9b2J raw-c1 \x9d0;t\x07"
    whole = _echo([data])
    cases = _splits(data)
    for chunks in cases:
        assert _echo(chunks) == whole, chunks
    text = whole.decode("utf-8", errors="surrogateescape")
    assert _acted_on(text) == [], repr(text)
    assert not any(0x80 <= b <= 0x9F for b in text.encode("utf-8", errors="surrogateescape")
                   if b not in text.encode("utf-8"))  # fmt: skip
    assert "\\x1b]52;c;aGVsbG8=\\x07" in text and "\\x1b[2J" in text and "\\x1b[6n" in text
    assert "\\x9b2J raw-c1" in text and "\\u202eexe.txt" in text
    tally("terminal and board", tried=len(cases))


def _read_line(fd: int) -> bytes:
    """What a pty's leader gives up to a line's end: one read may return only part of it."""
    got = b""
    while not got.endswith(b"\r\n"):
        ready, _, _ = select.select([fd], [], [], 60.0)  # a hang guard, not a pace
        assert ready, f"no line's end on the terminal after {got!r}"
        got += os.read(fd, 4096)
    return got


def test_acceptrun_s_next_line_resets_the_colours_a_workload_left_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LiveEcho, "dirty", False)  # process-wide: no other test's terminal
    leader, follower = os.openpty()
    try:
        with open(follower, "w", encoding="utf-8", closefd=False) as tty:
            out = RedactingStream(tty)  # type: ignore[arg-type]
            echo = out.buffer  # one per workload pipe, as the supervisor's tee holds it
            echo.write(b"\x1b[8m\x1b[?25lconcealed")  # an unfinished line: its word held
            echo.finish()  # the pipe closed: written
            print("REJECTED", file=out)
            out.flush()
            got = _read_line(leader)
            assert got.endswith(b"\x1b[0m\x1b[?25hREJECTED\r\n"), got
            print("again", file=out)  # reset once: nothing left on
            out.flush()
            assert _read_line(leader) == b"again\r\n"
    finally:
        os.close(leader)
        os.close(follower)


# ---- spec: names --------------------------------------------------------------------------------

_NAME_FORMATS = {"name", "line"}


def _name_fields() -> list[tuple[str, str, Any]]:
    """(section, field, type) of every spec field whose format is a name or a line."""
    out = []
    hints = typing.get_type_hints(RunSpec)
    sections: list[tuple[str, type]] = [("", RunSpec)] + [
        (n, hints[n]) for n in fields_of(RunSpec) if dataclasses.is_dataclass(hints[n])
    ]
    for section, cls in sections:
        cls_hints = typing.get_type_hints(cls)
        for name, f in fields_of(cls).items():
            if rules_of(f).format in _NAME_FORMATS:
                out.append((section, name, cls_hints[name]))
    return out


NAME_FIELDS = [pytest.param(*f, id=f"{f[0]}.{f[1]}".lstrip(".")) for f in _name_fields()]


def test_the_names_include_the_run_name_and_its_kin() -> None:
    found = {f"{s}.{n}".lstrip(".") for s, n, _ in _name_fields()}
    assert {"name", "description", "cost.provider", "slurm.partition"} <= found, found
    assert all(FORMATS[f].check("bert\u202e") for f in _NAME_FORMATS)


def _spec_with(section: str, name: str, tp: Any, bad: str) -> tuple[dict[str, Any], str]:
    """A valid spec but for one value of field ``section.name``; the path an error names."""
    spec: dict[str, Any] = {"name": "job", "command": ["python", "train.py"]}
    origin = get_origin(tp)
    if origin is None and get_args(tp):  # Optional[...]: its member
        origin = get_origin(next(a for a in get_args(tp) if a is not type(None)))
    path = f"{section}.{name}" if section else name
    value: Any = bad
    if origin is list:
        value = [bad]
    elif origin is dict:
        value, path = {"k": bad}, f"{path}.k"
    (spec.setdefault(section, {}) if section else spec)[name] = value
    return spec, path


@pytest.mark.parametrize(("section", "name", "tp"), NAME_FIELDS)
def test_every_control_and_bidi_character_in_a_name_is_refused(
    section: str, name: str, tp: Any
) -> None:
    chars = [*CONTROLS, "\n", "\t"]
    for char in chars:
        spec, path = _spec_with(section, name, tp, f"bert{char}squad")
        with pytest.raises(SpecError) as caught:
            parse_spec(tomli_w.dumps(spec))
        said = str(caught.value)
        assert f"{path}:" in said and f"U+{ord(char):04X}" in said, said
        name_of = unicodedata.name(char, "")
        assert name_of in said and "remove it" in said, said
    tally("terminal and board", tried=len(chars))


@pytest.mark.parametrize(("section", "name", "tp"), NAME_FIELDS)
def test_spec_check_names_the_field_and_the_character(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, name: str, tp: Any
) -> None:
    spec, path = _spec_with(section, name, tp, "bert\u202etxt.exe")
    file = tmp_path / "spec.toml"
    file.write_text(tomli_w.dumps(spec), encoding="utf-8")
    rc = main(["--workspace", str(tmp_path / "ws"), "spec", "check", str(file)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("SpecError: ") and "Traceback" not in err
    assert f"{path}:" in err and "U+202E RIGHT-TO-LEFT OVERRIDE" in err, err
    assert "\u202e" not in err and "\\u202e" in err, repr(err)


def test_the_boards_live_feeds_send_control_characters_escaped() -> None:
    import json

    from acceptrun.ui.live import sse

    message = sse("status", {"name\u202e": ["loss\x1b]0;t\x07", 1.5, {"k": "\x9b2J"}]}, 7)
    data = json.loads(message.decode().split("data: ", 1)[1])  # what the page reads
    assert data == {"name\\u202e": ["loss\\x1b]0;t\\x07", 1.5, {"k": "\\x9b2J"}]}
