"""The command line as the parser declares it, for the generative CLI tests: every leaf
command (a command with no further action to choose, or one that runs without one) and
every argument of each, so an argument added tomorrow is tried the day it is added."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Leaf:
    words: tuple[str, ...]
    parser: argparse.ArgumentParser


def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[Leaf]:
    """Each command of ``parser``, by the words that name it (``("export", "skypilot")``)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs or not subs[0].required:
        yield Leaf(words, parser)  # a command that runs without an action too (env, cost)
    for sub in subs:
        for name, child in sub.choices.items():
            yield from leaves(child, (*words, name))


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options and positionals ``parser`` declares itself (not help, version, actions)."""
    skip = (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction)
    return [a for a in parser._actions if not isinstance(a, skip)]
