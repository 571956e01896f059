"""docs/reliability.md's table of every way out, written from the egress registry.

    python tools/egress_doc.py          # rewrite the table between its markers
    python tools/egress_doc.py --check  # exit 1 when the doc and the registry differ

The registry (``acceptrun._util.egress``: ``SINKS`` and ``KEPT_WHOLE``) is the source; the
doc shows it to people. ``tests/unit/test_egress_registry.py`` fails when they differ, so a
sink registered tomorrow is in the doc the day it is added.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from acceptrun._util.egress import KEPT_WHOLE, SINKS

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
BEGIN = "<!-- egress table: written by tools/egress_doc.py from acceptrun._util.egress -->"
END = "<!-- end of egress table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    """The registry as Markdown: every sink, then every file kept whole."""
    lines = [
        BEGIN,
        "",
        f"{len(SINKS)} registered sinks ({sum(bool(s.redacted_by) for s in SINKS)} redacted,"
        f" {sum(bool(s.exempt) for s in SINKS)} exempt with their reason):",
        "",
        "| sink (module:function) | kind | redacted by, or why exempt |",
        "|---|---|---|",
    ]
    for s in sorted(SINKS, key=lambda s: (s.kind, s.where)):
        how = f"redacted by {s.redacted_by}" if s.redacted_by else f"exempt: {s.exempt}"
        lines.append(f"| `{s.where.removeprefix('acceptrun.')}` | {s.kind} | {_cell(how)} |")
    lines += [
        "",
        "Files kept as they were written (every view, quotation, archive and export of them is"
        " redacted):",
        "",
        "| file (from the workspace root) | why |",
        "|---|---|",
    ]
    lines += [f"| `{k.pattern}` | {_cell(k.reason)} |" for k in KEPT_WHOLE]
    lines += ["", END]
    return "\n".join(lines)


def rewritten(doc: str) -> str:
    """``doc`` with the text between the markers replaced by :func:`table`."""
    head, begin, rest = doc.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing")
    return head + table() + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is in sync")
    args = parser.parse_args()
    doc = DOC.read_text(encoding="utf-8")
    new = rewritten(doc)
    if args.check:
        if new != doc:
            print(f"{DOC} is out of date: python tools/egress_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
