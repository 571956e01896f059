"""Reports of a run: the terminal view (``acceptrun show``), the HTML and Markdown report.

Names are imported on first use, so that registering the report commands
(``acceptrun.cli.report``) keeps ``acceptrun --help`` fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from acceptrun.report.data import report_data
    from acceptrun.report.html import render_html, write_report
    from acceptrun.report.markdown import render_markdown
    from acceptrun.report.terminal import format_show

__all__ = ["format_show", "render_html", "render_markdown", "report_data", "write_report"]

_WHERE = {
    "format_show": "acceptrun.report.terminal",
    "render_html": "acceptrun.report.html",
    "report_data": "acceptrun.report.data",
    "write_report": "acceptrun.report.html",
    "render_markdown": "acceptrun.report.markdown",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'acceptrun.report' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
