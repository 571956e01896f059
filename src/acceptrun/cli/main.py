"""The ``acceptrun`` command. The only place that catches acceptrun errors.

Exit codes: 0 success (a run ACCEPTED), 1 a run REJECTED or a damaged record,
2 bad input (spec, paths, data, failed preflight), 130 interrupted.
Imports stay lazy so ``acceptrun --help`` answers at once.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import traceback
from collections.abc import Sequence

from acceptrun._util.console import configure_console, remove_console
from acceptrun.errors import AcceptrunError

__all__ = ["main"]

# Command groups defined beside their code: each package's ``cli`` module has
# ``register(sub)``, which adds its subcommands to the top-level subparsers, in this order
# (the order of ``acceptrun --help``). Those modules keep their imports lazy too. A group
# lives in the lowest package that has everything it needs (``show`` needs the report).
COMMAND_MODULES: tuple[str, ...] = (
    "acceptrun.run.cli",
    "acceptrun.capture.cli",
    "acceptrun.record.cli",
    "acceptrun.report.cli",
    "acceptrun.cost.cli",
    "acceptrun.queue.cli",
    "acceptrun.telemetry.cli",
    "acceptrun.tune.cli",
    "acceptrun.tune.scaling",
    "acceptrun.backends.cli",
    "acceptrun.ui.cli",
)


def build_parser() -> argparse.ArgumentParser:
    from acceptrun import __version__

    p = argparse.ArgumentParser(
        prog="acceptrun",
        description="Turn GPU time into accepted runs: spec, provenance, verified data, supervision, verdict.",
    )
    p.add_argument("--version", action="version", version=f"acceptrun {__version__}")
    p.add_argument(
        "--workspace",
        metavar="DIR",
        help="workspace directory (default: nearest .acceptrun/, or $ACCEPTRUN_WORKSPACE)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return p


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser, built once per process (about 20 ms: every command module registers)."""
    return build_parser()


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_console()  # the library's log lines: "acceptrun: ..." on stderr
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
