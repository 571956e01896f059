"""Control characters: shown as text (``\\x1b``, ``\\u202e``), never acted on.

A terminal acts on what it is sent: ``ESC ] 0;...BEL`` retitles the window, ``ESC ] 52``
writes the clipboard, ``ESC [2J`` clears the screen, ``\\r`` lets a line be written over,
``ESC [6n`` makes the terminal type an answer into the shell. A browser reorders text
between bidirectional controls (U+202E shows ``exe.txt`` for ``txt.exe``). A workload's
exception, a metric name, a log line or a spec value that acceptrun prints holds any of
them; acceptrun shows them as escapes instead:

* :func:`escape_controls` for text: every character of :data:`CONTROLS` becomes
  ``\\x1b`` (C0 and C1 controls, DEL) or ``\\u202e`` (bidirectional controls). Newline and
  tab stay, and ``\\r`` just before a newline (a CRLF line end moves nothing).
  :class:`~acceptrun._util.console.RedactingStream` applies it to every line acceptrun
  prints, and the board to every page (``ui.pages.esc``, the report's ``_e``).
* :func:`control_named` for a value to refuse (a spec's names): the first such character
  and its Unicode name, e.g. ``U+202E RIGHT-TO-LEFT OVERRIDE``.
* :class:`LiveEcho` for the workload's live output echoed to the terminal during ``run``:
  a progress bar needs ``\\r``, backspace, colours (SGR), cursor moves and erasing a line,
  so those pass; everything else is escaped as above: OSC (title, clipboard,
  hyperlinks), DCS/APC/PM/SOS strings (neutralised by escaping their ESC, the rest is
  then plain text), any other CSI (clear screen, absolute moves, device reports), C1,
  bidi, BEL. ``stdout.log`` keeps the bytes as written (``acceptrun logs --raw``).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from typing import IO

__all__ = ["BIDI", "CONTROLS", "LiveEcho", "control_named", "escape_controls"]

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# C0 but newline and tab, DEL, C1 (U+0080-U+009F), the bidirectional controls.
CONTROLS = "".join(chr(c) for c in [*range(32), *range(0x7F, 0xA0)] if chr(c) not in "\n\t")
CONTROLS += BIDI

_CONTROL_RE = re.compile(f"[{re.escape(CONTROLS)}]")
# Lone bytes 0x80-0x9F that are not UTF-8 reach here as surrogates (surrogateescape):
# 8-bit C1, which some terminals read as CSI (0x9B) or OSC (0x9D).
_RAW_C1 = "".join(chr(0xDC00 + c) for c in range(0x80, 0xA0))


def _escaped(char: str) -> str:
    code = ord(char)
    if code >= 0xDC00:  # a raw byte of undecodable output
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE = {ord(c): _escaped(c) for c in CONTROLS}


def escape_controls(text: str) -> str:
    """``text`` with control and bidi characters shown as escapes.

    >>> escape_controls("loss\\x1b[2J \\u202eexe.txt\\r\\n")
    'loss\\\\x1b[2J \\\\u202eexe.txt\\r\\n'
    """
    if _CONTROL_RE.search(text) is None:  # the common case: one linear scan, no copy
        return text
    shown = text.translate(_TABLE)  # one pass in C
    # A CRLF line end moves nothing: kept (a "\\x0d" the text held already is then a CR
    # before a newline too, which moves nothing either).
    return shown.replace("\\x0d\n", "\r\n") if "\r\n" in text else shown


def control_named(text: str) -> str | None:
    """The first control or bidi character of ``text`` as ``U+202E RIGHT-TO-LEFT
    OVERRIDE``, or None when it holds none (newline and tab included: a name is a line)."""
    for char in text:
        if char in CONTROLS or char in "\n\t":
            name = unicodedata.name(char, "") or _C0_NAMES.get(ord(char), "control character")
            return f"U+{ord(char):04X} {name}"
    return None


# unicodedata has no names for C0/C1 controls; the common ones, for the error message.
_C0_NAMES = {
    0x00: "NULL",
    0x07: "BELL",
    0x08: "BACKSPACE",
    0x09: "CHARACTER TABULATION",
    0x0A: "LINE FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
    0x9B: "CONTROL SEQUENCE INTRODUCER",
    0x9D: "OPERATING SYSTEM COMMAND",
}

# What a live echo passes: SGR (colours), cursor up/down/forward/back/next/previous line
# and column (A-G), erase in line (K), erase below (J or 0J), hide/show the cursor.
_ALLOWED_CSI = re.compile(r"\x1b\[(?:[0-9;]{0,32}[mA-GK]|0?J|\?25[hl])")
_HOLD = 40  # characters: a split sequence kept for the next chunk; longer is not allowed
_LIVE_BAD = re.compile(f"[{re.escape(CONTROLS.replace(chr(8), '').replace(chr(13), ''))}{_RAW_C1}]")


class LiveEcho:
    """A binary stream the workload's live output is written through (``.buffer`` of
    :class:`~acceptrun._util.console.RedactingStream`): see the module docstring.

    Bytes are decoded incrementally (a character or an escape sequence split between
    two reads is held, at most 40 characters, for the next); undecodable bytes pass as
    they are, except 0x80-0x9F, escaped as 8-bit C1. ``dirty`` says a colour or a hidden
    cursor may still be set, for :meth:`reset` before acceptrun's own next line.
    """

    dirty = False  # process-wide: the terminal is shared by stdout and stderr

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._held = ""

    def write(self, chunk: bytes) -> int:
        text = self._held + self._decode.decode(bytes(chunk))
        self._held = ""
        cut = text.rfind("\x1b")
        if cut >= 0 and len(text) - cut < _HOLD and _could_grow(text[cut:]):
            text, self._held = text[:cut], text[cut:]
        self.raw.write(_filter_live(text).encode("utf-8", errors="surrogateescape"))
        return len(chunk)

    def flush(self) -> None:
        self.raw.flush()

    @classmethod
    def reset(cls, stream: IO[str]) -> None:
        """Colours off and the cursor shown, on a terminal a workload drew on."""
        if cls.dirty:
            cls.dirty = False
            if stream.isatty():
                stream.write("\x1b[0m\x1b[?25h")

    def __getattr__(self, name: str) -> object:  # fileno, isatty, ...
        return getattr(self.raw, name)


def _could_grow(tail: str) -> bool:
    """Whether ``tail`` (from an ESC to the end of a chunk) may be the start of an
    allowed sequence that the next chunk completes."""
    return re.fullmatch(r"\x1b(?:\[(?:\??[0-9;]*)?)?", tail) is not None


def _filter_live(text: str) -> str:
    out: list[str] = []
    at = 0
    while True:
        bad = _LIVE_BAD.search(text, at)
        if bad is None:
            out.append(text[at:])
            return "".join(out)
        out.append(text[at : bad.start()])
        allowed = _ALLOWED_CSI.match(text, bad.start()) if bad.group() == "\x1b" else None
        if allowed is not None:
            LiveEcho.dirty = True
            out.append(allowed.group())
            at = allowed.end()
        else:
            out.append(_escaped(bad.group()))
            at = bad.end()
