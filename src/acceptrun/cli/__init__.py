"""The ``acceptrun`` command: the root parser; each package registers its own commands."""

from acceptrun.cli.main import main

__all__ = ["main"]
