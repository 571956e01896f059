"""A checkpoint store belongs to one run: two specs that set the same checkpoint.dir.

Tried as a new user would: a team folder holds ``a.toml`` and ``b.toml``, both with
``checkpoint.dir = "../ckpt"``. Before stores had owners, the second, fresh run resumed
from the first one's step on its attempt 1, was ACCEPTED, and its retention deleted the
first run's checkpoints. Now each run keeps ``ckpt/<run id>/`` with its OWNER.json; every
command that takes a RUN refuses a store another run owns (an older record's layout is
the only way to meet one), and leaves it as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import pytest
from tests.campaign import tally

from acceptrun.checkpoint.owner import OWNER, open_run_store, read_owner, store_root
from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.cli.main import main
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.run.launch import launch

TRAIN = textwrap.dedent(
    """
    import os
    import acceptrun

    total = int(os.environ.get("TOTAL", "30"))
    run = acceptrun.init()
    state = {"w": 0}
    start = run.restore(state=state)
    print(f"attempt {run.attempt} starts at step {start}", flush=True)
    for step in run.steps(start, total):
        state["w"] += step
        run.log(step, loss=1.0 / (step + 1))
        run.maybe_checkpoint(step)
    run.metric("final/w", float(state["w"]))
    """
)


def write_spec(team: Path, name: str) -> Path:
    path = team / f"{name}.toml"
    path.write_text(
        f'name = {json.dumps(name)}\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
        '[checkpoint]\ndir = "../ckpt"\nevery_steps = 10\nkeep_last = 2\n'
        "[limits]\nmax_restarts = 0\n"
    )
    return path


def steps_of(record: RunRecord, attempt: int) -> list[int]:
    return [e["step"] for e in record.events("step") if e.get("attempt") == attempt]


def cli(capsys: pytest.CaptureFixture[str], ws: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--workspace", str(ws), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_two_specs_with_one_checkpoint_dir_keep_their_own_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "train.py").write_text(TRAIN)
    ws = tmp_path / "ws"
    first = launch(write_spec(team, "a"), workspace=ws, echo=False)
    assert first.verdict.accepted
    a = first.record
    a_store = open_run_store(a)
    assert a_store.root == tmp_path / "ckpt" / a.run_id
    a_steps = [i.step for i in a_store.list()]
    assert a_steps == [19, 29]
    before = tree(a_store.root)

    second = launch(write_spec(team, "b"), workspace=ws, echo=False)
    b = second.record
    assert second.verdict.accepted
    # Attempt 1 of the fresh run starts from its own empty store: step 0, nothing restored.
    assert "attempt 1 starts at step 0" in (b.attempt_dir(1) / "stdout.log").read_text()
    assert list(b.events("restored")) == []
    (start,) = b.events("attempt_start")
    assert start.get("resume_step") is None
    assert steps_of(b, 1) == list(range(30))
    b_store = open_run_store(b)
    assert b_store.root == tmp_path / "ckpt" / b.run_id
    assert read_owner(b_store.root).run_id == b.run_id  # type: ignore[union-attr]
    assert read_owner(a_store.root).run_id == a.run_id  # type: ignore[union-attr]

    # The first run's checkpoints are all there, unchanged, and verify.
    assert tree(a_store.root) == before
    assert all(a_store.verify(s).ok for s in a_steps)
    assert [e["step"] for e in b.events("checkpoint_delete")] == [9]  # its own step only

    for record in (a, b):
        code, out, err = cli(capsys, ws, "ckpt", "ls", record.run_id)
        assert code == 0, err
        assert f"(* = LATEST; {store_root(record)})" in out
        listed = [int(line.split()[0].rstrip("*")) for line in out.splitlines()[1:-1]]
        assert listed == [i.step for i in open_run_store(record).list()]
        code, out, err = cli(capsys, ws, "ckpt", "verify", record.run_id)
        assert code == 0 and "step 29: ok" in out, (out, err)

    # Resume of the first run still works, from its own newest step.
    monkeypatch.setenv("TOTAL", "35")
    code, out, err = cli(capsys, ws, "resume", a.run_id, "--force", "-q")
    assert code == 0, (out, err)
    (resumed,) = [e for e in a.events("audit") if e.get("action") == "resume"]
    assert resumed["from_step"] == 29
    assert steps_of(a, 2) == list(range(30, 35))
    assert [e["step"] for e in a.events("restored")] == [29]
    assert [i.step for i in open_run_store(b).list()] == [19, 29]  # b is untouched


def _legacy_pair(tmp_path: Path) -> tuple[Workspace, RunRecord, RunRecord, Path]:
    """Two records from before stores had owners, both with checkpoint.dir = shared.

    The first claimed the shared directory (its OWNER.json and two steps); the second is
    the record that would have mixed with it.
    """
    ws = Workspace(tmp_path / "ws")
    shared = tmp_path / "shared"
    spec = (
        f'name = "legacy"\ncommand = ["true"]\nworkdir = {json.dumps(str(tmp_path))}\n'
        f"[checkpoint]\ndir = {json.dumps(str(shared))}\n"
    )
    state = {"mode": "supervised", "status": "finished", "verdict": "rejected", "attempts": 1}
    owner = ws.create_run("legacy", spec_text=spec, state=dict(state))
    other = ws.create_run("legacy", spec_text=spec, state=dict(state))
    store = open_run_store(owner, claim=True)
    for step in (3, 6):
        w = store.begin(step)
        w.write_bytes("weights.bin", bytes([step]) * 64)
        store.commit(w, metrics={"loss": 1.0 / step})
    return ws, owner, other, shared


def run_commands() -> list[tuple[str, ...]]:
    """Every CLI command (and subcommand) whose first positional argument is a RUN."""
    from acceptrun.cli.main import build_parser

    found: list[tuple[str, ...]] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))
        positional = [a for a in parser._actions if not a.option_strings and a.dest != "help"]
        if path and positional and positional[0].dest == "run":
            found.append(path)

    walk(build_parser(), ())
    return sorted(set(found))


# The commands that open the run's store: each refuses the foreign one (exit 2) naming it.
OPENS_STORE = {("ckpt", "ls"), ("ckpt", "verify"), ("ckpt", "drill"), ("resume",)}


def test_every_run_command_leaves_a_foreign_store_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, owner, other, shared = _legacy_pair(tmp_path)
    before = tree(shared)
    commands = run_commands()
    assert set(commands) >= OPENS_STORE, commands  # the parser still has them
    tracebacks = 0
    for command in commands:
        extra = ["--from-scratch", "--force", "-q"] if command == ("resume",) else []
        try:
            code, out, err = cli(capsys, ws.root, *command, other.run_id, *extra)
        except SystemExit as exc:  # argparse: a command that needs more arguments
            code, (out, err) = int(exc.code or 0), capsys.readouterr()
        except Exception:  # counted and failed below, never silent
            tracebacks += 1
            continue
        assert "Traceback" not in out + err, (command, err)
        if command in OPENS_STORE:
            assert code == 2, (command, out, err)
            assert f"the checkpoint store {shared} belongs to run {owner.run_id}" in err, err
            assert "resume that run" in err  # the fix
        assert tree(shared) == before, command  # nothing restored, pruned or quarantined
    code, out, err = cli(capsys, ws.root, "gc", "--apply")
    assert code == 0, err
    assert tree(shared) == before  # retention keeps both of the owner's steps
    assert f"skipped {other.run_id}: the checkpoint store {shared} belongs to" in out, out
    tally("checkpoint stores shared between runs", tried=len(commands) + 1, tracebacks=tracebacks)
    assert tracebacks == 0
    assert (shared / OWNER).exists() and CheckpointStore(shared).latest() is not None
