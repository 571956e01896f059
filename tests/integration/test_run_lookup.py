"""Runs found across the user's workspaces, as a new user meets them: folders side by side,
none a git repository, each with its own workspace and a real run.

Every command the CLI declares as taking a run (``add_run_argument``, read from the parser
by ``conftest.run_taking_commands``) is run on a run of a sibling folder: it finds it, and
given an id that is nowhere it says which workspaces it searched. A command added
tomorrow is in the list without a line here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import run_taking_commands

PYTHON = sys.executable
DUP = "20261204-000000-twice-0000"  # one id, recorded in two workspaces
NOWHERE = "nosuch-run-zz"

# What a command needs besides its run to get as far as using it.
EXTRA: dict[tuple[str, ...], list[str]] = {
    ("cost", "add"): ["--human-minutes", "1", "--rate", "60"],
    ("cost", "whatif"): ["--on", "lambda:gpu_1x_h100_sxm5"],
    ("reproduce",): ["-q"],
    ("bundle",): ["-o", "bundle.tar.gz", "--force"],
}


def _env(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    return {**env, "ACCEPTRUN_CONFIG_DIR": str(config)}


def _cli(
    cwd: Path, config: Path, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "acceptrun", *args], cwd=cwd, env=_env(config), capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _only_id(folder: Path, skip: tuple[str, ...] = ()) -> str:
    (run_id,) = [p.name for p in (folder / ".acceptrun" / "runs").iterdir()
                 if not p.name.startswith(".") and p.name not in skip]  # fmt: skip
    return run_id


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Folders a, b and c under one parent, and elsewhere (no workspace at all); a run in
    each of a and b, and the run DUP in both b and c."""
    root = tmp_path_factory.mktemp("lookup")
    config = root / "config"
    made: dict[str, Any] = {"root": root, "config": config}
    for name in ("a", "b", "c"):
        folder = root / name
        folder.mkdir()
        (folder / "work.py").write_text(f'print("made in folder {name}")\n')
        (folder / "spec.toml").write_text(
            f'name = "lookup-{name}"\ncommand = [{json.dumps(PYTHON)}, "work.py"]\n'
        )
        made[name] = folder
    for name in ("a", "b"):
        proc = _cli(made[name], config, "run", "-q", "spec.toml")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        made[f"id_{name}"] = _only_id(made[name])
    for name in ("b", "c"):
        proc = _cli(made[name], config, "run", "-q", "--run-id", DUP, "spec.toml")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
    (root / "elsewhere").mkdir()
    return made


@pytest.mark.parametrize(
    ("words", "refs"),
    run_taking_commands(),
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else v,
)
def test_every_command_that_takes_a_run_finds_one_in_a_sibling_workspace(
    folders: dict[str, Any], words: tuple[str, ...], refs: tuple[str, ...]
) -> None:
    a, b, config = folders["a"], folders["b"], folders["config"]
    sibling = folders["id_b"]
    # The first run argument is the sibling's run; a second one is the folder's own.
    given = [sibling, *([folders["id_a"]] * (len(refs) - 1))]
    proc = _cli(a, config, *words, *given, *EXTRA.get(words, []))
    said = proc.stdout + proc.stderr
    assert "no run " not in said, said
    # it acted on b's run: the output names it, its record, or what its script printed
    assert sibling in said or str(b) in said or "made in folder b" in said, (proc.returncode, said)

    missing = [NOWHERE, *([folders["id_a"]] * (len(refs) - 1))]
    proc = _cli(a, config, *words, *missing, *EXTRA.get(words, []))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"no run {NOWHERE!r} in 3 workspace(s)" in proc.stderr, proc.stderr
    for name in ("a", "b", "c"):
        assert str(folders[name] / ".acceptrun") in proc.stderr


@pytest.mark.parametrize(
    ("words", "refs"), run_taking_commands("run_refs_here"),
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else v,
)  # fmt: skip
def test_a_command_that_acts_only_here_says_so(
    folders: dict[str, Any], words: tuple[str, ...], refs: tuple[str, ...]
) -> None:
    from acceptrun.cli.record import HERE_ONLY

    proc = _cli(folders["a"], folders["config"], *words, *[folders["id_b"]] * len(refs))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert HERE_ONLY in proc.stderr, proc.stderr


def test_diff_of_runs_in_sibling_folders_by_id_and_by_path(folders: dict[str, Any]) -> None:
    a, b, config = folders["a"], folders["b"], folders["config"]
    id_a, id_b = folders["id_a"], folders["id_b"]
    by_id = _cli(a, config, "diff", "--json", id_a, id_b)
    assert "no run" not in by_id.stderr, by_id.stderr
    assert by_id.returncode in (0, 1), by_id.stderr  # 1: nothing to compare, not a miss
    path_b = f"../b/.acceptrun/runs/{id_b}"
    by_path = _cli(a, config, "diff", "--json", id_a, path_b)
    assert by_path.returncode == by_id.returncode and by_path.stdout == by_id.stdout
    # and from a folder with no workspace at all, by id
    elsewhere = _cli(folders["root"] / "elsewhere", config, "diff", "--json", id_a, id_b)
    assert elsewhere.stdout == by_id.stdout, elsewhere.stderr
    assert id_a in by_id.stdout and id_b in by_id.stdout
    del b


def test_show_and_report_by_id_and_by_path_from_anywhere(folders: dict[str, Any]) -> None:
    b, config, id_b = folders["b"], folders["config"], folders["id_b"]
    record = b / ".acceptrun" / "runs" / id_b
    for cwd in (folders["a"], folders["root"] / "elsewhere"):
        for ref in (id_b, id_b[:-2], str(record)):  # its id, a unique prefix, its path
            show = _cli(cwd, config, "show", ref)
            assert show.returncode == 0, (ref, show.stderr)
            assert show.stdout.startswith(f"run      {id_b}"), show.stdout
            report = _cli(cwd, config, "report", ref, "--format", "md")
            assert report.returncode == 0 and id_b in report.stdout, (ref, report.stderr)


def test_latest_is_the_current_workspace_s_newest(folders: dict[str, Any]) -> None:
    proc = _cli(folders["a"], folders["config"], "show", "latest")
    assert proc.stdout.startswith(f"run      {folders['id_a']}"), proc.stdout
    nowhere = _cli(folders["root"] / "elsewhere", folders["config"], "show", "latest")
    assert nowhere.returncode == 2
    assert "'latest' is the newest run of the current workspace" in nowhere.stderr


def test_an_id_in_two_workspaces_is_an_error_that_lists_them(folders: dict[str, Any]) -> None:
    b, c, config = folders["b"], folders["c"], folders["config"]
    proc = _cli(folders["a"], config, "show", DUP)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"run {DUP!r} is in more than one of your workspaces" in proc.stderr
    for folder in (b, c):
        assert str(folder / ".acceptrun" / "runs" / DUP) in proc.stderr
    assert "Give the run's directory" in proc.stderr
    # the current workspace's own comes first; a path picks one
    here = _cli(c, config, "show", DUP)
    assert here.returncode == 0 and "lookup-c" in here.stdout, here.stderr
    picked = _cli(folders["a"], config, "show", str(b / ".acceptrun" / "runs" / DUP))
    assert picked.returncode == 0 and "lookup-b" in picked.stdout, picked.stderr


def test_a_named_workspace_is_the_only_one_searched(folders: dict[str, Any]) -> None:
    a = folders["a"]
    proc = _cli(a, folders["config"], "--workspace", str(a), "show", folders["id_b"])
    assert proc.returncode == 2
    assert "--workspace names the workspace, so only it was searched" in proc.stderr


def test_ls_all_leaves_out_workspaces_of_other_users(
    folders: dict[str, Any], tmp_path: Path
) -> None:
    """Another user's workspace in the list (as root: chowned to nobody; else root's own
    folder) is neither listed nor searched, and the listing says how many were left out."""
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    theirs = tmp_path / "theirs" / ".acceptrun"
    if os.geteuid() == 0:
        (theirs / "runs").mkdir(parents=True)
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")
    entries = [{"path": str(p), "project": p.parent.name, "added_at": 1.0, "last_used": 1.0}
               for p in (folders["a"] / ".acceptrun", theirs)]  # fmt: skip
    (config / "workspaces.json").write_text(
        json.dumps({"kind": "acceptrun.workspaces", "schema": 1, "workspaces": entries})
    )
    proc = _cli(folders["root"] / "elsewhere", config, "ls", "--all")
    assert proc.returncode == 0, proc.stderr
    assert folders["id_a"] in proc.stdout
    assert "note: 1 workspace of other users left out" in proc.stdout
    # ui --all reads the same list the same way: only another user's workspace is no board
    (config / "workspaces.json").write_text(
        json.dumps({"kind": "acceptrun.workspaces", "schema": 1, "workspaces": entries[1:]})
    )
    ui = _cli(folders["root"] / "elsewhere", config, "ui", "--all", "--port", "0", timeout=60)
    assert ui.returncode == 2, (ui.stdout, ui.stderr)
    assert "no listed workspace of yours exists (1 workspace of other users left out" in ui.stderr
    (config / "workspaces.json").chmod(0o666)
    refused = _cli(folders["root"] / "elsewhere", config, "ls", "--all")
    assert refused.returncode == 2
    assert "workspaces.json is writable by every user (mode 0666), so it is not read" in (
        refused.stderr
    )
