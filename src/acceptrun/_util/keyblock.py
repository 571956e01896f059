"""A private key block seen a line at a time is held until it is whole, then redacted.

A key block spans lines (``-----BEGIN ...-----``, its base64 body, ``-----END ...-----``)
and its body lines alone have no shape a redactor knows: whatever redacts text as it comes
(a log pump, the CLI's stream, the live echo of ``acceptrun run``) gives its lines to a
:class:`KeyBlocks`, which holds a block from its BEGIN line to its END line and redacts it
whole. What it holds is bounded: a body past :data:`BLOCK_MAX` characters, or a block cut
short by a line that is no body line, is given as its BEGIN line and ``<redacted>``, and
the rest of a body too long to hold is left out.

>>> blocks = KeyBlocks()
>>> [blocks.line(x) for x in ["-----BEGIN PRIVATE KEY-----\\n", "QUJD\\n", "-----END PRIVATE KEY-----\\n"]]
['', '', '<redacted>\\n']
"""

from __future__ import annotations

import re

from acceptrun._util.redact import REDACTED, redact_text

__all__ = ["BLOCK_MAX", "KeyBlocks", "split_lines"]

_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{1,64}-----")
_END = re.compile(r"-----END [A-Z0-9 ]{1,64}-----")
# What a block's body is made of: base64 lines, PEM headers (Proc-Type, DEK-Info), blanks.
_BODY = re.compile(r"[A-Za-z0-9+/=]{1,128}|[A-Za-z-]{1,32}: .{0,200}|")
# A line: up to its end (\n, \r\n or a lone \r, a progress bar's), or the last one without.
_LINE = re.compile(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+")
BLOCK_MAX = 64 * 1024  # characters of one key block held at most (a 16384-bit key is 12 KiB)
BEGIN_MARK = "-----BEGIN"  # a text without it starts no block


def split_lines(text: str) -> list[str]:
    """``text`` cut after each line end (``\\n``, ``\\r\\n``, ``\\r``), line ends kept."""
    return _LINE.findall(text)


class KeyBlocks:
    """Lines in, redacted text out, a key block held from its BEGIN line to its END line.

    :meth:`line` takes one line (with its line end, or the last one without) and gives
    what can be shown now: the line redacted, or ``""`` while a block is held, then the
    whole block redacted. :meth:`text` does the same for several lines at once, and
    :meth:`close` gives what is still held when the input ends.
    """

    def __init__(self) -> None:
        self._held: list[str] = []
        self._size = 0  # characters held
        self._skipping = False  # past BLOCK_MAX: the rest of the body is left out

    @property
    def holding(self) -> bool:
        """Whether a block has begun and not ended (its next lines are held or left out)."""
        return bool(self._held) or self._skipping

    def line(self, line: str) -> str:
        """What to show for ``line``: itself redacted, ``""`` while a block is held."""
        if not self.holding:
            return self._start(line)
        end = _END.search(line)
        if end is not None:
            # What follows the END line's marker may begin the next block ("... | -----BEGIN").
            ended, after = line[: end.end()], line[end.end() :]
            out = redact_text("".join([*self._held, ended])) if self._held else ""
            self._held, self._size, self._skipping = [], 0, False
            return out + self._start(after) if after else out
        if _BODY.fullmatch(line.strip()):
            if self._skipping:
                return ""
            self._held.append(line)
            self._size += len(line)
            if self._size > BLOCK_MAX:
                out, self._skipping = self._cut(), True
                return out
            return ""
        # Not a body line: the block ended without its END line.
        out = self._cut() if self._held else ""
        self._skipping = False
        return out + self._start(line)

    def text(self, text: str) -> str:
        """What to show for ``text`` (whole lines, the last one may lack its end)."""
        if not self.holding and BEGIN_MARK not in text:
            return redact_text(text)  # no block: redacted at once, the common case
        return "".join(self.line(line) for line in split_lines(text))

    def close(self) -> str:
        """What is still held, as its BEGIN line and ``<redacted>``: the input ended."""
        out = self._cut() if self._held else ""
        self._skipping = False
        return out

    def _start(self, line: str) -> str:
        last = None
        for last in _BEGIN.finditer(line):  # noqa: B007 - the last BEGIN of the line counts
            pass
        if last is not None and not _END.search(line, last.end()):
            self._held, self._size = [line], len(line)
            return ""
        return redact_text(line)

    def _cut(self) -> str:
        first = self._held[0]
        self._held, self._size = [], 0
        return redact_text(first) + REDACTED + "\n"
