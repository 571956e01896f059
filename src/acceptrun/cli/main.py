"""The ``acceptrun`` command. The only place that catches acceptrun errors.

Exit codes: 0 success (a run ACCEPTED), 1 a run REJECTED or a damaged record,
2 bad input (spec, paths, data, failed preflight), 130 interrupted.
Imports stay lazy so ``acceptrun --help`` answers at once.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import shutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from acceptrun._util.argtypes import PATH_MAX, path_arg, text
from acceptrun._util.console import (
    configure_console,
    redact_streams,
    remove_console,
    restore_streams,
)
from acceptrun._util.redact import without_shapes
from acceptrun.errors import AcceptrunError

__all__ = ["main"]

# Every command module is in this package, one per family: its ``register(sub)`` adds
# its commands to the top-level subparsers, and keeps its own imports lazy. ``COMMANDS``
# names the module of every top-level name (old names included), so that a command line
# imports and registers its own module alone (the whole parser was 60 to 90 ms of every
# command's start); help, a mistyped command or an abbreviated option build the whole
# parser, whose messages list every command. A unit test checks each module registers
# exactly its names here.
COMMANDS: dict[str, str] = {
    **dict.fromkeys(
        ("init", "spec", "run", "resume", "stop", "kill", "logs", "ckpt", "drill", "gc", "plan"),
        "acceptrun.cli.run",
    ),
    **dict.fromkeys(("env", "data"), "acceptrun.cli.capture"),
    **dict.fromkeys(("ls", "index"), "acceptrun.cli.record"),
    **dict.fromkeys(
        ("show", "report", "bundle", "diff", "reproduce", "portability", "howto"),
        "acceptrun.cli.report",
    ),
    **dict.fromkeys(("prices", "cost"), "acceptrun.cli.cost"),
    **dict.fromkeys(("submit", "queue", "cancel", "worker"), "acceptrun.cli.queue"),
    "top": "acceptrun.cli.telemetry",
    **dict.fromkeys(("tune", "bench", "scaling"), "acceptrun.cli.tune"),
    "export": "acceptrun.cli.backends",
    "ui": "acceptrun.cli.ui",
    "watch": "acceptrun.cli.notify",
}
# ``acceptrun --help``: every command under the heading of what a user came to do, in this
# order. A unit test checks each command is under exactly one heading, or is an old name.
GROUPS: dict[str, tuple[str, ...]] = {
    "run": ("init", "spec", "data", "run", "resume", "stop", "kill", "logs"),
    "inspect": ("ls", "show", "top", "ui", "watch", "index"),
    "checkpoints": ("ckpt", "drill", "gc"),
    "reproduce and exit": (
        *("report", "bundle", "reproduce", "diff", "env", "portability", "howto", "export"),
    ),
    "cost": ("cost",),
    "queue": ("submit", "queue", "worker", "cancel"),
    "tune": ("tune", "bench"),
}
# Old names, kept working for a release (every option and exit code of the old form) with
# a note on stderr naming the new form; out of the grouped help, listed in docs/commands.md.
# Each module registers its old names beside the new form (``renamed=`` in the defaults).
RENAMED: dict[str, str] = {
    "plan": "ckpt plan",
    "scaling": "bench scaling",
    "prices": "cost prices",
}
# What an old name's own --help says first (argparse answers --help before the note).
OLD_NAME = "The old name of `acceptrun %s`, kept for one release: use that."
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    """argparse's parser (each subparser is one too): its help is acceptrun's own text, so
    the terminal's redactor does not look for credential shapes in it (redact.py)."""

    def print_help(self, file: Any = None) -> None:
        with without_shapes():
            super().print_help(file)


def _formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's, as wide as the terminal but never past 100 columns."""
    return argparse.HelpFormatter(prog, width=min(shutil.get_terminal_size().columns, 100) - 2)


class _RootParser(_Parser):
    """The ``acceptrun`` parser: its help lists the commands under the headings of GROUPS,
    each with its one-line help, then the root options."""

    def format_help(self) -> str:
        (sub,) = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        listed = {a.dest: a for a in sub._get_subactions()}  # old names have no help: absent
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        for heading, names in GROUPS.items():
            formatter.start_section(heading)
            formatter.add_arguments([listed[n] for n in names if n in listed])
            formatter.end_section()
        formatter.start_section(self._optionals.title)
        formatter.add_arguments(self._optionals._group_actions)
        formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command group, or only ``command``'s (a name in COMMANDS)."""
    from acceptrun._version import __version__

    p = _RootParser(
        prog="acceptrun",
        formatter_class=_formatter,
        description="Turn GPU time into accepted runs: spec, provenance, verified data, supervision, verdict.",
        epilog="`acceptrun COMMAND --help` for a command's options; docs/commands.md for all.",
    )
    p.add_argument("--version", action="version", version=f"acceptrun {__version__}")
    p.add_argument(
        "--workspace",
        type=path_arg,
        metavar="DIR",
        help="workspace directory (default: nearest .acceptrun/, or $ACCEPTRUN_WORKSPACE)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    modules = COMMAND_MODULES if command is None else (COMMANDS[command],)
    for module in modules:
        importlib.import_module(module).register(sub)
    _check_plain_strings(p)
    return p


def _check_plain_strings(parser: argparse.ArgumentParser) -> None:
    """Give every string argument declared without a ``type=`` the check of
    :func:`acceptrun._util.argtypes.text`: no control characters (NUL included), at most a
    path's length. A group's register() types what it knows (a count, a duration, a
    path); this is the floor for the rest, and for an option added tomorrow without one."""
    plain = text(most=PATH_MAX)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases share a parser
                _check_plain_strings(child)
        elif action.type is None and action.nargs != 0 and action.choices is None:
            # One whose metavar says it is a path gets the path's limits too (NAME_MAX: a
            # 1,000-character folder name was an OSError traceback).
            action.type = path_arg if action.metavar in _PATH_METAVARS else plain


_PATH_METAVARS = {"DIR", "FILE", "PATH"}


def command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, when only its group's parser is needed; else None.

    None for help, version, no command, an unknown command, or a root option that is not
    spelt whole (argparse accepts ``--work DIR``; only the whole parser may read it).
    """
    words = iter(argv)
    for word in words:
        if word == "--workspace":
            next(words, None)  # its value, which may look like a command
        elif word == "--debug" or word.startswith("--workspace="):
            continue
        elif word.startswith("-"):
            return None
        else:
            return word if word in COMMANDS else None
    return None


@functools.cache
def _parser(command: str | None) -> argparse.ArgumentParser:
    """The parser for ``command`` (None: every command), built once per process."""
    return build_parser(command)


def main(argv: Sequence[str] | None = None) -> int:
    # The terminal is a way out like a record file: every print of every command (and
    # argparse's own errors, which quote arguments) is redacted here, at the edge,
    # instead of by each command remembering to.
    streams = redact_streams()
    try:
        return _main(argv)
    finally:
        restore_streams(streams)


def _main(argv: Sequence[str] | None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = _parser(command_in(words)).parse_args(words)
    configure_console()  # the library's log lines: "acceptrun: ..." on stderr
    renamed = getattr(args, "renamed", None)
    if renamed is not None:  # an old name: it works, and says the new one
        print(f"note: `acceptrun {args.command}` is now `acceptrun {renamed}`; the old name "
              "goes in the next release", file=sys.stderr)  # fmt: skip
    try:
        code: int = args.func(args)
        return code
    except AcceptrunError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        remove_console()


if __name__ == "__main__":
    sys.exit(main())
