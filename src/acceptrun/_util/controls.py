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
  bidi, BEL. It is redacted first, like every line acceptrun prints, the last words of
  an unfinished line held for the next chunk so a token cut in two by a pipe is seen
  whole (the class's docstring says how, and what it cannot see). ``stdout.log`` keeps the bytes as
  written (``acceptrun logs --raw``).
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from typing import IO

from acceptrun._util.keyblock import BEGIN_MARK, BLOCK_MAX, KeyBlocks
from acceptrun._util.redact import redact_text

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
    :class:`~acceptrun._util.console.RedactingStream`): redacted, then filtered (see the
    module docstring).

    Bytes are decoded incrementally (a character split between two reads waits for the
    next). A run's terminal is often shared (a CI log, a screen share), so what is shown
    is redacted like every line acceptrun prints, without stopping a progress bar:

    * complete segments (up to the chunk's last ``\n`` or ``\r``) are redacted, filtered
      and written at once, a key block held from its BEGIN line to its END line
      (:class:`~acceptrun._util.keyblock.KeyBlocks`, at most 64 KiB);
    * of the partial segment after them (a progress bar between two updates), all is
      written at once but its last three words (at most 512 bytes), which wait for the
      next chunk or :meth:`finish`: a token a block-buffered pipe cut in two is seen whole,
      with its name (``Authorization: token X`` is three words, ``NAME=value`` one). An
      escape sequence cut in two is part of those words (or, past them, waits alone).

    The limit: a form whose name lies more than three words before the pipe's cut, or
    whose words pass 512 bytes, is redacted in two pieces, and its value is then hidden
    only when it has a known shape or is a known value.

    Undecodable bytes pass as they are, except 0x80-0x9F, escaped as 8-bit C1. ``dirty``
    says a colour or a hidden cursor may still be set, for :meth:`reset` before
    acceptrun's own next line.
    """

    dirty = False  # process-wide: the terminal is shared by stdout and stderr

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._held = ""  # text not yet redacted: last words, or a line inside a key block
        self._blocks = KeyBlocks()

    def write(self, chunk: bytes) -> int:
        self._show(self._held + self._decode.decode(bytes(chunk)), final=False)
        return len(chunk)

    def flush(self) -> None:
        """Flush what was written; a last word or a key block held stays held."""
        self.raw.flush()

    def finish(self) -> None:
        """Write all that is held: the stream ended. The stream under it stays open."""
        self._show(self._held + self._decode.decode(b"", final=True), final=True)
        self.raw.flush()

    def _show(self, text: str, *, final: bool) -> None:
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        done, rest = text[:cut], text[cut:]
        out = self._blocks.text(done) if done else ""
        if final:
            out += (self._blocks.text(rest) if rest else "") + self._blocks.close()
            rest = ""
        elif self._blocks.holding:
            if len(rest) > BLOCK_MAX:  # no line end for 64 KiB: no body line either
                out, rest = out + self._blocks.text(rest), ""
        else:
            keep = _held_from(rest)
            if keep:
                out += redact_text(rest[:keep])
            rest = rest[keep:]
        self._held = rest
        if out:
            self.raw.write(_filter_live(out).encode("utf-8", errors="surrogateescape"))

    @classmethod
    def reset(cls, stream: IO[str]) -> None:
        """Colours off and the cursor shown, on a terminal a workload drew on."""
        if cls.dirty:
            cls.dirty = False
            if stream.isatty():
                stream.write("\x1b[0m\x1b[?25h")

    def __getattr__(self, name: str) -> object:  # fileno, isatty, ...
        return getattr(self.raw, name)


_WORD_MAX = 512  # bytes of a partial segment's last words held for the next chunk
_WORDS = 3  # "Authorization: token X", "aws secret 'X'": a name, a scheme, the value
_BEGIN_MAX = 96  # characters of a key block's BEGIN line ("-----BEGIN " + 64 + "-----")


def _held_from(rest: str) -> int:
    """Where the part of a partial segment that waits for the next chunk starts: a key
    block's BEGIN line not yet ended, else its last words (as many of the last three as
    fit in 512 bytes), else an escape sequence that the next chunk may complete;
    ``len(rest)`` when nothing waits."""
    begin = rest.rfind(BEGIN_MARK)
    if begin >= 0 and len(rest) - begin <= _BEGIN_MAX:
        return begin
    for start in reversed(_word_starts(rest)):  # three words, else two, else one
        if len(rest) - start <= _WORD_MAX and _fits(rest[start:]):
            return start
    esc = rest.rfind("\x1b")
    if esc >= 0 and len(rest) - esc < _HOLD and _could_grow(rest[esc:]):
        return esc
    return len(rest)


def _word_starts(rest: str) -> list[int]:
    """Where the last word of ``rest`` starts, then the one before it, ... (_WORDS)."""
    starts: list[int] = []
    at = len(rest)
    while len(starts) < _WORDS and at > 0:
        at = max(rest.rfind(" ", 0, at), rest.rfind("\t", 0, at)) + 1
        starts.append(at)
        while at > 0 and rest[at - 1] in " \t":
            at -= 1
    return starts


def _fits(text: str) -> bool:
    return len(text.encode("utf-8", errors="surrogateescape")) <= _WORD_MAX


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
