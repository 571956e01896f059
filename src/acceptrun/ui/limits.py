"""What the board refuses before it routes a request, and how a client that left is told.

Every request the board refuses gets a 4xx naming what was wrong, never a 500 and never
a traceback on the terminal of ``acceptrun ui``:

* a request line over 64 KiB: 414; more than 100 headers, or a header line over 64 KiB:
  431 (both ``http.server``'s own limits);
* an address over 8 KiB: 414; a parameter too long or holding a control or bidi
  character: 400 (:mod:`acceptrun.ui.server`);
* a query or a form of more than :data:`MAX_FIELDS` parameters: 400
  (:func:`check_field_count`);
* a GET or HEAD with a body: 400; a method other than GET, HEAD and POST: 405
  (:meth:`RequestLimits.parse_request`).

A client that goes away (closes the connection in the middle of its request, resets it
while the answer is being written, or lets :data:`REQUEST_TIMEOUT_S` pass) is said in one
line, ``acceptrun: board: client 127.0.0.1:PORT went away (ConnectionResetError: ...)``:
:meth:`RequestLimits.handle_one_request` for the request's own thread,
:func:`report_error` for what ``socketserver`` would print as a traceback.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler
from typing import Any

from acceptrun._util.console import get_logger

__all__ = [
    "MAX_FIELDS",
    "REQUEST_TIMEOUT_S",
    "FieldCountError",
    "RequestLimits",
    "check_field_count",
    "report_error",
    "went_away",
]

MAX_FIELDS = 200  # parameters of one query or form: the widest page reads 7
# Seconds a client may take to send its request (and to read each write of the answer):
# a connection left half-open then frees its thread. A live feed writes at least every
# few seconds, so a browser that reads it never meets it.
REQUEST_TIMEOUT_S = 60.0
METHODS = ("GET", "HEAD", "POST")

_log = get_logger(__name__)


class FieldCountError(ValueError):
    """A query or a form with more parameters than :data:`MAX_FIELDS`."""


def check_field_count(text: str, what: str) -> None:
    """Raise :class:`FieldCountError` naming ``what`` ("the query", "the form") when
    ``text`` (``a=1&b=2``) holds more than :data:`MAX_FIELDS` parameters."""
    count = text.count("&") + 1 if text else 0
    if count > MAX_FIELDS:
        raise FieldCountError(
            f"{what} has {count} parameters (at most {MAX_FIELDS}); "
            "a page of the board reads a handful"
        )


def went_away(client_address: Any, why: BaseException | str) -> None:
    """One line for a client that left mid-request or mid-answer (no traceback)."""
    host, port = [*client_address, "?", "?"][:2]
    reason = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
    _log.info(f"board: client {host}:{port} went away ({reason})")


def report_error(client_address: Any) -> None:
    """``socketserver``'s ``handle_error`` (it prints a traceback): one line instead,
    for the exception being handled."""
    exc = sys.exc_info()[1]
    if exc is None or isinstance(exc, OSError):  # reset, broken pipe, timed out
        went_away(client_address, exc or "connection closed")
        return
    host, port = [*client_address, "?", "?"][:2]
    _log.warning(f"board: a request from {host}:{port} failed: {type(exc).__name__}: {exc}")


class RequestLimits(BaseHTTPRequestHandler):
    """The refusals of the module docstring that come before routing, for the board's
    handler (``class BoardHandler(RequestLimits)``)."""

    timeout = REQUEST_TIMEOUT_S
    raw_requestline: bytes  # set by http.server before parse_request

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except OSError as exc:  # the client reset the connection or stopped reading
            went_away(self.client_address, exc)
            self.close_connection = True

    def log_error(self, format: str, *args: Any) -> None:
        if format.startswith("Request timed out"):  # http.server's words for the timeout
            went_away(self.client_address, f"sent no request for {REQUEST_TIMEOUT_S:.0f} s")
            return
        super().log_error(format, *args)

    def parse_request(self) -> bool:
        if not self.raw_requestline.endswith(b"\n"):
            # The connection ended inside the request line: nobody is left to answer.
            went_away(self.client_address, "closed a half-sent request")
            self.close_connection = True
            return False
        if not super().parse_request():
            return False
        if self.command not in METHODS:
            why = f"method {self.command[:20]!r}: the board answers GET, HEAD and POST"
            self.send_error(405, "Method Not Allowed", why)
            return False
        body = self.headers.get("Content-Length", "0").strip() not in ("", "0")
        if self.command in ("GET", "HEAD") and (body or "Transfer-Encoding" in self.headers):
            why = f"a {self.command} request carries no body; send it without one"
            self.send_error(400, "Bad Request", why)
            return False
        return True
