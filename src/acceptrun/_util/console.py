"""The ``acceptrun`` logger: what the library tells a person running it.

Modules log to their own child logger (``get_logger(__name__)``, for example
``acceptrun.run.close``): ``info`` for progress a person at the terminal follows,
``warning`` for something that went wrong but did not stop the work. ``acceptrun`` (the
CLI) calls :func:`configure_console`, which prints each message as ``acceptrun:
<message>`` on the standard error, the lines the CLI always printed::

    log = get_logger(__name__)
    log.info("worker w1: started")   # acceptrun: worker w1: started

A program that configures nothing (a training script closing its standalone run) sees
warnings only, through Python's last-resort handler on standard error, and info lines
only if it turns logging on itself: the library never prints progress unasked.

To collect the messages instead (a test, a caller writing its own log), attach a handler
for the time of a call with :func:`collect_messages`.

Control characters: every line acceptrun prints goes through :class:`RedactingStream`,
which redacts it and then shows control and bidi characters as escapes
(:func:`acceptrun._util.controls.escape_controls`). The stream is the one edge every
``print``, log line and argparse error crosses, and it cannot tell a value from the
text around it; so it escapes everything, and the few places that draw on a terminal
themselves (``top``'s live table, the queue's colours: Rich on a terminal) write through
:func:`styled` (redacted, not escaped) and escape their values with ``escape_controls``
when they format them. The workload's live echo goes through ``.buffer``
(:class:`~acceptrun._util.controls.LiveEcho`): redacted as well, then progress bars
and colours pass, titles, clipboard writes, screen clears and bidi do not. ``acceptrun logs --raw`` writes the
workload's bytes through :func:`raw_binary`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, TextIO

from acceptrun._util.controls import LiveEcho, escape_controls
from acceptrun._util.keyblock import KeyBlocks
from acceptrun._util.redact import redact_text

__all__ = [
    "LOGGER_NAME",
    "ConsoleHandler",
    "RedactingStream",
    "collect_messages",
    "configure_console",
    "format_table",
    "get_logger",
    "quieted",
    "raw_binary",
    "redact_streams",
    "remove_console",
    "restore_streams",
    "rich_cell",
    "show_secret",
    "styled",
]

LOGGER_NAME = "acceptrun"


class RedactingStream:
    """A text stream that redacts what is written to it, line by line, shows its control
    characters as escapes, then passes it on.

    The CLI wraps its standard output and error in one (:func:`redact_streams`), so every
    ``print`` of every command is redacted and escaped at the edge. A partial line is held
    until its newline (or ``\r``, or a flush): ``print("--token", "X")`` writes its words
    one call at a time, and a form is only seen whole. A key block printed a line per
    write (``acceptrun logs``) is held from its BEGIN line to its END line and redacted
    whole (:class:`~acceptrun._util.keyblock.KeyBlocks`, at most 64 KiB held), across
    flushes too; :meth:`finish` releases what is held. ``.buffer`` is the stream's own
    binary buffer, flushed first, behind a :class:`~acceptrun._util.controls.LiveEcho`:
    the supervisor echoes the workload's own output through it (its progress bars and
    colours pass, see the module docstring). ``escape=False``: redacted only
    (:func:`styled`).
    """

    def __init__(self, stream: TextIO, *, escape: bool = True) -> None:
        self.stream = stream
        self._held = ""  # a partial line
        self._blocks = KeyBlocks()  # a key block printed a line per write, held whole
        self._escape = escape

    def _out(self, text: str) -> None:
        text = self._blocks.text(text)
        if text:
            LiveEcho.reset(self.stream)  # a workload's colour must not hide acceptrun's lines
            self.stream.write(escape_controls(text) if self._escape else text)

    def write(self, text: str) -> int:
        held = self._held + text
        cut = max(held.rfind("\n"), held.rfind("\r")) + 1
        self._held = held[cut:]
        if cut:
            self._out(held[:cut])
        if len(self._held) > 1 << 16:  # no newline for 64 KiB: not a line to wait for
            held, self._held = self._held, ""
            self._out(held)
        return len(text)

    def flush(self) -> None:
        """Pass on the partial line, unless a key block is held: a block is only shown
        whole, at its END line (or past 64 KiB, or at :meth:`finish`)."""
        if self._held and not self._blocks.holding:
            held, self._held = self._held, ""
            self._out(held)
        self.stream.flush()

    def finish(self) -> None:
        """Pass on all that is held, a key block cut short included (as its BEGIN line and
        ``<redacted>``): nothing more will be written."""
        held, self._held = self._held, ""
        if held:
            self._out(held)
        tail = self._blocks.close()
        if tail:
            self.stream.write(escape_controls(tail) if self._escape else tail)
        self.stream.flush()

    @property
    def buffer(self) -> Any:
        self.flush()
        return LiveEcho(self.stream.buffer)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self.stream, name)


def redact_streams() -> tuple[TextIO, TextIO]:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`RedactingStream`; returns the
    streams they replaced, for :func:`restore_streams`."""
    old = (sys.stdout, sys.stderr)
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)
    return old


def restore_streams(old: tuple[TextIO, TextIO]) -> None:
    """Finish the redacting streams and put back the ones :func:`redact_streams` replaced."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, RedactingStream):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to say
                stream.finish()
    sys.stdout, sys.stderr = old


def styled(stream: TextIO | None = None) -> TextIO:
    """``stream`` (default ``sys.stdout``) redacted but not escaped: for a Rich console
    that draws on a terminal (colours, a live table). Its caller escapes the values it
    puts in (:func:`acceptrun._util.controls.escape_controls`)."""
    out = sys.stdout if stream is None else stream
    if isinstance(out, RedactingStream):
        out.flush()
        return RedactingStream(out.stream, escape=False)  # type: ignore[return-value]
    return out


def raw_binary(stream: IO[str] | None = None) -> Any:
    """The binary buffer under ``stream`` (default ``sys.stdout``), past the redactor and
    the escapes: for ``acceptrun logs --raw``, the workload's own bytes as it wrote them."""
    out: Any = sys.stdout if stream is None else stream
    if isinstance(out, RedactingStream):
        out.flush()
        out = out.stream
    out.flush()
    return out.buffer


def show_secret(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` past the redactor: for the one line whose point is to show its
    owner a secret acceptrun made (the board's token, printed by ``acceptrun ui``)."""
    out = sys.stdout if stream is None else stream
    if isinstance(out, RedactingStream):
        out.flush()
        out = out.stream
    out.write(text + "\n")
    out.flush()


class ConsoleHandler(logging.Handler):
    """``acceptrun: <message>`` on the standard error of the moment, flushed at once,
    redacted (:mod:`acceptrun._util.redact`).

    The stream is looked up at each message, not at creation, so a redirected
    ``sys.stderr`` (pytest's capture, a worker's log file) gets the lines.
    """

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("acceptrun: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(escape_controls(redact_text(self.format(record))) + "\n")
            stream.flush()
        except Exception:  # logging's own rule: a failed print must not kill the caller
            self.handleError(record)


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``), a child of ``acceptrun``."""
    return logging.getLogger(name)


def configure_console(level: int = logging.INFO) -> logging.Logger:
    """Print the ``acceptrun`` logger's messages (``level`` and up) on standard error.

    Called once by the CLI; calling it again changes the level, never adds a second
    handler (which would print every line twice).
    """
    logger = logging.getLogger(LOGGER_NAME)
    handler = next((h for h in logger.handlers if isinstance(h, ConsoleHandler)), None)
    if handler is None:
        handler = ConsoleHandler()
        logger.addHandler(handler)
    handler.setLevel(level)
    logger.setLevel(min(level, logger.level or level))
    # The CLI owns the terminal: a root handler set by another library must not print
    # each line a second time in its own format.
    logger.propagate = False
    return logger


def remove_console() -> None:
    """Undo :func:`configure_console`: the CLI calls it when a command returns, so a
    program that runs ``main()`` in-process (a test, a notebook) gets its logging back
    as it was, with no ``acceptrun: ...`` lines from later library calls."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
        logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


class _ListHandler(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def collect_messages(level: int = logging.INFO) -> Iterator[list[str]]:
    """Collect the ``acceptrun`` logger's messages (without the prefix) while inside.

    >>> with collect_messages() as said:
    ...     get_logger("acceptrun.run.close").warning("cleanup: rm -rf tmp failed: exit 1")
    >>> said
    ['cleanup: rm -rf tmp failed: exit 1']
    """
    logger = logging.getLogger(LOGGER_NAME)
    messages: list[str] = []
    handler = _ListHandler(messages)
    handler.setLevel(level)
    previous = logger.level
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@contextmanager
def quieted(level: int = logging.WARNING) -> Iterator[None]:
    """Hide the ``acceptrun`` logger's messages below ``level`` while inside.

    For a command that runs others and shows only its own progress (``acceptrun
    scaling`` without ``--verbose``): warnings still get through.
    """
    logger = logging.getLogger(LOGGER_NAME)
    previous = logger.level
    logger.setLevel(max(level, previous))
    try:
        yield
    finally:
        logger.setLevel(previous)


# ---- tables ------------------------------------------------------------------------------


def rich_cell(value: object, style: str = "") -> Any:
    """``value`` as a cell of a Rich table drawn on a terminal (:func:`styled`): a
    ``Text``, which Rich never reads as markup (a job named ``[link=...]x[/link]`` or a
    note holding ``[/]`` is shown as typed, not made a link nor a MarkupError), its
    control characters shown as escapes; ``style`` is acceptrun's own colour for it."""
    from rich.text import Text

    return Text(escape_controls(str(value)), style=style)


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, right: Collection[str] = ()
) -> str:
    """Rows under their headers as plain text: each column as wide as its widest cell.

    Columns are two spaces apart, the ones named in ``right`` right-aligned (numbers);
    no line ends in spaces, and nothing is cut or wrapped, so ``line.split()`` and
    ``grep`` read it the same in a terminal, a pipe or a test. Widths count what a
    terminal shows (rich measures wide characters and emoji as two cells).

    >>> print(format_table(["RUN", "STEPS"], [["a", 10], ["b-long", 7]], right={"STEPS"}))
    RUN     STEPS
    a          10
    b-long      7
    """
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="")
    for name in headers:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    out = io.StringIO()
    # Wide enough never to wrap; no colour, markup or highlighting: the text as given.
    console = Console(file=out, width=1 << 16, color_system=None, markup=False, highlight=False,
                      emoji=False, soft_wrap=False)  # fmt: skip
    console.print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
