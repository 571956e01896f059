"""``acceptrun ui`` without a process: the board server in a thread over records written here
(token, thinning, the SSE feed, two workspaces, a live run's logs)."""

from __future__ import annotations

import http.client
import math
import os
import re
import threading
import time
from pathlib import Path

import pytest

from acceptrun.record.workspace import Workspace
from acceptrun.ui import Board
from acceptrun.ui.board import thin_minmax
from conftest import wait_for
from ui_served import TOKEN, Served

# ---- security ---------------------------------------------------------------------------------


def test_a_non_loopback_bind_needs_the_token_on_every_request(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    served = Served(Board.for_workspaces([ws]), host="0.0.0.0")
    try:
        hdrs = {"Host": f"127.0.0.1:{served.port}"}
        status, _, text = served.request("GET", "/", headers=hdrs)
        assert status == 401 and "needs its token" in text
        status, headers, _ = served.request("GET", f"/?token={TOKEN}", headers=hdrs)
        assert status == 303 and headers["location"] == served.server.prefix + "/"
        cookie = headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        status, _, text = served.request("GET", "/", headers={**hdrs, "Cookie": cookie})
        assert status == 200 and "0 run(s)" in text
        status, _, _ = served.request(
            "GET", "/", headers={**hdrs, "Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200
    finally:
        served.close()


# ---- compare, queue, spend ---------------------------------------------------------------------


def test_thinning_keeps_every_spike_of_100000_points() -> None:
    points = [(float(i), math.sin(i / 500.0)) for i in range(100_000)]
    points[12_345] = (12_345.0, 50.0)  # one spike
    points[77_777] = (77_777.0, -50.0)  # one dip
    thinned = thin_minmax(points, 700)
    assert len(thinned) <= 2 * 700 + 2
    assert (12_345.0, 50.0) in thinned and (77_777.0, -50.0) in thinned
    assert thinned[0] == points[0] and thinned[-1] == points[-1]
    assert [x for x, _ in thinned] == sorted(x for x, _ in thinned)


# ---- a live run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_sse_feed_sends_new_steps_then_ends(tmp_path: Path) -> None:
    """The feed of a run written step by step: every step arrives once, in order, then 'end'."""
    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run(
        "feed",
        spec_text='name = "feed"\ncommand = ["true"]\n',
        state={"status": "closing", "mode": "standalone"},
    )
    record.event("workload_start", pid=os.getpid())
    served = Served(Board.for_workspaces([ws]))
    got: list[int] = []
    done = threading.Event()

    def read() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        conn.request(
            "GET",
            f"/run/0/{record.run_id}/stream",
            headers={"Host": f"127.0.0.1:{served.port}", "Authorization": f"Bearer {TOKEN}"},
        )
        resp = conn.getresponse()
        event = ""
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "steps":
                import json

                got.extend(r["step"] for r in json.loads(line[6:]))
            elif line.startswith("data: ") and event == "end":
                break
        done.set()

    try:
        for i in range(5):
            record.event("step", step=i, loss=1.0, step_time=0.01)
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        wait_for(lambda: len(got) == 5, 30, 0.05, "the first 5 steps")
        for i in range(5, 50):
            record.event("step", step=i, loss=1.0, step_time=0.01)
            time.sleep(0.005)
        wait_for(lambda: len(got) == 50, 30, 0.05, "50 steps")
        record.update_state(status="finished")
        assert done.wait(30)
        assert got == list(range(50))
    finally:
        served.close()


def test_a_board_of_two_workspaces_lists_both_by_project(tmp_path: Path) -> None:
    """``acceptrun ui --all``: runs of every workspace, newest first, with their project."""
    spaces = []
    for project in ("alpha", "beta"):
        ws = Workspace.create(tmp_path / project / ".acceptrun")
        for i in range(3):
            ws.create_run(
                f"{project}-{i}", spec_text='name = "x"\ncommand = ["true"]\n',
                state={"status": "finished", "verdict": "accepted" if i else "rejected"},
            )  # fmt: skip
            time.sleep(0.002)
        spaces.append(ws)
    spaces[1].index_path.unlink()  # a cache: the board rebuilds it from the records
    served = Served(Board.for_workspaces(spaces))
    try:
        page = served.get("/")
        assert "6 run(s)" in page and "<th>project</th>" in page
        assert "<td>alpha</td>" in page and "<td>beta</td>" in page
        ids = re.findall(r'href="/run/(\d)/([^"]+)"', page)
        assert sorted(i for _, i in ids) == sorted(spaces[0].run_ids() + spaces[1].run_ids())
        assert [i for _, i in ids] == sorted((i for _, i in ids), reverse=True)  # newest first
        page = served.get("/?verdict=rejected")
        assert "2 run(s)" in page
        ws1 = next(w for w, i in ids if i == spaces[1].run_ids()[0])
        assert ws1 == "1"
        assert spaces[1].run_ids()[0] in served.get(f"/run/1/{spaces[1].run_ids()[0]}/logs")
    finally:
        served.close()


def test_the_logs_page_follows_a_live_runs_logs(tmp_path: Path) -> None:
    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run(
        "logs", spec_text='name = "logs"\ncommand = ["true"]\n',
        state={"status": "running", "mode": "standalone"},
    )  # fmt: skip
    record.event("workload_start", pid=os.getpid())  # live while this process is
    log = record.attempt_dir(1) / "stdout.log"
    log.parent.mkdir(parents=True)
    # A JSON form: escaped for HTML (or JSON) first, the redactor would no longer see it.
    log.write_text('first <line> {"password": "hunter22"}\n')
    served = Served(Board.for_workspaces([ws]))
    try:
        page = served.get(f"/run/0/{record.run_id}/logs")
        assert "first &lt;line&gt;" in page
        assert "hunter22" not in page and "&quot;password&quot;: &quot;&lt;redacted&gt;" in page
        stream = re.search(r'data-stream="([^"]+)"', page)
        assert stream is not None
        url = stream.group(1).replace("&amp;", "&")
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        hdrs = {"Host": f"127.0.0.1:{served.port}", "Authorization": f"Bearer {TOKEN}"}
        conn.request("GET", url, headers=hdrs)
        resp = conn.getresponse()
        with open(log, "a") as f:
            f.write('second line {"password": "hunter33"}\n')
        lines = []
        for raw in resp:
            text = raw.decode()
            if text.startswith("data: "):
                lines.append(text)
                if "second line" in text:
                    break
        assert len(lines) == 1 and '"log": "1/stdout"' in lines[0]  # only what was appended
        assert "hunter33" not in lines[0] and "<redacted>" in lines[0]
        record.update_state(status="finished")
        rest = resp.read().decode()  # the feed ends once the run is no longer live
        assert "event: end" in rest
        conn.close()
    finally:
        served.close()


@pytest.mark.slow
def test_a_long_runs_charts_are_thinned_and_keep_their_spike(tmp_path: Path) -> None:
    """20,000 steps: each chart draws at most 1,500 points, and the one spike is still drawn."""
    import json

    from acceptrun.ui import pages

    ws = Workspace.create(tmp_path / "ws")
    record = ws.create_run(
        "long", spec_text='name = "long"\ncommand = ["true"]\n',
        state={"status": "finished", "verdict": "accepted"},
    )  # fmt: skip
    record.write_json("verdict.json", {"accepted": True, "checks": []})
    t0 = time.time() - 1000
    with open(record.events_path, "a") as f:
        f.write(json.dumps({"t": t0, "kind": "run_start"}) + "\n")
        for i in range(20_000):
            loss = 1 / (1 + i / 1000) + (49.0 if i == 12_345 else 0.0)
            step = {"t": t0 + i * 0.01, "kind": "step", "step": i, "attempt": 1, "loss": loss,
                    "step_time": 0.01, "samples": 8}  # fmt: skip
            f.write(json.dumps(step) + "\n")
    served = Served(Board.for_workspaces([ws]))
    try:
        page = served.get(f"/run/0/{record.run_id}")
        charts = re.findall(r'<svg[^>]*class="chart"[^>]*>.*?</svg>', page, re.S)
        loss = next(c for c in charts if "<title>Loss</title>" in c)
        path = re.search(r'<path d="([^"]*)"', loss)
        assert path is not None
        assert 100 < path.group(1).count("L") + 1 <= 1500
        ticks = [float(t) for t in re.findall(r'text-anchor="end">([\d.]+)<', loss)]
        assert max(ticks) >= 50  # the y axis reaches the spike: it was not thinned away
        assert str(record.path) in pages._bodies  # kept for the next view
        assert served.get(f"/run/0/{record.run_id}") == page  # the same until the record changes
    finally:
        served.close()


def test_a_diverged_loss_reaches_the_browser_as_null_not_as_nan() -> None:
    """JSON.parse refuses NaN: a feed message holding one would be dropped whole."""
    import json

    from acceptrun.ui.live import sse

    msg = sse("steps", {"rows": [{"step": 2, "loss": math.nan, "step_time": math.inf}]}, 7)
    head, data = msg.decode().rstrip("\n").split("data: ")
    assert head == "id: 7\nevent: steps\n"
    assert "NaN" not in data and "Infinity" not in data
    assert json.loads(data) == {"rows": [{"step": 2, "loss": None, "step_time": None}]}
