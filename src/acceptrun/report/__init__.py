"""Reports of a run: the terminal view (``acceptrun show``)."""

from acceptrun.report.terminal import format_show

__all__ = ["format_show"]
