"""Every request the board refuses gets a 4xx, and a client that leaves is one line.

Generated from the board's own tables: every route of ``ui.server.ROUTES`` with hostile
requests over real sockets on 127.0.0.1 (1,000 parameters, control and bidi characters
in every parameter of ``PARAMS`` the route reads, bad percent-encoding, huge values, a
body on GET, an unknown method, a header flood, an over-long request line): never a 5xx,
a 4xx for each that is refused, no traceback on stderr. A client that closes a half-sent
request or resets the connection in the middle of the answer is said in one line
(``board: client 127.0.0.1:PORT went away (...)``), never a traceback.
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from acceptrun._util.console import collect_messages
from acceptrun.record.workspace import Workspace
from acceptrun.ui import Board
from acceptrun.ui.limits import MAX_FIELDS
from acceptrun.ui.server import PARAMS, ROUTES, Route
from campaign import tally
from conftest import wait_for
from ui_served import TOKEN, Served

# One of each kind a terminal or a browser acts on: C0, DEL, C1 (CSI, NEL), bidi.
CONTROLS = ["\x00", "\x07", "\x1b", "\r", "\n", "\x7f", "\x85", "\x9b", "\u202e", "\u2066",
            "\u061c", "\u200f"]  # fmt: skip
BAD_ENCODING = ["%", "%z", "%zz", "%ff%fe", "%c3", "%%41", "%u202e", "%0"]
REPORT_BYTES = 8 * 1024 * 1024  # a report larger than any socket buffer: the write blocks


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    ws = Workspace.create(tmp_path_factory.mktemp("board") / "ws")
    record = ws.create_run(
        "requests", spec_text='name = "requests"\ncommand = ["true"]\n',
        state={"status": "finished", "verdict": "accepted"},
    )  # fmt: skip
    line = "<p>the report of a long run, one of many lines of it</p>\n"
    record.file("report.html").write_text(line * (REPORT_BYTES // len(line)), encoding="utf-8")
    s = Served(Board.for_workspaces([ws]))
    try:
        yield s, record.run_id
    finally:
        s.close()


def _fill(route: Route, rid: str, *, encoded: bool = False, **values: str) -> str:
    """The route's path with its {placeholders} filled: valid ones unless given (quoted
    unless ``encoded``: given as they go on the wire)."""
    path = route.path
    for name in re.findall(r"{(\w+)}", path):
        if name in values:
            value = values[name] if encoded else quote(values[name], safe="")
        else:
            value = quote({"ws": "0", "run_id": rid, "step": "1", "job": "1"}[name], safe="")
        path = path.replace("{" + name + "}", value)
    return path


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # a hang guard
    return sock


def _exchange(port: int, raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` as it is; the status and body of the answer (read to the close)."""
    with _connect(port) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    head, _, body = answer.partition(b"\r\n\r\n")
    status = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    assert status is not None, answer[:300]
    return int(status.group(1)), body


def _request(s: Served, method: str, target: str, headers: str = "", body: bytes = b"") -> bytes:
    auth = f"Authorization: Bearer {TOKEN}\r\nOrigin: {s.base}\r\n"
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n{auth}{length}{headers}\r\n"
    return head.encode("utf-8") + body


def _form(route: Route) -> bytes:
    return f"token={TOKEN}".encode() if route.method == "POST" else b""


def _hostile(s: Served, route: Route, run_id: str) -> Iterator[tuple[str, bytes, bool]]:
    """(what, raw request, refused) for each hostile request of ``route``: refused ones
    must get a 4xx; the others (a value that is only odd) a status below 500."""
    path = _fill(route, run_id)
    form = _form(route)
    many = "&".join(f"p{i}=1" for i in range(1000))
    yield "1,000 query parameters", _request(s, route.method, f"{path}?{many}", body=form), True
    if route.method == "POST":
        flood = form + b"&" + many.encode()
        yield "1,000 form fields", _request(s, "POST", path, body=flood), True
    for name in re.findall(r"{(\w+)}", route.path):
        for char in CONTROLS:
            target = _fill(route, run_id, **{name: f"1{char}"})
            yield f"{name} {char!r}", _request(s, route.method, target, body=form), True
        for bad in BAD_ENCODING:
            target = _fill(route, run_id, encoded=True, **{name: f"1{bad}"})
            yield f"{name} {bad}", _request(s, route.method, target, body=form), False
        huge = _fill(route, run_id, **{name: "9" * 4000})
        yield f"{name} huge", _request(s, route.method, huge, body=form), True
    for name in route.query:
        if name.startswith("header:"):
            header = name.removeprefix("header:")
            for char in CONTROLS:
                if char in "\r\n":
                    continue  # it would end the header: another request, not a value
                yield (
                    f"{name} {char!r}",
                    _request(s, route.method, path, f"{header}: 1{char}\r\n"),
                    True,
                )
            continue
        key = "stdout" if name == "offset" else name
        for char in CONTROLS:
            target = f"{path}?{key}={quote('1' + char, safe='')}"
            yield f"{name} {char!r}", _request(s, route.method, target, body=form), True
        for bad in BAD_ENCODING:
            yield (
                f"{name} {bad}",
                _request(s, route.method, f"{path}?{key}=1{bad}", body=form),
                False,
            )
        high = PARAMS[name][2]
        target = f"{path}?{key}={'9' * (min(high, 4000) + 1)}"
        yield f"{name} huge", _request(s, route.method, target, body=form), True
    if route.method == "GET":
        yield "a body on GET", _request(s, "GET", path, body=b"a=1"), True
        chunked = (
            _request(s, "GET", path, "Transfer-Encoding: chunked\r\n") + b"3\r\na=1\r\n0\r\n\r\n"
        )
        yield "a chunked body on GET", chunked, True
    yield "unknown method", _request(s, "BREW", path), True
    yield "PUT", _request(s, "PUT", path, body=b"x"), True
    flood = "".join(f"X-Flood-{i}: {i}\r\n" for i in range(200))
    yield "200 headers", _request(s, route.method, path, flood, form), True
    yield (
        "a 70 KB header",
        _request(s, route.method, path, f"X-Long: {'a' * 70_000}\r\n", form),
        True,
    )
    yield (
        "a 70 KB request line",
        _request(s, route.method, f"{path}?q={'a' * 70_000}", body=form),
        True,
    )


@pytest.mark.parametrize("route", [pytest.param(r, id=f"{r.method} {r.path}") for r in ROUTES])
def test_every_refused_request_gets_a_4xx_never_a_500(
    served: tuple[Served, str], route: Route, capfd: pytest.CaptureFixture[str]
) -> None:
    s, run_id = served
    tried = fives = 0
    for what, raw, refused in _hostile(s, route, run_id):
        status, body = _exchange(s.port, raw)
        tried += 1
        fives += status >= 500
        case = (what, status, body[-300:])
        assert status < 500, case
        if refused:
            assert 400 <= status < 500, case
    err = capfd.readouterr().err
    tracebacks = err.count("Traceback")
    tally("terminal and board", tried=tried, tracebacks=tracebacks + fives)
    assert tracebacks == 0, err[-3000:]


def test_the_parameter_count_is_named(served: tuple[Served, str]) -> None:
    s, _ = served
    many = "&".join(f"name={i}" for i in range(MAX_FIELDS + 1))
    status, body = _exchange(s.port, _request(s, "GET", f"/?{many}"))
    assert status == 400 and f"{MAX_FIELDS + 1} parameters (at most {MAX_FIELDS})" in body.decode()
    status, _ = _exchange(s.port, _request(s, "GET", "/?" + "&".join(["name=x"] * MAX_FIELDS)))
    assert status == 200


def test_a_control_character_in_a_parameter_is_named(served: tuple[Served, str]) -> None:
    s, _ = served
    status, body = _exchange(s.port, _request(s, "GET", "/?name=bert%E2%80%AEtxt"))
    assert status == 400
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in body.decode() and "name" in body.decode()


def _went_away(said: list[str], port: int) -> list[str]:
    return [m for m in said if m.startswith(f"board: client 127.0.0.1:{port} went away (")]


def _reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a client that crashed or was killed does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_half_sent_request_is_one_line(
    served: tuple[Served, str], capfd: pytest.CaptureFixture[str]
) -> None:
    s, _ = served
    with collect_messages() as said:
        sock = _connect(s.port)
        port = sock.getsockname()[1]
        sock.sendall(b"GET /?page=1 HTT")
        sock.shutdown(socket.SHUT_WR)  # gone in the middle of its request line
        assert sock.recv(100) == b""  # nothing is answered; the board closes
        sock.close()
        wait_for(lambda: _went_away(said, port), timeout=60)
        sock = _connect(s.port)
        reset_port = sock.getsockname()[1]
        sock.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nAuthoriz".encode())
        _reset(sock)  # gone, with a reset, in the middle of its headers
        wait_for(lambda: _went_away(said, reset_port), timeout=60)
    assert _went_away(said, port) == [
        f"board: client 127.0.0.1:{port} went away (closed a half-sent request)"
    ]
    assert len(_went_away(said, reset_port)) == 1, said
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    tally("terminal and board", tried=2, tracebacks=err.count("Traceback"))


def test_a_reset_in_the_middle_of_the_answer_is_one_line(
    served: tuple[Served, str], capfd: pytest.CaptureFixture[str]
) -> None:
    s, run_id = served
    with collect_messages() as said:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer cannot fit
        sock.settimeout(60)
        sock.connect(("127.0.0.1", s.port))
        port = sock.getsockname()[1]
        sock.sendall(_request(s, "GET", f"/run/0/{quote(run_id)}/report.html"))
        assert sock.recv(12).startswith(b"HTTP/1.0 200")  # the answer has begun
        _reset(sock)
        wait_for(lambda: _went_away(said, port), timeout=60)
    (line,) = _went_away(said, port)
    assert "Error" in line, line  # ConnectionResetError or BrokenPipeError, with its words
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    tally("terminal and board", tried=1, tracebacks=err.count("Traceback"))
