"""The board's web server (standard library ``http.server``) and its security rules.

Security model:

- Bound to 127.0.0.1 by default. A request from a peer that is not loopback is refused
  (403) unless the server was bound to another address.
- Every page needs the token (cookie, ``?token=`` or ``Authorization: Bearer``), on
  loopback too: other users of the machine reach loopback as well, and the pages show
  logs, environments, commands and run names (the runs list included). Only the
  stylesheet, the script and the favicon are served without it (:data:`ROUTES` says
  which route is which; a request without the token gets 401).
- On loopback, the ``Host`` header must name the server itself (127.0.0.1, localhost or
  [::1] with its port), so a foreign page that rebinds its DNS name to 127.0.0.1 is
  refused.
- Every POST (stop, resume, cancel, write a report) needs the token in the form, even on
  loopback, checked in constant time; its ``Origin`` (or ``Referer``) must be the
  server's own origin, and ``Sec-Fetch-Site`` must not be cross-site. A foreign page
  cannot read the token (no CORS header is ever sent), so it cannot forge the form.
- Opening ``/?token=...`` (the address ``acceptrun ui`` prints) stores the token in an
  HttpOnly, SameSite=Strict cookie; pages then fill the forms' token field themselves.
  Browsers send a cookie to every port of a host, so the board lives under a path
  prefix of its own (``/b-<hash of the token>/``, :attr:`BoardServer.prefix`) and the
  cookie's ``Path`` is that prefix: another service on another port of 127.0.0.1 is
  never sent it (it would have to be opened at that prefix, which only the printed
  address and a request carrying the token reveal). The cookie is also named per port.
  The same routes answer without the prefix to a request that carries the token in
  the query or a Bearer header (scripts, ``curl``).
- Parameters are bounded: a workspace number, a page, a step, a log offset, a run id, a
  filter that is not of its kind or size gets a 400 or 404 page naming it, never a 500.
- Every page carries a Content-Security-Policy that allows only the board's own
  stylesheet, script and feeds; nothing is fetched from elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from acceptrun._util import logpump
from acceptrun._util.confined import open_regular
from acceptrun._util.controls import control_named
from acceptrun._util.redact import learn_spec, redact_text, secret_values
from acceptrun.errors import AcceptrunError, UserError
from acceptrun.ui import pages
from acceptrun.ui.assets import BOARD_CSS, LIVE_JS
from acceptrun.ui.board import Board, RunFilter
from acceptrun.ui.limits import (
    FieldCountError,
    RequestLimits,
    check_field_count,
    report_error,
    went_away,
)

__all__ = ["PARAMS", "ROUTES", "BoardServer", "Route", "is_loopback", "make_server"]

PAGE_CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# report.html carries its styles inline and no script.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
MAX_FORM_BYTES = 64 * 1024
RESUME_LOG_DIR = "ui"  # <workspace>/ui/: output of resumes started from the board
MAX_PATH = 8 * 1024  # characters of a request's path and query (414 past it)
MAX_VALUE = 1024  # characters of one query value (a run name filter, a message)
MAX_PAGE = 100_000  # pages of the runs list (50 runs each)
MAX_OFFSET = 2**53  # bytes: a log or events offset beyond any file
MAX_COMPARE = 20  # runs one compare page overlays


@dataclass(frozen=True)
class Route:
    """One page or action of the board; :data:`ROUTES` is the whole routing table.

    ``private``: what it answers shows run data (logs, environment, commands, run names)
    or acts on a run: the token is needed even on loopback. ``query``: the query
    parameters (or headers, ``header:Name``) it reads, each bounded by :data:`PARAMS`.
    """

    method: str
    path: str  # "/run/{ws}/{run_id}/logs": {ws} a workspace number, {run_id}, {step}, {job}
    private: bool
    query: tuple[str, ...] = ()
    what: str = ""


_FLASH = ("msg", "err")
ROUTES: tuple[Route, ...] = (
    Route("GET", "/", True, ("page", "name", "status", "verdict", "since", "until", *_FLASH), "the runs list"),
    Route("GET", "/runs", True, ("page", "name", "status", "verdict", "since", "until", *_FLASH), "the runs list"),
    Route("GET", "/static/board.css", False, (), "the stylesheet"),
    Route("GET", "/static/live.js", False, (), "the script of the live pages"),
    Route("GET", "/favicon.ico", False, (), "no icon (204)"),
    Route("GET", "/run/{ws}/{run_id}", True, _FLASH, "a run: spec, command, checks, charts"),
    Route("GET", "/run/{ws}/{run_id}/stream", True, ("header:Last-Event-ID",), "a live run's feed"),
    Route("GET", "/run/{ws}/{run_id}/logs", True, (), "the run's stdout and stderr"),
    Route("GET", "/run/{ws}/{run_id}/logs/stream", True, ("offset",), "a live run's logs"),
    Route("GET", "/run/{ws}/{run_id}/report.html", True, (), "the run's report"),
    Route("GET", "/run/{ws}/{run_id}/checkpoint/{step}", True, (), "a checkpoint's manifest"),
    Route("GET", "/compare", True, ("run",), "runs overlaid"),
    Route("GET", "/queue", True, _FLASH, "the queue and pool"),
    Route("GET", "/spend", True, (), "spend by project"),
    Route("POST", "/run/{ws}/{run_id}/stop", True, (), "stop a run"),
    Route("POST", "/run/{ws}/{run_id}/resume", True, (), "resume a run"),
    Route("POST", "/run/{ws}/{run_id}/report", True, (), "write report.html"),
    Route("POST", "/queue/{ws}/{job}/cancel", True, (), "cancel a queued job"),
)  # fmt: skip
# What each parameter may be: a kind ("int" with its bounds, "text" with its length).
PARAMS: dict[str, tuple[str, int, int]] = {
    "ws": ("int", 0, 999_999),
    "step": ("int", 0, 10**18),
    "job": ("int", 0, 10**18),
    "page": ("int", 1, MAX_PAGE),
    "offset": ("int", 0, MAX_OFFSET),  # each log's offset in logs/stream (its name is the key)
    "header:Last-Event-ID": ("int", 0, MAX_OFFSET),
    "run_id": ("text", 1, 128),
    "run": ("text", 1, 140),  # "WS/RUN_ID" or "RUN_ID"
    "name": ("text", 0, 200),
    "status": ("text", 0, 40),
    "verdict": ("text", 0, 40),
    "since": ("text", 0, 40),
    "until": ("text", 0, 40),
    "msg": ("text", 0, MAX_VALUE),
    "err": ("text", 0, MAX_VALUE),
}
_PUBLIC = {r.path for r in ROUTES if not r.private}
_LINK = re.compile(r'(\s(?:href|action|src|data-stream)=")/')


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or ``localhost``."""
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    return False


class BoardServer(ThreadingHTTPServer):
    """The HTTP server of one ``acceptrun ui``: the board, its token and bind address."""

    daemon_threads = True  # an open live feed never keeps the process from exiting
    allow_reuse_address = True

    def __init__(self, board: Board, host: str, port: int, token: str) -> None:
        if not token:
            raise UserError("the board's token is empty; pass --token with a long random value")
        self.board = board
        self.token = token
        self.bind_host = host
        self.loopback_bind = is_loopback(host)
        self.stopping = threading.Event()
        super().__init__((host, port), BoardHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def cookie_name(self) -> str:
        # Cookies are shared by every port of a host: one name per board.
        return f"acceptrun_ui_{self.port}"

    @property
    def prefix(self) -> str:
        """The board's path prefix (``/b-`` and 20 hex digits), its cookie's ``Path``.

        From the token, so that a board restarted with the same token keeps its links.
        """
        digest = hashlib.sha256(b"acceptrun-ui-prefix\0" + self.token.encode()).hexdigest()
        return f"/b-{digest[:20]}"

    def cookie(self) -> str:
        """The Set-Cookie value that keeps the token for this board's pages only."""
        return f"{self.cookie_name}={self.token}; Path={self.prefix}; HttpOnly; SameSite=Strict"

    def own_hosts(self) -> set[str]:
        """Host header values naming this server on loopback."""
        names = {"127.0.0.1", "localhost", "[::1]"}
        if self.loopback_bind:
            names.add(self.bind_host)
        return {f"{n}:{self.port}" for n in names}

    def url(self) -> str:
        host = "127.0.0.1" if self.bind_host in ("0.0.0.0", "") else self.bind_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}{self.prefix}/"

    def shutdown(self) -> None:
        self.stopping.set()
        super().shutdown()

    def handle_error(self, request: Any, client_address: Any) -> None:
        report_error(client_address)  # one line, never a traceback (ui/limits.py)


def make_server(
    board: Board, host: str = "127.0.0.1", port: int = 0, token: str = ""
) -> BoardServer:
    """A board server bound to ``host:port`` (0: a free port); ``serve_forever`` runs it."""
    try:
        return BoardServer(board, host, port, token)
    except OSError as exc:
        raise UserError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
            "choose another port with --port N (--port 0 picks a free one)"
        ) from None


class Refused(Exception):
    """A request the security rules refuse: its status and the reason shown."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class BoardHandler(RequestLimits):
    server: BoardServer
    server_version = "acceptrun-ui"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("ACCEPTRUN_UI_ACCESS_LOG"):
            super().log_message(format, *args)

    # ---- security ---------------------------------------------------------------------------

    def _has_token(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.server.token.encode())

    def _cookie_token(self) -> str | None:
        jar: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            jar.load(self.headers.get("Cookie", ""))
        morsel = jar.get(self.server.cookie_name)
        return None if morsel is None else morsel.value

    def _authorized(self, query: dict[str, list[str]]) -> bool:
        bearer = self.headers.get("Authorization", "")
        return (
            self._has_token(self._cookie_token())
            or self._has_token(_first(query, "token"))
            or (bearer.startswith("Bearer ") and self._has_token(bearer[7:].strip()))
        )

    def _guard(self, query: dict[str, list[str]]) -> bool:
        """Check peer, Host and token; returns whether the request carries the token."""
        peer = str(self.client_address[0])
        if self.server.loopback_bind and not is_loopback(peer):
            raise Refused(
                403, f"requests from {peer} are refused: this board listens on loopback only"
            )
        host = self.headers.get("Host", "")
        if self.server.loopback_bind and host not in self.server.own_hosts():
            raise Refused(403, f"Host {host!r} is not this board; open {self.server.url()}")
        authorized = self._authorized(query)
        if not self.server.loopback_bind and not authorized:
            raise Refused(
                401,
                "this board needs its token: open the address `acceptrun ui` printed (…/?token=…)",
            )
        return authorized

    def _check_post(self, form: dict[str, list[str]]) -> None:
        """The CSRF rules of every state-changing request."""
        if self.headers.get("Sec-Fetch-Site", "") == "cross-site":
            raise Refused(403, "a form from another site cannot act on this board")
        host = self.headers.get("Host", "")
        origin = self.headers.get("Origin")
        if origin is None and self.headers.get("Referer"):
            parts = urlsplit(self.headers["Referer"])
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin is not None and origin != f"http://{host}":
            raise Refused(
                403, f"Origin {origin!r} is not this board (http://{host}); nothing was done"
            )
        if not self._has_token(_first(form, "token")):
            raise Refused(
                403,
                "this action needs the board's token (printed by `acceptrun ui`); nothing was done",
            )

    # ---- plumbing ---------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None,
              csp: str = PAGE_CSP) -> None:  # fmt: skip
        body = _redacted(body, ctype, self.server.token)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self._security_headers(csp)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _security_headers(self, csp: str) -> None:
        self.send_header("Content-Security-Policy", csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Cache-Control", "no-store")

    _shows_prefix = False  # a request under the prefix that proved it holds the token

    def _html(self, text: str, status: int = 200) -> None:
        if self._shows_prefix:
            # Links keep the browser under the prefix, where its cookie is sent; a page
            # for a request without the token never names the prefix.
            text = _LINK.sub(lambda m: m.group(1) + self.server.prefix + "/", text)
        self._send(status, text.encode(), "text/html; charset=utf-8")

    def _redirect(self, location: str, headers: dict[str, str] | None = None) -> None:
        if self._shows_prefix and location.startswith("/"):
            location = self.server.prefix + location
        self._send(303, b"", "text/plain", {"Location": location, **(headers or {})})

    def _error(self, status: int, message: str) -> None:
        self._html(pages.error_page(status, message), status)

    def _stream(self, feed: Iterator[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self._security_headers(PAGE_CSP)
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in feed:
                self.wfile.write(_redacted(chunk, "text/event-stream", self.server.token))
                self.wfile.flush()
        except OSError as exc:  # the browser left the page
            went_away(self.client_address, exc)

    # ---- requests ---------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        self._shows_prefix = False
        try:
            if len(self.path) > MAX_PATH:
                raise Refused(
                    414, f"the address is {len(self.path)} characters long (at most {MAX_PATH})"
                )
            url = urlsplit(self.path)
            check_field_count(url.query, "the query")
            query = parse_qs(url.query)
            path, prefixed = url.path, False
            if path == self.server.prefix or path.startswith(self.server.prefix + "/"):
                path, prefixed = path[len(self.server.prefix) :] or "/", True
            parts = [unquote(p) for p in path.split("/")[1:]]
            authorized = self._guard(query)
            # Links follow the address used: under the prefix for a browser (its cookie),
            # as they are for a script that sends the token itself.
            self._shows_prefix = authorized and prefixed
            if method == "POST":
                text = self.headers.get("Content-Length") or "0"
                if not text.isdigit() or len(text) > 12:
                    raise Refused(400, f"Content-Length {text[:40]!r} is not a byte count")
                if int(text) > MAX_FORM_BYTES:
                    raise Refused(413, "form too large")
                body = self.rfile.read(int(text)).decode("utf-8", errors="replace")
                check_field_count(body, "the form")
                form = parse_qs(body)
                self._check_post(form)
                self._post(parts, form)
                return
            if "token" in query and self._has_token(query["token"][0]):
                # Keep the token in a cookie and drop it from the address bar and history.
                rest = urlencode({k: v for k, v in query.items() if k != "token"}, doseq=True)
                self._shows_prefix = True  # the cookie is sent under the prefix only
                where = path + (f"?{rest}" if rest else "")
                self._redirect(where, {"Set-Cookie": self.server.cookie()})
                return
            if not authorized and "/" + "/".join(parts) not in _PUBLIC:
                raise Refused(
                    401,
                    "this board needs its token: open the address `acceptrun ui` printed "
                    "(…/?token=…), or send it as `Authorization: Bearer TOKEN`",
                )
            _check_query(query)
            token = self.server.token if authorized else None
            self._get(parts, query, token)
        except Refused as exc:
            self._error(exc.status, str(exc))
        except FieldCountError as exc:
            self._error(400, str(exc))
        except AcceptrunError as exc:
            self._error(404, f"{type(exc).__name__}: {exc}")
        except OSError as exc:  # the client reset the connection while we answered
            went_away(self.client_address, exc)
        except Exception as exc:  # one broken record must not take the board down
            self._error(500, f"{type(exc).__name__}: {exc}")

    def _get(self, parts: list[str], query: dict[str, list[str]], token: str | None) -> None:
        board = self.server.board
        one = {k: v[0] for k, v in query.items() if v}
        if len(parts) >= 3 and parts[0] == "run":
            _learn_secrets(board.record(_int(parts[1]), parts[2]))
        match parts:
            case [""] | ["runs"]:
                flt = RunFilter(
                    **{k: one.get(k, "") for k in ("name", "status", "verdict", "since", "until")}
                )
                page = _bounded("page", one["page"]) if "page" in one else 1
                self._html(_flash(pages.runs_page(board, flt, page), one))
            case ["static", "board.css"]:
                self._send(200, BOARD_CSS.encode(), "text/css; charset=utf-8")
            case ["static", "live.js"]:
                self._send(200, LIVE_JS.encode(), "text/javascript; charset=utf-8")
            case ["run", ws, run_id]:
                record = board.record(_int(ws), run_id)
                self._html(_flash(pages.run_page(board, _int(ws), record, token), one))
            case ["run", ws, run_id, "stream"]:
                from acceptrun.ui.live import run_feed

                record = board.record(_int(ws), run_id)
                last = self.headers.get("Last-Event-ID", "")
                offset = _bounded("header:Last-Event-ID", last) if last else 0
                self._stream(
                    run_feed(record, offset, self.server.stopping.is_set, first=not last.isdigit())
                )
            case ["run", ws, run_id, "logs"]:
                self._html(pages.logs_page(_int(ws), board.record(_int(ws), run_id)))
            case ["run", ws, run_id, "logs", "stream"]:
                from acceptrun.ui.live import log_feed

                record = board.record(_int(ws), run_id)
                offsets = {k: _bounded("offset", v, name=f"offset {k!r}") for k, v in one.items()}
                self._stream(log_feed(record, offsets, self.server.stopping.is_set))
            case ["run", ws, run_id, "report.html"]:
                record = board.record(_int(ws), run_id)
                path = record.file("report.html")
                if not os.path.lexists(path):
                    raise UserError(
                        f"run {run_id} has no report.html yet; write it from the run's page"
                    )
                with open_regular(path, root=record.path) as f:  # a link: refused, unread
                    html = f.read()
                self._send(200, html, "text/html; charset=utf-8", csp=REPORT_CSP)
            case ["run", ws, run_id, "checkpoint", step]:
                record = board.record(_int(ws), run_id)
                self._html(pages.checkpoint_page(_int(ws), record, _bounded("step", step, 404)))
            case ["compare"]:
                if len(query.get("run", [])) > MAX_COMPARE:
                    raise Refused(400, f"run: at most {MAX_COMPARE} runs on one compare page")
                refs = [_ref(r) for r in query.get("run", [])]
                from acceptrun.ui.compare import compare_page

                self._html(compare_page(board, refs))
            case ["queue"]:
                from acceptrun.ui.pool import queue_page

                self._html(_flash(queue_page(board, token), one))
            case ["spend"]:
                from acceptrun.ui.spend import spend_page

                self._html(spend_page(board))
            case ["favicon.ico"]:
                self._send(204, b"", "image/x-icon")
            case _:
                self._error(404, f"no page {self.path.split('?')[0]!r}; the runs page is at /")

    def _post(self, parts: list[str], form: dict[str, list[str]]) -> None:
        board = self.server.board
        match parts:
            case ["run", ws, run_id, "stop"]:
                from acceptrun.run.lifecycle import request_stop, stop_promise

                record = board.record(_int(ws), run_id)
                try:
                    pid = request_stop(record, "stop", reason="from acceptrun ui")
                    msg = f"stop sent to run {run_id} (supervisor pid {pid}): {stop_promise(record, 'stop')}"
                    self._redirect(pages.run_url(_int(ws), run_id) + "?" + urlencode({"msg": msg}))
                except UserError as exc:
                    self._redirect(
                        pages.run_url(_int(ws), run_id) + "?" + urlencode({"err": str(exc)})
                    )
            case ["run", ws, run_id, "resume"]:
                record = board.record(_int(ws), run_id)
                log = _start_resume(board.workspace(_int(ws)).root, record.run_id)
                msg = f"`acceptrun resume {run_id}` started in the background; its output goes to {log}"
                self._redirect(pages.run_url(_int(ws), run_id) + "?" + urlencode({"msg": msg}))
            case ["run", ws, run_id, "report"]:
                from acceptrun.report.html import write_report

                path = write_report(board.record(_int(ws), run_id))
                self._redirect(
                    pages.run_url(_int(ws), run_id) + "?" + urlencode({"msg": f"wrote {path}"})
                )
            case ["queue", ws, job, "cancel"]:
                _bounded("job", job, 404)
                root = board.workspace(_int(ws)).root
                proc = subprocess.run(
                    [sys.executable, "-m", "acceptrun", "--workspace", str(root), "cancel", job],
                    capture_output=True, text=True, timeout=120, check=False,
                )  # fmt: skip
                text = (
                    proc.stdout + proc.stderr
                ).strip() or f"acceptrun cancel exited {proc.returncode}"
                key = "msg" if proc.returncode == 0 else "err"
                self._redirect("/queue?" + urlencode({key: text}))
            case _:
                self._error(404, f"no action {self.path!r}")


def _flash(page: str, one: dict[str, str]) -> str:
    """Show a ``msg`` or ``err`` from the redirect after an action (escaped like all text)."""
    import html

    for key, cls in (("msg", "flash"), ("err", "flash err")):
        if one.get(key):
            note = f'<main>\n<p class="{cls}">{html.escape(one[key])}</p>'
            return page.replace("<main>", note, 1)
    return page


def _first(values: dict[str, list[str]], key: str) -> str | None:
    got = values.get(key)
    return got[0] if got else None


def _int(text: str) -> int:
    """A workspace number from the path (404 for anything else)."""
    return _bounded("ws", text, 404, name="workspace number")


def _bounded(param: str, text: str, status: int = 400, *, name: str = "") -> int:
    """``text`` as the integer :data:`PARAMS` allows for ``param``; else ``status``, naming it."""
    _, low, high = PARAMS[param]
    what = name or param.removeprefix("header:")
    shown = repr(text[:40]) + ("…" if len(text) > 40 else "")
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(high)):
        raise Refused(status, f"{what}: {shown} is not a whole number from {low} to {high}")
    value = int(text)
    if not low <= value <= high:
        raise Refused(status, f"{what}: {value} is out of range ({low} to {high})")
    return value


def _check_query(query: dict[str, list[str]]) -> None:
    """Text parameters are bounded and printable: a 400 naming the first one that is not."""
    for key, values in query.items():
        _, _, high = PARAMS.get(key, ("text", 0, MAX_VALUE))
        for value in values:
            if len(value) > high:
                raise Refused(400, f"{key[:40]!r}: {len(value)} characters (at most {high})")
            if found := control_named(value.replace("\t", " ")):
                raise Refused(
                    400, f"{key[:40]!r}: control characters are not allowed ({found}); remove it"
                )


def _ref(text: str) -> tuple[int, str]:
    """``"0/20261130-101500-bert-3f2a"``: a run on the board (workspace number, run id)."""
    ws, _, run_id = text.partition("/")
    if not run_id:
        ws, run_id = "0", text
    return _int(ws), run_id


def _start_resume(workspace_root: Path, run_id: str) -> Path:
    """Start ``acceptrun resume RUN`` detached (own session, survives the board); its log."""
    logs = workspace_root / RESUME_LOG_DIR
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"resume-{run_id}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    pump = logpump.start(log)  # its output reaches the log through the redactor
    try:
        subprocess.Popen(
            [sys.executable, "-m", "acceptrun", "--workspace", str(workspace_root), "resume", "-q", run_id],
            stdin=subprocess.DEVNULL, stdout=pump.stdin, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=workspace_root,
        )  # fmt: skip
    finally:
        if pump.stdin is not None:
            pump.stdin.close()  # the resume holds the pipe now
    return log


def _learn_secrets(record: Any) -> None:
    """Learn a run's spec secrets (a mirror or data URL's password) before any of its
    pages: its logs quote the workload's output as written, which may hold them bare."""
    import tomllib

    from acceptrun.spec.load import loads_toml

    # No readable spec: the run page says so; the known forms and the environment still apply.
    # A link, a FIFO: refused unread (an OSError), never followed nor waited on.
    with contextlib.suppress(OSError, ValueError, tomllib.TOMLDecodeError):
        learn_spec(loads_toml(record.read_text("spec.toml")))


def _redacted(body: bytes, ctype: str, token: str) -> bytes:
    """A response body through the redactor (every page, log view and JSON answer).

    The board's own token is no secret to hide from a page that proved it holds it (the
    forms carry it); every other known value and form is.
    """
    if not body or not ctype.startswith(("text/", "application/json", "image/svg")):
        return body
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", errors="replace")
    return redact_text(text, [v for v in secret_values() if v != token]).encode()
