"""Every file a command reads, replaced by something hostile, under every reading command.

One real run (steps, two checkpoints, a metric, stdout and stderr) in a workspace with a
prices.toml and the user's list of workspaces. The files enumerated, so one added
tomorrow is covered: every file of the run record as the run left it (walked, not
listed here), the workspace's index.sqlite and prices.toml, the user's workspaces.json.
The reading commands enumerated from the parser (every command that takes a run, less
those that act on it: :data:`ACTS`), with the workspace-wide readers (``ls``, ``ls
--all``, ``cost``, ``cost --all``, ``gc``, ``index rebuild``) and ``spec check`` of the
project's spec.toml (also replaced), each a child process; and
the board's GET pages from its route table, served by a board in a thread.

The hostile variants (:data:`VARIANTS`): random bytes, empty, a directory, a FIFO, a
symlink to /dev/zero, a symlink to a file outside holding a planted PEM key and a marker
no redactor knows, a symlink to another user's file (mode 0600, of uid 65534: as root the
test can make one, and root could read it), a symlink to another file of the same record.

The matrix, chosen to keep every file under every variant without running each command
per file and variant (about 430 commands and 250 pages, not 8 x 31 x 20 commands):

- together: for each variant, every file but run.json replaced at once (run.json stays,
  or every command stops at it), every command and page;
- run.json alone, each variant, the commands that start from it;
- each file alone as the link to the planted secret (the leak a reader could make), the
  commands that read the most files (bundle --include-logs, show) and the run's pages;
- each depth of the record's folders made a link to an outside folder whose files have
  the same names and hold the secret, every command and page.

Every command: exit 0, 1 or 2 (past the timeout it is a hang), no traceback, and not a
byte of a link's target (the key's body, the marker, the outside file's name) in its
output, the bundle's members, the report it wrote or a board page; a failure names a file
it was given. Restored from a pristine copy after each case.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import textwrap
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun.record.workspace import Workspace
from acceptrun.ui import Board
from acceptrun.ui.server import ROUTES
from conftest import run_taking_commands, toml_str
from secret_shapes import SHAPES
from ui_served import TOKEN, Served

pytestmark = pytest.mark.slow

PYTHON = sys.executable
TIMEOUT_S = 60.0  # per command or page: a hang guard only (each takes about 0.5 s)
PEM = next(s for s in SHAPES if s.family.startswith("pem"))
MARKER = f"outside-marker-{uuid.uuid4().hex}"  # no redactor knows it: a leak shows as is

WORK = """
import sys
import numpy as np
import acceptrun

weights = np.zeros((4, 4), dtype=np.float32)
run = acceptrun.init()
start = run.restore(weights=weights)
for step in run.steps(start, 4):
    run.log(step, loss=1.0 / (step + 1))
    if step % 2 == 1:
        run.checkpoint(step, block=True)
print("hello from stdout")
print("hello from stderr", file=sys.stderr)
run.metric("acc", 0.95)
"""

SPEC = """
name = "hostile-files"
command = [{python}, "work.py"]
[acceptance]
metrics = {{ acc = ">= 0.9" }}
[cost]
price_per_hour = 2
"""

PRICES = """
[[price]]
provider = "lab"
instance = "box"
gpus = 1
gpu = "A10"
price_per_hour = 1.0
billing = "per_minute"
start_rule = "launch"
source = "the lab's own price list"
date = "2026-12-01"
"""

# Commands that take a run but act on it (start a process, write a record, send it
# away): not readers. Every other command that takes a run is run here.
ACTS = {
    ("stop",), ("kill",), ("resume",), ("reproduce",), ("ckpt", "drill"), ("cost", "add"),
    ("export", "mlflow"),
}  # fmt: skip
# What a reader needs besides the run(s); {out} is a fresh path outside the workspace.
EXTRA: dict[tuple[str, ...], tuple[str, ...]] = {
    ("bundle",): ("--include-logs", "--force", "-o", "{out}.tar.gz"),
    ("report",): ("--format", "html", "-o", "{out}.html"),
    ("cost", "whatif"): ("--on", "lambda:gpu_1x_a10"),  # a packaged instance
}
WORKSPACE_READERS = (
    ("ls",), ("ls", "--all"), ("cost",), ("cost", "--all"), ("gc",), ("spec", "check", "spec.toml"),
)  # fmt: skip
OPTIONS = {("show",): (("--json",),), ("report",): (("--format", "md"),)}  # more forms
# The commands each-file-alone runs (their first form): the bundle reads every file of a
# record, show the most through the record's views; the run's pages (the report's body,
# the logs, the report, a checkpoint's manifest) read the rest.
WIDE = {("show",), ("bundle",)}


@dataclass
class Planted:
    """What lies outside the workspace, for the links to point at, and how to see a leak."""

    root: Path
    secret: Path  # the PEM key and the marker
    foreign: Path  # another user's file (uid 65534, mode 0600), also holding the marker
    folder: Path  # the record's folders copied out, every file holding the secret

    def needles(self) -> tuple[str, ...]:
        return (PEM.needle, MARKER, self.secret.name, self.foreign.name, self.folder.name)


@dataclass
class Setup:
    project: Path
    ws: Path
    run_dir: Path
    run_id: str
    config: Path
    pristine: Path  # a copy of the workspace and the list, to restore after each case
    planted: Planted
    files: list[Path]  # every file a command reads (absolute)
    steps: list[int]
    served: Served
    counts: dict[str, int] = field(default_factory=dict)


def _env(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    return {**env, "ACCEPTRUN_CONFIG_DIR": str(config)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("hostile-files")
    project, config = root / "project", root / "config"
    project.mkdir()
    (project / "work.py").write_text(textwrap.dedent(WORK))
    (project / "spec.toml").write_text(SPEC.format(python=toml_str(PYTHON)))
    ws = project / ".acceptrun"
    done = subprocess.run(
        [PYTHON, "-m", "acceptrun", "run", "-q", "spec.toml"], cwd=project, env=_env(config),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "ACCEPTED" in done.stdout, (done.stdout, done.stderr)
    (ws / "prices.toml").write_text(PRICES)
    (run_id,) = [p.name for p in (ws / "runs").iterdir()]
    run_dir = ws / "runs" / run_id
    planted = _plant(root / "outside", run_dir)
    files = [p for p in sorted(run_dir.rglob("*")) if p.is_file()]
    files += [ws / "index.sqlite", ws / "prices.toml", config / "workspaces.json"]
    files.append(project / "spec.toml")  # the spec given to a command (spec check)
    assert all(p.is_file() for p in files), files
    pristine = root / "pristine"
    shutil.copytree(ws, pristine / "ws", symlinks=True)
    shutil.copytree(config, pristine / "config", symlinks=True)
    shutil.copy2(project / "spec.toml", pristine / "spec.toml")
    steps = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))
    served = Served(Board.for_workspaces([Workspace(ws)]))
    try:
        yield Setup(project, ws, run_dir, run_id, config, pristine, planted, files, steps, served)
    finally:
        served.close()


def _plant(outside: Path, run_dir: Path) -> Planted:
    outside.mkdir()
    text = f"{PEM.text}\n{MARKER}\n"
    secret = outside / f"planted-{uuid.uuid4().hex[:8]}.pem"
    secret.write_text(text)
    foreign = outside / f"foreign-{uuid.uuid4().hex[:8]}"
    foreign.write_text(text)
    foreign.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)  # another user's: root could read it, must not
    folder = outside / f"folder-{uuid.uuid4().hex[:8]}"
    shutil.copytree(run_dir, folder)
    for p in folder.rglob("*"):
        if p.is_file():
            p.write_text(text)
    return Planted(outside, secret, foreign, folder)


# ---- the variants --------------------------------------------------------------------------


def _random(path: Path, s: Setup) -> None:
    path.write_bytes(random.Random(path.name).randbytes(4096))


def _fifo(path: Path, s: Setup) -> None:
    os.mkfifo(path)


def _link(target: Callable[[Path, Setup], Path]) -> Callable[[Path, Setup], None]:
    def make(path: Path, s: Setup) -> None:
        path.symlink_to(target(path, s))

    return make


VARIANTS: dict[str, Callable[[Path, Setup], None]] = {
    "random bytes": _random,
    "empty": lambda p, s: p.write_bytes(b""),
    "a directory": lambda p, s: p.mkdir(),
    "a FIFO": _fifo,
    "a link to /dev/zero": _link(lambda p, s: Path("/dev/zero")),
    "a link to a planted secret": _link(lambda p, s: s.planted.secret),
    "a link to another user's file": _link(lambda p, s: s.planted.foreign),
    "a link inside the record": _link(lambda p, s: s.run_dir / "run.json"),
}


def _replace(path: Path, variant: str | None, s: Setup) -> None:
    """``path`` made ``variant`` (None: only removed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if variant is not None:
        VARIANTS[variant](path, s)


def _restore(s: Setup) -> None:
    """The workspace and the list as the run left them (whatever the commands moved)."""
    for live, kept in ((s.ws, s.pristine / "ws"), (s.config, s.pristine / "config")):
        shutil.rmtree(live)
        shutil.copytree(kept, live, symlinks=True)
    spec = s.project / "spec.toml"
    _replace(spec, None, s)
    shutil.copy2(s.pristine / "spec.toml", spec)


# ---- the commands -------------------------------------------------------------------------


def _readers() -> list[tuple[str, ...]]:
    """Every reading command with its arguments ({run}, {out} filled per run)."""
    out: list[tuple[str, ...]] = []
    for words, refs in run_taking_commands():
        if words in ACTS:
            continue
        base = (*words, *EXTRA.get(words, ()), *("{run}" for _ in refs))
        out.append(base)
        out += [(*words, *opt, *("{run}" for _ in refs)) for opt in OPTIONS.get(words, ())]
    return [*out, *WORKSPACE_READERS]


READERS = _readers()


@dataclass
class Outcome:
    args: tuple[str, ...]
    code: int | None  # None: past the timeout (a hang)
    said: str  # stdout, stderr, and what it wrote (bundle members, report) as text


def _run(s: Setup, args: tuple[str, ...], out: Path) -> Outcome:
    filled = tuple(a.replace("{run}", s.run_id).replace("{out}", str(out)) for a in args)
    try:
        done = subprocess.run(
            [PYTHON, "-m", "acceptrun", "--workspace", str(s.ws), *filled], cwd=s.project,
            env=_env(s.config), capture_output=True, text=True, errors="replace",
            timeout=TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return Outcome(filled, None, str(exc.stdout or "") + str(exc.stderr or ""))
    said = done.stdout + "\n" + done.stderr + "\n" + _written(out)
    return Outcome(filled, done.returncode, said)


def _written(out: Path) -> str:
    """What a command wrote at ``out`` (a bundle's members, a report), as text."""
    parts = []
    html = out.with_name(out.name + ".html")
    if html.is_file():
        parts.append(html.read_text(errors="replace"))
    bundle = out.with_name(out.name + ".tar.gz")
    if bundle.is_file():
        with tarfile.open(bundle) as tar:
            for member in tar.getmembers():
                f = tar.extractfile(member)
                if f is not None:
                    parts.append(f.read().decode(errors="replace"))
    return "\n".join(parts)


def _pages(s: Setup) -> list[str]:
    """The board's GET pages with run data, from its route table (streams left out: a
    live feed does not end), filled with this run."""
    run = f"0/{s.run_id}"
    fill = {"{ws}": "0", "{run_id}": s.run_id, "{step}": str(s.steps[-1])}
    out = []
    for route in ROUTES:
        if route.method != "GET" or not route.private or route.path.endswith("/stream"):
            continue
        path = route.path
        for k, v in fill.items():
            path = path.replace(k, v)
        out.append(path + (f"?run={run}&run={run}" if "run" in route.query else ""))
    return out


def _get(s: Setup, path: str) -> Outcome:
    conn = http.client.HTTPConnection("127.0.0.1", s.served.port, timeout=TIMEOUT_S)
    try:
        conn.request(
            "GET", path,
            headers={"Host": f"127.0.0.1:{s.served.port}", "Authorization": f"Bearer {TOKEN}"},
        )  # fmt: skip
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
    except TimeoutError:
        return Outcome(("GET", path), None, "")
    finally:
        conn.close()
    return Outcome(("GET", path), resp.status, text)


# ---- the cases ----------------------------------------------------------------------------


@dataclass
class Tally:
    tried: int = 0
    tracebacks: int = 0
    hangs: int = 0
    secrets: int = 0
    problems: list[str] = field(default_factory=list)


def _judge(o: Outcome, s: Setup, names: list[str], case: str, t: Tally) -> None:
    t.tried += 1
    what = f"{case}: {' '.join(o.args)}"
    page = o.args[0] == "GET"
    if o.code is None:
        t.hangs += 1
        t.problems.append(f"{what}: no answer in {TIMEOUT_S} s (a hang)")
        return
    if "Traceback" in o.said or (page and o.code >= 500):
        t.tracebacks += 1
        t.problems.append(f"{what}: a traceback (exit {o.code}): {o.said[-1500:]}")
    elif not page and o.code not in (0, 1, 2):
        t.tracebacks += 1
        t.problems.append(f"{what}: exit {o.code}: {o.said[-800:]}")
    elif not page and o.code != 0 and not any(n in o.said for n in names):
        t.problems.append(
            f"{what}: exit {o.code} without naming a file it was given: {o.said[-800:]}"
        )
    leaked = [n for n in s.planted.needles() if n in o.said]
    if leaked:
        t.secrets += 1
        t.problems.append(f"{what}: the link's target is in its output ({leaked[0][:30]}...)")


def _case(
    s: Setup, tmp: Path, case: str, hostile: list[Path], variant: str | None,
    commands: list[tuple[str, ...]], pages: list[str], t: Tally,
) -> None:  # fmt: skip
    """Replace ``hostile`` by ``variant`` (None: already done), run every command and page."""
    if variant is not None:
        for path in hostile:
            _replace(path, variant, s)
    names = sorted(
        {p.name for p in hostile}
        | {str(p.relative_to(s.ws)) for p in hostile if p.is_relative_to(s.ws)}
    )
    outs = [tmp / f"out-{uuid.uuid4().hex[:8]}" for _ in commands]
    rebuild = [c for c in commands if c[0] == "index"]
    readers = [c for c in commands if c[0] != "index"]
    try:
        with ThreadPoolExecutor(4) as pool:  # readers only: nothing they do races
            outcomes = list(
                pool.map(lambda a: _run(s, a[0], a[1]), zip(readers, outs, strict=False))
            )
            outcomes += list(pool.map(lambda p: _get(s, p), pages))
        outcomes += [_run(s, c, tmp / "rebuild") for c in rebuild]  # alone: it moves the index
        for o in outcomes:
            _judge(o, s, names, case, t)
    finally:
        _restore(s)


ALL = [*READERS, ("index", "rebuild")]


def _report(surface: str, t: Tally) -> None:
    tally(surface, tried=t.tried, tracebacks=t.tracebacks, hangs=t.hangs, secrets=t.secrets)
    assert not t.problems, f"{len(t.problems)} problems:\n" + "\n".join(t.problems[:30])
    assert t.tracebacks == t.hangs == t.secrets == 0


def test_the_commands_are_enumerated_from_the_parser() -> None:
    """Every command that takes a run is a reader here or listed as one that acts."""
    taking = {words for words, _refs in run_taking_commands()}
    assert taking >= ACTS, ACTS - taking  # an act renamed or gone: this list is stale
    assert {c[: len(w)] for c in READERS for w in taking if c[: len(w)] == w} == taking - ACTS
    assert set(EXTRA) <= taking and set(WIDE) <= taking


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_file_but_run_json_at_once(setup: Setup, tmp_path: Path, variant: str) -> None:
    s, t = setup, Tally()
    hostile = [p for p in s.files if p.name != "run.json" or p.parent != s.run_dir]
    _case(s, tmp_path, f"all at once, {variant}", hostile, variant, ALL, _pages(s), t)
    _report("files a command reads", t)


def test_run_json_under_each_variant(setup: Setup, tmp_path: Path) -> None:
    s, t = setup, Tally()
    commands = [c for c in ALL if c[0] in ("ls", "show", "bundle", "index")]
    for variant in VARIANTS:
        hostile = [s.run_dir / "run.json"]
        _case(s, tmp_path, f"run.json, {variant}", hostile, variant, commands, _pages(s), t)
    _report("files a command reads", t)


def test_each_file_alone_as_a_link_to_a_secret(setup: Setup, tmp_path: Path) -> None:
    s, t = setup, Tally()
    firsts = {w: next(c for c in READERS if c[: len(w)] == w) for w in WIDE}
    commands = sorted(firsts.values())
    pages = [p for p in _pages(s) if p.startswith("/run/")]
    for path in s.files:
        name = str(path.relative_to(s.ws)) if path.is_relative_to(s.ws) else path.name
        _case(s, tmp_path, name, [path], "a link to a planted secret", commands, pages, t)
    _report("files a command reads", t)


def test_each_depth_of_folders_linked_out(setup: Setup, tmp_path: Path) -> None:
    s, t = setup, Tally()
    dirs = [p for p in s.run_dir.rglob("*") if p.is_dir()]
    depths = sorted({len(p.relative_to(s.run_dir).parts) for p in dirs})
    for depth in depths:
        level = [p for p in dirs if len(p.relative_to(s.run_dir).parts) == depth]
        for p in level:
            shutil.rmtree(p)
            p.symlink_to(s.planted.folder / p.relative_to(s.run_dir), target_is_directory=True)
        hostile = [*level, *(p for p in s.files if any(p.is_relative_to(d) for d in level))]
        _case(s, tmp_path, f"folders at depth {depth} linked out", hostile, None, ALL, _pages(s), t)
    _report("files a command reads", t)


def test_a_garbage_list_of_workspaces(setup: Setup, tmp_path: Path) -> None:
    """workspaces.json with a NUL in an entry, and not JSON: ls/cost --all answer, naming it."""
    s, t = setup, Tally()
    listed = s.config / "workspaces.json"
    doc = json.loads(listed.read_text())
    for content in (
        json.dumps({**doc, "workspaces": [*doc["workspaces"], {"path": "/tmp/a\x00b"}]}),
        json.dumps({**doc, "workspaces": [{"path": 7}, {"path": "relative"}, "x"]}),
        "{\x00 not json",
    ):
        listed.write_text(content)
        commands = [("ls", "--all"), ("cost", "--all")]
        _case(s, tmp_path, f"workspaces.json {content[:20]!r}", [listed], None, commands, [], t)
    _report("files a command reads", t)
