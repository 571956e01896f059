"""A board server in a thread of the test process, for the board's tests of both tiers."""

from __future__ import annotations

import http.client
import threading

from acceptrun.ui import Board, make_server

TOKEN = "test-token-0123456789abcdef"


class Served:
    """A board server running in a thread of the test process."""

    def __init__(self, board: Board, host: str = "127.0.0.1") -> None:
        self.server = make_server(board, host, 0, TOKEN)
        self.port = self.server.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        """The board's origin (scheme, host, port): what an Origin header carries."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def board(self) -> str:
        """The board's own address: the origin and its path prefix, where its cookie goes."""
        return self.base + self.server.prefix

    def request(
        self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        hdrs = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if body is not None:
            hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded")
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, text

    def get(self, path: str, headers: dict[str, str] | None = None) -> str:
        """A page read with the token (every page needs it, on loopback too)."""
        hdrs = {"Authorization": f"Bearer {TOKEN}", **(headers or {})}
        status, _, text = self.request("GET", path, headers=hdrs)
        assert status == 200, (path, status, text[-2000:])
        return text

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
