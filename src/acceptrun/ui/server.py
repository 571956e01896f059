"""The board's web server (standard library ``http.server``) and its security rules.

Security model:

- Bound to 127.0.0.1 by default. A request from a peer that is not loopback is refused
  (403) unless the server was bound to another address, and then every request must
  carry the token (cookie, ``?token=`` or ``Authorization: Bearer``).
- On loopback, the ``Host`` header must name the server itself (127.0.0.1, localhost or
  [::1] with its port), so a foreign page that rebinds its DNS name to 127.0.0.1 is
  refused.
- Every POST (stop, resume, cancel, write a report) needs the token in the form, even on
  loopback, checked in constant time; its ``Origin`` (or ``Referer``) must be the
  server's own origin, and ``Sec-Fetch-Site`` must not be cross-site. A foreign page
  cannot read the token (no CORS header is ever sent), so it cannot forge the form.
- Opening ``/?token=...`` (the address ``acceptrun ui`` prints) stores the token in an
  HttpOnly, SameSite=Strict cookie; pages then fill the forms' token field themselves.
- Every page carries a Content-Security-Policy that allows only the board's own
  stylesheet, script and feeds; nothing is fetched from elsewhere.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from acceptrun.errors import AcceptrunError, UserError
from acceptrun.ui import pages
from acceptrun.ui.assets import BOARD_CSS, LIVE_JS
from acceptrun.ui.board import Board, RunFilter

__all__ = ["BoardServer", "is_loopback", "make_server"]

PAGE_CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# report.html carries its styles inline and no script.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
MAX_FORM_BYTES = 64 * 1024
RESUME_LOG_DIR = "ui"  # <workspace>/ui/: output of resumes started from the board


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
        return f"http://{host}:{self.port}/"

    def shutdown(self) -> None:
        self.stopping.set()
        super().shutdown()


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


class BoardHandler(BaseHTTPRequestHandler):
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

    def _html(self, text: str, status: int = 200) -> None:
        self._send(status, text.encode(), "text/html; charset=utf-8")

    def _redirect(self, location: str, headers: dict[str, str] | None = None) -> None:
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
                self.wfile.write(chunk)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the browser left the page

    # ---- requests ---------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        try:
            authorized = self._guard(query)
            if method == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_FORM_BYTES:
                    raise Refused(413, "form too large")
                form = parse_qs(self.rfile.read(length).decode("utf-8", errors="replace"))
                self._check_post(form)
                self._post([unquote(p) for p in url.path.split("/")[1:]], form)
                return
            if "token" in query and self._has_token(query["token"][0]):
                # Keep the token in a cookie and drop it from the address bar and history.
                rest = urlencode({k: v for k, v in query.items() if k != "token"}, doseq=True)
                cookie = f"{self.server.cookie_name}={self.server.token}; Path=/; HttpOnly; SameSite=Strict"
                self._redirect(url.path + (f"?{rest}" if rest else ""), {"Set-Cookie": cookie})
                return
            token = self.server.token if authorized else None
            self._get([unquote(p) for p in url.path.split("/")[1:]], query, token)
        except Refused as exc:
            self._error(exc.status, str(exc))
        except AcceptrunError as exc:
            self._error(404, f"{type(exc).__name__}: {exc}")
        except (BrokenPipeError, ConnectionResetError):
            return
        except Exception as exc:  # one broken record must not take the board down
            self._error(500, f"{type(exc).__name__}: {exc}")

    def _get(self, parts: list[str], query: dict[str, list[str]], token: str | None) -> None:
        board = self.server.board
        one = {k: v[0] for k, v in query.items() if v}
        match parts:
            case [""] | ["runs"]:
                flt = RunFilter(
                    **{k: one.get(k, "") for k in ("name", "status", "verdict", "since", "until")}
                )
                page = int(one["page"]) if one.get("page", "").isdigit() else 1
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
                offset = int(last) if last.isdigit() else 0
                self._stream(
                    run_feed(record, offset, self.server.stopping.is_set, first=not last.isdigit())
                )
            case ["run", ws, run_id, "logs"]:
                self._html(pages.logs_page(_int(ws), board.record(_int(ws), run_id)))
            case ["run", ws, run_id, "logs", "stream"]:
                from acceptrun.ui.live import log_feed

                record = board.record(_int(ws), run_id)
                offsets = {k: int(v) for k, v in one.items() if v.isdigit()}
                self._stream(log_feed(record, offsets, self.server.stopping.is_set))
            case ["run", ws, run_id, "report.html"]:
                path = board.record(_int(ws), run_id).file("report.html")
                if not path.is_file():
                    raise UserError(
                        f"run {run_id} has no report.html yet; write it from the run's page"
                    )
                self._send(200, path.read_bytes(), "text/html; charset=utf-8", csp=REPORT_CSP)
            case ["run", ws, run_id, "checkpoint", step] if step.isdigit():
                record = board.record(_int(ws), run_id)
                self._html(pages.checkpoint_page(_int(ws), record, int(step)))
            case ["compare"]:
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
            case ["queue", ws, job, "cancel"] if job.isdigit():
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
    if not text.isdigit():
        raise UserError(f"{text!r} is not a workspace number")
    return int(text)


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
    with open(log, "ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "acceptrun", "--workspace", str(workspace_root), "resume", "-q", run_id],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=workspace_root,
        )  # fmt: skip
    return log
