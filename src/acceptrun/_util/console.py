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
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager

__all__ = [
    "LOGGER_NAME",
    "ConsoleHandler",
    "collect_messages",
    "configure_console",
    "format_table",
    "get_logger",
    "quieted",
    "remove_console",
]

LOGGER_NAME = "acceptrun"


class ConsoleHandler(logging.Handler):
    """``acceptrun: <message>`` on the standard error of the moment, flushed at once.

    The stream is looked up at each message, not at creation, so a redirected
    ``sys.stderr`` (pytest's capture, a worker's log file) gets the lines.
    """

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("acceptrun: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
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
