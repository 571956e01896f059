"""The board's token cookie never reaches another service on another port of 127.0.0.1.

Cookies ignore ports: a cookie set by the board at ``Path=/`` would be sent to every
server of the host. The board scopes it to its own path prefix. A second HTTP server on
another loopback port records every Cookie header it is sent, while a client that opened
the board (the headless Chromium the suite uses, and the standard library's cookie jar,
which applies the same RFC 6265 rules) visits it.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from http.cookiejar import CookieJar
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tests.campaign import tally

from acceptrun.record.workspace import Workspace
from acceptrun.ui import Board
from conftest import chromium_driver, wait_for
from ui_served import TOKEN, Served

# Paths of the other service a client is sent to: its root, the board's own routes, and
# a prefix of the board's shape that is not this board's.
OTHER_PATHS = ("/", "/run/0/x", "/static/board.css", "/b-00000000000000000000/")


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Cookie", "")))
        body = b"<html><body>other service</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[Served, ThreadingHTTPServer]]:
    ws = Workspace.create(tmp_path / "ws")
    ws.create_run(
        "auth", spec_text='name = "auth"\ncommand = ["true"]\n',
        state={"status": "finished", "verdict": "accepted"},
    )  # fmt: skip
    board = Served(Board.for_workspaces([ws]))
    _Recorder.seen = []
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        yield board, other
    finally:
        other.shutdown()
        other.server_close()
        board.close()


def _leaked(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(p, c) for p, c in seen if TOKEN in c or "acceptrun_ui" in c]


def test_a_cookie_jar_sends_the_token_to_the_board_only(
    services: tuple[Served, ThreadingHTTPServer],
) -> None:
    board, other = services
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{board.base}/?token={TOKEN}", timeout=60) as resp:
        assert resp.status == 200 and resp.url == f"{board.board}/"  # followed the 303
        assert "run(s)" in resp.read().decode()
    (cookie,) = list(jar)
    assert cookie.path == board.server.prefix and cookie.value == TOKEN
    # The jar sends it back under the prefix: the board's pages open with it alone.
    with opener.open(f"{board.board}/spend", timeout=60) as resp:
        assert resp.status == 200
    port = other.server_address[1]
    for path in OTHER_PATHS:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
            assert resp.status == 200
    assert len(_Recorder.seen) == len(OTHER_PATHS)
    assert _leaked(_Recorder.seen) == []
    tally("board routes without token", tried=len(OTHER_PATHS), secrets=0)


@pytest.mark.slow
def test_chromium_sends_the_token_to_the_board_only(
    services: tuple[Served, ThreadingHTTPServer], tmp_path: Path
) -> None:
    board, other = services
    driver = chromium_driver(tmp_path / "chromium-profile")
    try:
        driver.get(f"{board.base}/?token={TOKEN}")  # the address `acceptrun ui` prints
        wait_for(lambda: driver.current_url == f"{board.board}/", 60, what="the board's page")
        assert "run(s)" in driver.page_source and "token" not in driver.current_url
        # Outside the prefix the browser does not send the cookie: the board refuses.
        driver.get(f"{board.base}/spend")
        assert "needs its token" in driver.page_source
        port = other.server_address[1]
        for path in OTHER_PATHS:
            driver.get(f"http://127.0.0.1:{port}{path}")
            wait_for(lambda: "other service" in driver.page_source, 60, what=path)
        paths = [p for p, _ in _Recorder.seen]
        assert set(OTHER_PATHS) <= set(paths), paths
        assert _leaked(_Recorder.seen) == []
    finally:
        driver.quit()
    tally("board routes without token", tried=len(OTHER_PATHS), secrets=0)
