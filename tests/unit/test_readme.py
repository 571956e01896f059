"""README.md's first screen: a pip user's path that fits a terminal and runs as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from acceptrun.cli.main import build_parser
from acceptrun.spec.model import parse_spec

README = Path(__file__).resolve().parents[2] / "README.md"
END = "<!-- end of the first screen -->"


def _first_screen() -> str:
    text = README.read_text(encoding="utf-8")
    assert END in text, f"README.md lost its {END!r} marker"
    return text[: text.index(END)]


def test_every_line_of_the_first_screen_fits_100_columns() -> None:
    wide = [(n, len(line)) for n, line in enumerate(_first_screen().splitlines(), 1)
            if len(line) >= 100]  # fmt: skip
    assert not wide, f"README.md lines at 100 columns or more (line, width): {wide}"


def test_the_first_screen_spec_is_valid_and_runs_a_black_box() -> None:
    (block,) = re.findall(r"```toml\n(.*?)```", _first_screen(), re.S)
    spec = parse_spec(block, source="README.md")
    assert spec.command == ["python", "train.py"] and spec.progress.pattern
    assert spec.checkpoint.watch and spec.checkpoint.resume_args
    assert len(block.strip().splitlines()) <= 10  # "a ten-line spec"


def test_every_acceptrun_command_of_the_first_screen_parses() -> None:
    """Each `acceptrun ...` line is a real command with real options (from the parser)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", _first_screen(), re.S)  # each fence whole
    lines = [ln.split("#", 1)[0].strip() for lang, block in blocks if lang in ("sh", "")
             for ln in block.splitlines()]  # fmt: skip
    commands = [shlex.split(ln)[1:] for ln in lines if ln.startswith("acceptrun ")]
    assert {c[0] for c in commands} >= {"spec", "run", "show", "report"}  # install, run, look
    parser = build_parser()
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # --version exits 0; an unknown command or option, 2
            assert exc.code == 0, f"README.md: acceptrun {shlex.join(argv)} does not parse"
