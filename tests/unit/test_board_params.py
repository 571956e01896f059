"""The board's routes, enumerated from its own routing table (``ui.server.ROUTES``).

Every route that shows run data refuses a request without the token on loopback (401 for
a page, 403 for an action); every route with hostile parameters (huge, negative, text,
10 KB, ``..``, NUL) answers 4xx naming the parameter, never 5xx and never a traceback on
the server's stderr; the token's cookie is scoped to the board's path prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from tests.campaign import tally

from acceptrun.record.workspace import Workspace
from acceptrun.ui import Board
from acceptrun.ui.server import PARAMS, ROUTES, Route
from ui_served import TOKEN, Served

# Hostile values of every parameter, whatever its kind (the path ones are quoted).
HOSTILE = [
    "99999999999999999999999999999",
    "-1",
    "abc",
    "1e9",
    "x" * 10 * 1024,
    "..",
    "../../etc/passwd",
    "\x00",
    "1\x00",
    "٣",  # a digit to str.isdigit, not to int() in every base
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    ws = Workspace.create(tmp_path_factory.mktemp("board") / "ws")
    record = ws.create_run(
        "params", spec_text='name = "params"\ncommand = ["true"]\n',
        state={"status": "finished", "verdict": "accepted"},
    )  # fmt: skip
    s = Served(Board.for_workspaces([ws]))
    try:
        yield s, record.run_id
    finally:
        s.close()


def _fill(route: Route, rid: str, **values: str) -> str:
    """The route's path with its {placeholders} filled: valid ones unless given."""
    good = {"ws": "0", "run_id": rid, "step": "1", "job": "1"}
    path = route.path
    for name in re.findall(r"{(\w+)}", path):
        path = path.replace("{" + name + "}", quote(values.get(name, good[name]), safe=""))
    return path


def _placeholders(route: Route) -> list[str]:
    return re.findall(r"{(\w+)}", route.path)


def test_the_table_names_every_parameter() -> None:
    for route in ROUTES:
        for name in _placeholders(route):
            assert name in PARAMS, (route.path, name)
        for name in route.query:
            assert name in PARAMS, (route.path, name)


@pytest.mark.parametrize("route", [pytest.param(r, id=f"{r.method} {r.path}") for r in ROUTES])
def test_a_route_without_the_token_on_loopback(served: tuple[Served, str], route: Route) -> None:
    s, run_id = served
    path = _fill(route, run_id)
    if route.method == "POST":
        status, _, text = s.request("POST", path, "", {"Origin": s.base})
        assert status == 403 and "token" in text, (path, status)
    else:
        status, _, text = s.request("GET", path)
        if route.private:
            assert status == 401, (path, status)
            assert "needs its token" in text
            assert s.server.prefix not in text  # a refused request never learns the prefix
        else:
            assert status in (200, 204), (path, status)
    tally("board routes without token", tried=1, tracebacks=0)


@pytest.mark.parametrize("route", [pytest.param(r, id=f"{r.method} {r.path}") for r in ROUTES])
def test_a_route_with_the_token_under_the_prefix_and_without(
    served: tuple[Served, str], route: Route
) -> None:
    """Each declared route is served (not "no page"): the table is the routing."""
    s, run_id = served
    if route.method == "POST":
        return  # actions act: test_ui.py drives them
    path = _fill(route, run_id)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for where in (path, s.server.prefix + path):
        status, _, text = s.request("GET", where, headers=bearer)
        assert "no page" not in text, (where, status)
        assert status < 500, (where, status, text[-500:])


def _refused(name: str, value: str) -> bool:
    """Whether the value is not of the parameter's kind or size (else it may be served)."""
    kind, _, high = PARAMS[name]
    if kind == "int" or name == "run_id":
        return True  # none of HOSTILE is a valid number; a run id: none names a run
    return len(value) > high or any(c < " " for c in value)


def _hostile_requests(route: Route, run_id: str) -> Iterator[tuple[str, str, str, dict[str, str]]]:
    """(parameter, value, path, headers) for each hostile value of each parameter."""
    for name in _placeholders(route):
        for bad in HOSTILE:
            yield name, bad, _fill(route, run_id, **{name: bad}), {}
    path = _fill(route, run_id)
    for name in route.query:
        for bad in HOSTILE:
            if name.startswith("header:"):
                if "\x00" in bad or len(bad) > 4096 or not bad.isascii():
                    continue  # http.client refuses to send such a header at all
                yield name, bad, path, {name.removeprefix("header:"): bad}
            else:
                key = "stdout" if name == "offset" else name
                yield name, bad, f"{path}?{quote(key)}={quote(bad, safe='')}", {}


@pytest.mark.parametrize(
    "route",
    [pytest.param(r, id=f"{r.method} {r.path}") for r in ROUTES if "{" in r.path or r.query],
)
def test_hostile_parameters_get_a_4xx_naming_them(
    served: tuple[Served, str], route: Route, capfd: pytest.CaptureFixture[str]
) -> None:
    s, run_id = served
    tried = fives = 0
    for name, bad, path, headers in _hostile_requests(route, run_id):
        tried += 1
        hdrs = {"Authorization": f"Bearer {TOKEN}", "Origin": s.base, **headers}
        body = f"token={TOKEN}" if route.method == "POST" else None
        status, _, text = s.request(route.method, path, body, hdrs)
        fives += status >= 500
        case = (name, bad[:60], status, text[-400:])
        assert status < 500, case
        if not _refused(name, bad):
            continue  # a name filter "abc" is a filter like any other
        assert 400 <= status < 500, case
        label = {"ws": "workspace number", "run_id": "run"}.get(name, name)
        assert label.removeprefix("header:") in text or "characters" in text, case
    err = capfd.readouterr().err
    tracebacks = err.count("Traceback")
    tally("board parameters", tried=tried, tracebacks=tracebacks + fives)
    assert tracebacks == 0, err[-3000:]


def test_a_huge_page_number_is_a_400_not_a_500(served: tuple[Served, str]) -> None:
    s, _ = served
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, _, text = s.request("GET", "/?page=99999999999999999999", headers=bearer)
    assert status == 400 and "page" in text
    status, _, text = s.request("GET", "/?page=100000", headers=bearer)
    assert status == 200, text[-500:]


def test_the_cookie_is_scoped_to_the_boards_prefix(served: tuple[Served, str]) -> None:
    s, _ = served
    status, headers, _ = s.request("GET", f"/?token={TOKEN}")
    assert status == 303
    prefix = s.server.prefix
    assert re.fullmatch(r"/b-[0-9a-f]{20}", prefix)
    assert headers["location"] == prefix + "/"
    attrs = [a.strip() for a in headers["set-cookie"].split(";")]
    assert attrs[0] == f"acceptrun_ui_{s.port}={TOKEN}"
    assert f"Path={prefix}" in attrs and "HttpOnly" in attrs and "SameSite=Strict" in attrs
    assert "Path=/" not in attrs
    # Under the prefix the cookie alone opens the pages, and their links keep the prefix.
    cookie = {"Cookie": attrs[0]}
    status, _, page = s.request("GET", prefix + "/", headers=cookie)
    assert status == 200 and f'href="{prefix}/compare"' in page
    assert f'href="{prefix}/static/board.css"' in page


def test_the_prefix_follows_the_token_not_the_port(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    a, b = Served(Board.for_workspaces([ws])), Served(Board.for_workspaces([ws]))
    try:
        assert a.server.prefix == b.server.prefix  # a restart keeps its links
        assert a.server.cookie_name != b.server.cookie_name
        assert a.server.url().endswith(a.server.prefix + "/")
    finally:
        a.close()
        b.close()
