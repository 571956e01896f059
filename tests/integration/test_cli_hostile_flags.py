"""Every command survives every flag: each argument the parser declares, given each hostile
value its kind calls for, ends in exit 0, 1 or 2 with a message, never a traceback, an
escaped exception or a hang.

The commands, options and positional arguments come from walking ``build_parser()``, so an
argument added tomorrow is tried the day it is added. Calls run in this process through
``acceptrun.cli.main.main`` (NUL can be passed, as argv cannot), each bounded by a SIGALRM
in the main thread; the working directory is three folders deep in ``tmp_path`` with no
workspace, so ``../../etc/passwd`` stays inside it and every command that needs a run or a
spec fails on a clean error instead of starting work.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest
from parser_walk import Leaf, arguments, leaves

from acceptrun.cli.main import build_parser, main
from campaign import tally

BOUND_S = 20.0  # one call's hang guard (seconds): the slowest clean failure is ~1 s
# Commands a hostile value can start for real, with their own guard: ``export wheel -o
# ../../etc/passwd`` is a new folder inside tmp_path, so it builds the wheel there (pip,
# 5 s on a quiet machine, past 20 s on a loaded one).
WORK_BOUND_S = {("export", "wheel"): 600.0}

NUMBER_TYPES = {"integer", "number", "duration", "int", "float", "_gpu_list"}
HOSTILE_NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e308", "9" * 23, "", "abc"]


def hostile_strings(tmp: Path) -> list[str]:
    fifo = tmp / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    # 1,000 characters: past NAME_MAX (255) but inside PATH_MAX, where open(2) says ENAMETOOLONG
    return ["", "\x00", "\x1b]0;x\x07", "txt\u202eexe.sh", "x" * 100_000, "y" * 1000,
            "../../etc/passwd", str(fifo), "/dev/zero"]  # fmt: skip


# Harmless values for what the walk cannot choose (a missing spec, an unknown run): each
# makes its command fail on a clean error before it starts any work.
PLACEHOLDERS = {
    "spec": "missing.toml", "file": "missing.toml", "target": "no-such-run",
    "path": "missing-data", "manifest": "missing-manifest.json", "job": "999999",
    "output": "out.file", "on": "lambda:gpu_1x_h100_sxm5", "gpus": "0", "slots": "1",
}  # fmt: skip
RUN_PLACEHOLDER = "no-such-run"
# Options that keep a command from starting work that lasts, added to each of its cases
# unless the case's hostile option is one of them: the loops run once; the benchmark gives
# up after 1 s (a clean error); the board cannot bind TEST-NET-1 (RFC 5737, never local).
BOUNDED = {
    ("top",): ["--once"], ("watch",): ["--once"], ("worker",): ["--once"],
    ("bench", "comm"): ["--timeout", "1"], ("ui",): ["--host", "192.0.2.1"],
}  # fmt: skip


def placeholder(action: argparse.Action) -> str:
    if action.dest in PLACEHOLDERS:
        return PLACEHOLDERS[action.dest]
    return RUN_PLACEHOLDER  # every other positional names a run (id, prefix, folder)


def baseline(leaf: Leaf, hostile: argparse.Action) -> tuple[list[str], list[str]]:
    """(options, positionals) that fill what ``leaf`` requires, leaving ``hostile`` to the case."""
    bounded = BOUNDED.get(leaf.words, [])
    opts: list[str] = [] if set(bounded) & set(hostile.option_strings) else list(bounded)
    pos: list[str] = []
    for group in leaf.parser._mutually_exclusive_groups:
        if group.required and hostile not in group._group_actions:
            first = group._group_actions[-1]  # worker: --slots 1
            opts += [first.option_strings[-1], placeholder(first)]
    for action in arguments(leaf.parser):
        if action is hostile:
            continue
        if action.option_strings and action.required:
            opts += [action.option_strings[-1], placeholder(action)]
        elif not action.option_strings and action.nargs != "?":
            pos.append(placeholder(action))
    return opts, pos


def values_for(action: argparse.Action, strings: list[str]) -> list[list[str]]:
    """The hostile argv fragments for ``action`` (an option's words, or a positional's)."""
    if action.nargs == 0:  # store_true, store_false, count: given twice
        return [[action.option_strings[-1]] * 2]
    if action.choices is not None:
        values = ["not-a-choice", ""]
    elif getattr(action.type, "__name__", None) in NUMBER_TYPES:
        values = HOSTILE_NUMBERS
    else:
        values = strings
    if action.option_strings:
        return [[action.option_strings[-1], v] for v in values]
    return [[v] for v in values]


class Hang(BaseException):
    """A call past its bound (BaseException: no command's ``except Exception`` eats it)."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang


@dataclass
class Outcome:
    code: object
    stderr: str
    escaped: BaseException | None = None
    hung: bool = False


def call(argv: list[str], bound_s: float = BOUND_S) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, bound_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: object = main(argv)
            except SystemExit as exc:  # argparse's own exits: 2 for a usage error
                code = exc.code
    except Hang:
        return Outcome(None, err.getvalue(), hung=True)
    except BaseException as exc:  # an exception escaping main: the failure counted
        return Outcome(None, err.getvalue(), escaped=exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(code, err.getvalue())


@pytest.fixture
def deep_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cwd = tmp_path / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    # What a failing command keeps for the user to read (bench comm's workers' folder,
    # named in its error) goes with the test, not into the machine's /tmp.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return cwd


def test_every_argument_of_every_command_survives_hostile_values(deep_cwd: Path) -> None:
    parser = build_parser()
    strings = hostile_strings(deep_cwd.parent)
    all_leaves = list(leaves(parser))
    tried_args: set[tuple[tuple[str, ...], str]] = set()
    failures: list[str] = []
    tried = tracebacks = hangs = 0
    for leaf in all_leaves:
        targets = arguments(leaf.parser)
        if not leaf.words[1:] and leaf.words == ("ls",):
            targets += arguments(parser)  # the root options (--workspace, --debug), once
        for action in targets:
            root = action in arguments(parser)
            for fragment in values_for(action, strings):
                opts, pos = baseline(leaf, action) if not root else ([], [])
                if action.option_strings:
                    argv = [*fragment, *opts, *pos]
                    argv = (argv + list(leaf.words)) if root else [*leaf.words, *argv]
                else:
                    argv = [*leaf.words, *opts, *_fill(leaf, action, fragment[0])]
                bound_s = WORK_BOUND_S.get(leaf.words, BOUND_S)
                result = call(argv, bound_s)
                tried += 1
                shown = " ".join(a[:40] for a in argv)
                # --debug prints the traceback of a clean error, as it is there to.
                traced = "Traceback (most recent call last)" in result.stderr
                traced = traced and action.dest != "debug"
                if result.hung:
                    hangs += 1
                    failures.append(f"hang past {bound_s:.0f} s: acceptrun {shown!r}")
                elif result.escaped is not None or traced:
                    tracebacks += 1
                    what = result.escaped if result.escaped is not None else result.stderr[-600:]
                    failures.append(f"traceback: acceptrun {shown!r}: {what!r}")
                elif result.code not in (0, 1, 2, None):
                    failures.append(f"exit {result.code!r}: acceptrun {shown!r}")
                elif result.code == 2 and not result.stderr.strip():
                    failures.append(f"exit 2 with no message: acceptrun {shown!r}")
            tried_args.add((leaf.words, action.dest))
    tally("command-line flags", tried=tried, tracebacks=tracebacks, hangs=hangs)
    assert not failures, f"{len(failures)} of {tried} cases failed:\n" + "\n".join(failures[:40])
    # Every leaf command and every argument of each (and the root's) was tried.
    declared = {(leaf.words, a.dest) for leaf in all_leaves for a in arguments(leaf.parser)}
    declared |= {(("ls",), a.dest) for a in arguments(parser)}
    assert tried_args == declared
    assert len(all_leaves) >= 46 and tried > 1000


def _fill(leaf: Leaf, hostile: argparse.Action, value: str) -> list[str]:
    """The positionals of ``leaf`` in order, ``value`` in ``hostile``'s place."""
    out = []
    for action in arguments(leaf.parser):
        if action.option_strings:
            continue
        if action is hostile:
            out.append(value)
        elif action.nargs != "?":
            out.append(placeholder(action))
    return ["--", *out] if value.startswith("-") else out
