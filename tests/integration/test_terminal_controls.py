"""A real failing run whose exception holds terminal and bidi controls: shown, never acted on.

The workload prints a progress line (``\\r``, a colour) and raises an exception holding
an OSC title and a clipboard write, a clear-screen CSI, a DCS string, 8-bit CSI and a
right-to-left override. Everything acceptrun prints about it (``run``'s live echo and
verdict, ``show``, ``ls``, ``report`` to the terminal, ``howto``, ``logs``) holds none of
those characters raw, only their escapes; ``logs --raw`` gives the workload's bytes as
written; the board's run and logs pages show them as text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import acceptrun
from acceptrun._util.controls import BIDI, CONTROLS
from acceptrun.cli.main import main
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.ui import Board
from campaign import tally
from conftest import only_record_in
from ui_served import Served

pytestmark = pytest.mark.slow

# Each kind a terminal or a browser acts on; none of it may reach either raw.
HOSTILE = (
    "boom \u202eexe.txt \u2066iso\u2069 \x1b]0;pwned\x07 \x1b]52;c;aGk=\x07 \x1b[2J"
    " \x1bP+q\x1b\\ \x9b31m \x85 end"  # U+0085 ends a line for str.splitlines: last
)
SHOWN = ["\\x1b]0;pwned\\x07", "\\x1b]52;c;aGk=", "\\x1b[2J", "\\u202eexe.txt"]
WORK = f"""
import sys
print("epoch 1 \\x1b[32mok\\x1b[0m 10%\\r100%", flush=True)
raise RuntimeError({json.dumps(HOSTILE)})
"""


def acted_on(text: str) -> list[str]:
    """The characters of ``text`` a terminal or a browser would act on (a CRLF line end
    and acceptrun's own newline and tab aside)."""
    return sorted({repr(c) for c in text.replace("\r\n", "\n") if c in CONTROLS})


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, RunRecord, str]]:
    """One real run that failed with HOSTILE: (workspace, record, what `run` printed)."""
    root = tmp_path_factory.mktemp("controls")
    (root / "work.py").write_text(textwrap.dedent(WORK))
    spec = (
        f'name = "controls"\ncommand = [{json.dumps(sys.executable)}, "work.py"]\n'
        "[limits]\nmax_restarts = 0\n"
    )
    (root / "spec.toml").write_text(spec)
    ws = root / ".acceptrun"
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "spec.toml"],
        cwd=root, capture_output=True, timeout=600, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")},
    )  # fmt: skip
    out = (proc.stdout + proc.stderr).decode("utf-8", errors="surrogateescape")
    assert proc.returncode == 1, out[-3000:]
    yield ws, only_record_in(ws), out


def _main(capfd: pytest.CaptureFixture[str], ws: Path, *args: str) -> str:
    capfd.readouterr()
    rc = main(["--workspace", str(ws), *args])
    out, err = capfd.readouterr()
    assert rc in (0, 1), (args, rc, err[-2000:])
    return out + err


def test_run_echoes_progress_and_escapes_the_exception(
    failed: tuple[Path, RunRecord, str],
) -> None:
    _, _, out = failed
    assert "\x1b[32mok\x1b[0m 10%\r100%" in out  # the workload's own colours and \r pass
    rest = out.replace("\x1b[32m", "").replace("\x1b[0m", "").replace("10%\r100%", "")
    assert acted_on(rest) == [], out[-3000:]
    assert all(s in out for s in SHOWN), out[-3000:]
    assert "REJECTED" in out and "\\x1b]0;pwned\\x07" in out.split("REJECTED", 1)[1]


@pytest.mark.parametrize(
    "command",
    [
        ["show"],
        ["show", "--explain"],
        ["ls"],
        ["report", "--format", "md"],
        ["howto"],
        ["logs"],
        ["logs", "--stderr-only"],
    ],
    ids=" ".join,
)
def test_every_command_shows_the_controls_as_escapes(
    failed: tuple[Path, RunRecord, str], capfd: pytest.CaptureFixture[str], command: list[str]
) -> None:
    ws, record, _ = failed
    args = [*command, record.run_id] if command != ["ls"] else command
    text = _main(capfd, ws, *args)
    assert acted_on(text) == [], (command, text[-3000:])
    if command not in (["ls"], ["howto"], ["show"]):  # show cuts findings: --explain has them
        # the exception, its escapes shown (Markdown's own \\] aside)
        assert "pwned\\x07" in text and "\\u202eexe.txt" in text, text[-3000:]
    # A traceback of acceptrun's own names its source (the workload's, in its logs, does not).
    ours = int(f'File "{Path(acceptrun.__file__).parent}' in text)
    tally("terminal and board", tried=1, tracebacks=ours)
    assert ours == 0, text[-3000:]


def test_logs_raw_gives_the_workloads_bytes(failed: tuple[Path, RunRecord, str]) -> None:
    ws, record, _ = failed
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "logs", "--raw", record.run_id],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    written = b"".join(
        (record.attempt_dir(1) / f"{s}.log").read_bytes() for s in ("stdout", "stderr")
    )
    assert proc.stdout == written, (proc.stdout[-500:], written[-500:])
    assert HOSTILE.encode() in proc.stdout


def test_the_boards_pages_show_the_controls_as_text(failed: tuple[Path, RunRecord, str]) -> None:
    ws, record, _ = failed
    s = Served(Board.for_workspaces([Workspace(ws)]))
    try:
        for page in ("", "/logs"):
            html = s.get(f"/run/0/{quote(record.run_id)}{page}")
            assert acted_on(html) == [], (page, html[-3000:])
            assert "\\x1b]0;pwned\\x07" in html and "\\u202eexe.txt" in html, page
            assert not any(c in html for c in BIDI)
    finally:
        s.close()
    tally("terminal and board", tried=2)
