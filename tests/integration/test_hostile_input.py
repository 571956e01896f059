"""Hostile input: names, ids and paths that try to escape the workspace or a display.

Output names and paths (``[outputs]``), run ids (``--run-id``), metric names
(``run.log``/``run.metric``), the spec ``name`` and watched checkpoint paths carry
``../`` traversal, absolute paths, symlinks that lead out of the workdir, very long
strings, control characters and HTML/Markdown injection. None escapes the workspace,
no symlink is followed out of it (a restore refuses to write through a planted one), and
every string is inert wherever it is shown: the terminal (control characters shown as
``\\x1b``), HTML (escaped), Markdown (no raw HTML, no links, no code-span breakout) and
MLflow (keys reduced to MLflow's characters).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from acceptrun.checkpoint.files import capture
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.cli.main import main
from acceptrun.errors import UserError
from acceptrun.record.workspace import RunRecord, new_run_id
from acceptrun.supervisor.external import restore_watched
from conftest import only_record_in

SCRIPT_TAG = "<script>alert(1)</script>"
MD_LINK = "[x](javascript:alert(1))"
ESCAPES = "\x1b[2J\x1b]0;pwned\x07"  # clear the screen, retitle the terminal, bell
HOSTILE_NAME = f"{SCRIPT_TAG}{MD_LINK}"

WORK = f"""
import os
import pathlib
import acceptrun

run = acceptrun.init()
for step in run.steps(0, 3):
    run.log(step, loss=1.0 / (step + 1), **{{{json.dumps(ESCAPES + SCRIPT_TAG)}: 1.0}})
run.metric({json.dumps(MD_LINK + "`<img src=x onerror=alert(1)>`")}, 0.5)
run.metric({json.dumps(ESCAPES + "acc")}, 1.0)
run.metric("../../../etc/passwd", 2.0)
pathlib.Path("out").mkdir(exist_ok=True)
pathlib.Path("out/model.txt").write_text("weights")
os.symlink(os.environ["SECRET"], "out/link.txt")
"""


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunRecord, Path]:
    """One real run whose names, metrics and outputs are all hostile: (workspace, record, secret)."""
    root = tmp_path_factory.mktemp("hostile")
    secret = root / "secret.txt"
    secret.write_text("not the run's business")
    proj = root / "proj"
    proj.mkdir()
    (proj / "work.py").write_text(textwrap.dedent(WORK))
    # "../secret.txt" and an absolute path are refused at spec check now (outputs is a
    # workdir-glob field: tests/unit/test_paths_confined.py); a symlink only shows at run time.
    outputs = {"<b>model</b>": "out/model.txt", "link": "out/link.txt"}
    spec = (
        f'name = {json.dumps(HOSTILE_NAME)}\ncommand = [{json.dumps(sys.executable)}, "work.py"]\n'
    )
    spec += "[outputs]\n" + "".join(
        f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in outputs.items()
    )
    (proj / "spec.toml").write_text(spec)
    ws = root / ".acceptrun"
    proc = subprocess.run(
        [sys.executable, "-m", "acceptrun", "--workspace", str(ws), "run", "-q", "spec.toml"],
        cwd=proj, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "SECRET": str(secret)},
    )  # fmt: skip
    assert proc.returncode in (0, 1), (proc.stdout, proc.stderr)
    return ws, only_record_in(ws), secret


pytestmark = pytest.mark.slow


def _main(capsys: pytest.CaptureFixture[str], ws: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main(["--workspace", str(ws), *args])
    except SystemExit as exc:  # argparse's usage error: exit 2, naming the flag
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_id_of_a_hostile_name_stays_in_runs(hostile_run: tuple[Path, RunRecord, Path]) -> None:
    ws, record, _ = hostile_run
    assert record.path.parent == (ws / "runs").resolve() or record.path.parent == ws / "runs"
    for name in ("../../etc", "/etc/passwd", "a" * 5000, ESCAPES, HOSTILE_NAME):
        rid = new_run_id(name)
        assert "/" not in rid and ".." not in rid and rid.isprintable() and len(rid) < 80, rid


def test_outputs_outside_the_workdir_are_never_hashed(
    hostile_run: tuple[Path, RunRecord, Path],
) -> None:
    _, record, secret = hostile_run
    outputs = {e["name"]: e for e in record.events("output")}
    missing = {e["name"]: e for e in record.events("output_missing")}
    assert set(outputs) == {"<b>model</b>"}, outputs
    assert set(missing) == {"link"}, missing
    for name in ("link",):
        assert "outside the workdir" in missing[name]["reason"], missing[name]
    assert all(str(secret) != e["path"] for e in outputs.values())


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_report_shows_hostile_strings_inert(
    hostile_run: tuple[Path, RunRecord, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
) -> None:
    ws, record, _ = hostile_run
    target = tmp_path / f"report.{fmt}"
    rc, _, err = _main(capsys, ws, "report", "--format", fmt, "-o", str(target), record.run_id)
    assert rc == 0, err
    text = target.read_text()
    if fmt == "json":  # data, not markup: every string is JSON-escaped
        json.loads(text)
        assert "\x1b" not in text and "\x07" not in text
        return
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "\x1b" not in text and "\x07" not in text
    if fmt == "md":
        assert not re.search(r"(?<!\\)\]\(javascript:", text)  # "\](" is no link
        assert "&lt;script&gt;" in text  # the name is shown, escaped
    else:
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_terminal_shows_control_characters_as_text(
    hostile_run: tuple[Path, RunRecord, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, record, _ = hostile_run
    rc, out, err = _main(capsys, ws, "show", record.run_id)
    assert rc in (0, 1), err
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b" in out  # the metric is listed, its escape made visible
    rc, out, _ = _main(capsys, ws, "ls")
    assert rc == 0 and "\x1b" not in out


def test_mlflow_export_sanitises_keys_and_tags(
    hostile_run: tuple[Path, RunRecord, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    ws, record, _ = hostile_run
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rc, _, err = _main(capsys, ws, "export", "mlflow", record.run_id, "--tracking-uri", uri)
    assert rc == 0, err
    client = MlflowClient(tracking_uri=uri)
    (exp,) = [e for e in client.search_experiments() if e.name != "Default"]
    (run,) = client.search_runs([exp.experiment_id])
    keys = [*run.data.metrics, *run.data.tags, *run.data.params]
    for key in keys:
        assert key.isprintable() and "<" not in key and ".." not in key.split("/"), key
    for value in run.data.tags.values():
        assert "\x1b" not in value and "\x07" not in value


@pytest.mark.parametrize(
    "run_id", ["../evil", "/tmp/evil", "a/b", ".hidden", "x\x1by", "a" * 300, ""], ids=repr
)
def test_hostile_run_ids_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_id: str
) -> None:
    ws = tmp_path / "ws"
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "t"\ncommand = ["true"]\n')
    before = set(tmp_path.rglob("*"))
    rc, _, err = _main(capsys, ws, "run", "--run-id", run_id, str(spec))
    assert rc == 2, err
    # Refused as the command line is parsed (control characters, empty) or by the run id's
    # own check (a path, a name too long for one): either names the flag.
    assert err.startswith("UserError: ") or "error: argument --run-id:" in err, err
    assert "--run-id" in err, err
    assert "\x1b" not in err
    created = {p for p in set(tmp_path.rglob("*")) - before if not p.is_relative_to(ws)}
    assert created == set(), created
    assert not (ws / "runs").exists() or not any((ws / "runs").iterdir())


def _captured(tmp_path: Path) -> tuple[Path, Path, CheckpointStore]:
    workdir = tmp_path / "work"
    (workdir / "ckpt").mkdir(parents=True)
    (workdir / "ckpt" / "model.pt").write_bytes(b"weights" * 100)
    store = CheckpointStore(tmp_path / "store")
    capture(store, 1, {"model.pt": workdir / "ckpt" / "model.pt"},
            meta={"watched_relative": {"model.pt": "ckpt/model.pt"}})  # fmt: skip
    outside = tmp_path / "outside"
    outside.mkdir()
    return workdir, outside, store


def test_restore_refuses_a_symlinked_directory_planted_in_the_workdir(tmp_path: Path) -> None:
    workdir, outside, store = _captured(tmp_path)
    info = store.latest()
    assert info is not None
    # After the capture the checkpoint directory became a link to somewhere else.
    (workdir / "ckpt" / "model.pt").unlink()
    (workdir / "ckpt").rmdir()
    (workdir / "ckpt").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UserError, match="outside the workdir"):
        restore_watched(info, workdir)
    assert list(outside.iterdir()) == []  # nothing written through the link


def test_restore_replaces_a_planted_file_symlink_without_following_it(tmp_path: Path) -> None:
    workdir, outside, store = _captured(tmp_path)
    info = store.latest()
    assert info is not None
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    (workdir / "ckpt" / "model.pt").unlink()
    (workdir / "ckpt" / "model.pt").symlink_to(victim)
    placed = restore_watched(info, workdir)
    assert placed == workdir / "ckpt" / "model.pt"
    assert not placed.is_symlink() and placed.read_bytes() == b"weights" * 100
    assert victim.read_text() == "keep me"
