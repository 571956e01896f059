"""The command line's validators (acceptrun._util.argtypes) at their bounds, and the
output rule (acceptrun._util.outputs) on real files."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from acceptrun._util.argtypes import (
    dir_arg,
    duration,
    file_arg,
    finite_float,
    path_arg,
    positive_int,
    text,
)
from acceptrun._util.outputs import claim_output, write_output
from acceptrun.errors import UserError


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        pytest.param(positive_int(1_000_000), "1", 1, id="int-least"),
        pytest.param(positive_int(1_000_000), "1000000", 1_000_000, id="int-most"),
        pytest.param(positive_int(10), "007", 7, id="int-leading-zeros"),
        pytest.param(finite_float(above=0.0, most=10.0), "10", 10.0, id="float-most"),
        pytest.param(duration(), "1h30m", 5400.0, id="duration-units"),
        pytest.param(duration(), "90", 90.0, id="duration-seconds"),
        pytest.param(duration(zero_ok=True), "0s", 0.0, id="duration-zero-ok"),
        pytest.param(text(), "lambda:gpu_1x_h100", "lambda:gpu_1x_h100", id="text"),
        pytest.param(path_arg, "../../etc/passwd", "../../etc/passwd", id="path-relative"),
    ],
)
def test_accepts_values_in_range(
    check: Callable[[str], object], value: str, expected: object
) -> None:
    assert check(value) == expected


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        pytest.param(
            positive_int(1_000_000),
            "9" * 23,
            "a 23-digit number is out of range; expected 1 to 1,000,000",
            id="int-23-digits",
        ),
        pytest.param(positive_int(10), "0", "'0' is out of range; expected 1 to 10", id="int-0"),
        pytest.param(positive_int(10), "1.5", "'1.5' is not a whole number", id="int-float"),
        pytest.param(positive_int(10), "x" * 100_000, "a 100,000-character value", id="int-long"),
        pytest.param(finite_float(least=0.0), "nan", "'nan' is out of range", id="float-nan"),
        pytest.param(finite_float(least=0.0), "-inf", "'-inf' is out of range", id="float-inf"),
        pytest.param(finite_float(least=0.0), "-5", "expected a finite number >= 0", id="neg"),
        pytest.param(finite_float(above=0.0), "0", "> 0", id="float-above"),
        pytest.param(duration(), "0s", "more than 0", id="duration-zero"),
        pytest.param(duration(), "9" * 30 + "d", "out of range", id="duration-huge"),
        pytest.param(duration(), "soon", "'soon' is not a duration", id="duration-word"),
        pytest.param(text(), "", "is empty", id="text-empty"),
        pytest.param(text(), "a\x00b", "control character \\x00", id="text-nul"),
        pytest.param(text(), "\x1b]0;x\x07", "control character \\x1b", id="text-escape"),
        pytest.param(text(), "\u009b31m", "control character \\x9b", id="text-c1"),
        pytest.param(text(most=10), "x" * 11, "11-character value is too long", id="text-long"),
        pytest.param(path_arg, "x" * 5000, "5,000-byte path is too long", id="path-max"),
        pytest.param(path_arg, "d/" + "x" * 256, "256-byte name", id="name-max"),
        pytest.param(file_arg, "/dev/zero", "is a device", id="file-device"),
        pytest.param(file_arg, "/", "is a directory", id="file-directory"),
        pytest.param(dir_arg, "/dev/zero", "is not a folder", id="dir-file"),
    ],
)
def test_refuses_values_out_of_range_naming_them(
    check: Callable[[str], object], value: str, message: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        check(value)
    assert message in str(refused.value)
    assert len(str(refused.value)) < 300  # a long value is never quoted whole


def test_a_fifo_is_no_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(argparse.ArgumentTypeError, match="is a FIFO"):
        file_arg(str(fifo))  # stat only: nothing opens it, so nothing blocks


MARK = "# written by a test of acceptrun"


def test_an_output_replaces_its_own_and_refuses_the_users(tmp_path: Path) -> None:
    out = tmp_path / "out.yaml"
    write_output(out, f"{MARK}\na: 1\n", mark=MARK, force=False)
    out.chmod(0o640)  # the user's choice survives a re-export
    write_output(out, f"{MARK}\na: 2\n", mark=MARK, force=False)
    assert out.read_text().endswith("a: 2\n") and out.stat().st_mode & 0o777 == 0o640
    out.write_text("mine\n")
    with pytest.raises(UserError, match=r"refused, the file exists .* pass --force"):
        write_output(out, f"{MARK}\n", mark=MARK, force=False)
    assert out.read_text() == "mine\n"
    write_output(out, f"{MARK}\n", mark=MARK, force=True)
    assert out.read_text() == f"{MARK}\n"


def test_an_output_never_takes_an_input_even_forced(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(f"{MARK}\n")  # even one that carries the mark
    link = tmp_path / "link.toml"
    link.symlink_to(spec)
    for path in (spec, link, tmp_path / "." / "spec.toml"):
        with pytest.raises(UserError, match="which this command reads"):
            claim_output(path, mark=MARK, force=True, inputs=[spec])
    assert spec.read_text() == f"{MARK}\n"


def test_an_output_names_a_missing_folder_and_refuses_a_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist; create it"):
        claim_output(tmp_path / "no" / "out.json", mark=MARK, force=True)
    claim_output(tmp_path / "no" / "out.json", mark=MARK, force=False, parents=True)
    with pytest.raises(UserError, match="is a folder"):
        claim_output(tmp_path, mark=MARK, force=True)


def test_every_control_and_bidi_character_is_refused_by_name() -> None:
    """Generated from controls.CONTROLS: C0, DEL, C1 and the bidirectional controls, and
    newline and tab (a flag's text or path is one line)."""
    from acceptrun._util.controls import CONTROLS

    chars = [*CONTROLS, "\n", "\t"]
    for char in chars:
        for check in (text(), path_arg):
            with pytest.raises(argparse.ArgumentTypeError) as caught:
                check(f"bert{char}squad")
            said = str(caught.value)
            assert f"U+{ord(char):04X} " in said and repr(char)[1:-1] in said, said
            assert char not in said  # quoted escaped, never raw
    with pytest.raises(argparse.ArgumentTypeError, match="U\\+202E RIGHT-TO-LEFT OVERRIDE"):
        text()("txt\u202eexe.sh")
