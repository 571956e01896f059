"""Nothing the user wrote is overwritten: every ``-o/--output/--out`` option the parser
declares refuses an existing file that is not its own earlier output unless ``--force``,
never takes a file its command reads (the spec, the data), even with ``--force``, and
replaces its own earlier output without ``--force``.

The options come from walking ``build_parser()``: one added tomorrow without a case here
fails :func:`test_every_output_option_has_a_case` until it gets one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from parser_walk import arguments, leaves

from acceptrun.cli.main import build_parser
from campaign import tally
from conftest import Project

USER_BYTES = b"my own notes, not acceptrun's\n"


@dataclass
class Case:
    """How to run one output option: argv for an output path, and the files it reads."""

    argv: Callable[[Path], list[str]]
    ext: str
    inputs: list[Path] = field(default_factory=list)
    # Whether --force and a re-run can be tried here: False where the command does long work
    # (a tuning sweep, a benchmark) after the output is claimed; its refusals still are.
    writes: bool = True
    own_rerun: bool = True  # False: the bundle refuses every existing file, its own too


def _run(project: Project) -> None:
    spec = project.spec("print('step 1: loss 0.5')\n")
    project.cli("run", str(spec), check_rc=0, timeout=120)


def _report(project: Project) -> Case:
    _run(project)
    return Case(lambda out: ["report", "latest", "--format", "md", "-o", str(out)], ".md")


def _bundle(project: Project) -> Case:
    _run(project)
    return Case(lambda out: ["bundle", "latest", "-o", str(out)], ".tar.gz", own_rerun=False)


def _snapshot(project: Project) -> Case:
    data = project.root / "data.bin"
    data.write_bytes(b"\x00" * 1000)
    return Case(lambda out: ["data", "snapshot", str(data), "-o", str(out)], ".json", [data])


def _skypilot(project: Project) -> Case:
    spec = project.spec("print('hi')\n")
    return Case(lambda out: ["export", "skypilot", str(spec), "-o", str(out)], ".yaml", [spec])


def _kubernetes(project: Project) -> Case:
    spec = project.spec("print('hi')\n", extra='[env]\nAPI_TOKEN = "not-a-real-one"\n')
    argv = ["export", "kubernetes", str(spec), "--image", "example.org/train:1"]
    return Case(lambda out: [*argv, "-o", str(out)], ".yaml", [spec])


def _tune(project: Project) -> Case:
    target = project.root / "target.py"
    target.write_text("def make():\n    raise SystemExit('not a tune target')\n")
    argv = ["tune", f"{target}:make"]
    return Case(lambda out: [*argv, "--out", str(out)], ".toml", [target], writes=False)


def _bench(project: Project) -> Case:
    return Case(
        lambda out: ["bench", "comm", "--timeout", "1", "--out", str(out)], ".json", writes=False
    )


CASES: dict[tuple[str, ...], Callable[[Project], Case]] = {
    ("report",): _report,
    ("bundle",): _bundle,
    ("data", "snapshot"): _snapshot,
    ("export", "skypilot"): _skypilot,
    ("export", "kubernetes"): _kubernetes,
    ("tune",): _tune,
    ("bench", "comm"): _bench,
}
# -o DIR: the wheel is written into a folder under the name of acceptrun's version.
NOT_A_FILE = {("export", "wheel")}


def output_options() -> list[tuple[str, ...]]:
    """Every command with an -o/--output/--out option, from the parser."""
    found = []
    for leaf in leaves(build_parser()):
        opts = [a for a in arguments(leaf.parser) if isinstance(a, argparse._StoreAction)]
        if any(a.dest in ("output", "out") and a.option_strings for a in opts):
            found.append(leaf.words)
    return found


def test_every_output_option_has_a_case() -> None:
    declared = set(output_options())
    assert declared - NOT_A_FILE == set(CASES), "give each new output option a case here"


@pytest.mark.parametrize("words", list(CASES), ids=" ".join)
def test_an_output_never_replaces_what_the_user_wrote(
    project: Project, words: tuple[str, ...]
) -> None:
    case = CASES[words](project)
    out = project.root / f"mine{case.ext}"
    tried = overwritten = 0

    def attempt(path: Path, *more: str) -> str:
        nonlocal tried
        tried += 1
        proc = project.cli(*case.argv(path), *more, timeout=120)
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
        return proc.stderr

    # A file the user wrote: refused, naming it and the fix, left byte for byte.
    out.write_bytes(USER_BYTES)
    err = attempt(out)
    assert str(out) in err and "--force" in err, err
    overwritten += out.read_bytes() != USER_BYTES
    # Its own input as its output: refused even with --force.
    for source in case.inputs:
        before = source.read_bytes()
        err = attempt(source, "--force")
        assert "which this command reads" in err, err
        overwritten += source.read_bytes() != before
    assert overwritten == 0
    if case.writes:
        # With --force the user's file is replaced; a re-run replaces its own output without.
        project.cli(*case.argv(out), "--force", check_rc=0, timeout=120)
        first = out.read_bytes()
        assert first != USER_BYTES
        if case.own_rerun:
            project.cli(*case.argv(out), check_rc=0, timeout=120)
            assert out.stat().st_size > 0
        else:
            assert "--force" in project.cli(*case.argv(out), check_rc=2).stderr
            assert out.read_bytes() == first
        tried += 2
    tally("outputs", tried=tried, overwritten=overwritten)


def test_kubernetes_secret_file_is_claimed_too(project: Project) -> None:
    # The Secret beside the manifests is refused like them, before either is written.
    case = _kubernetes(project)
    out = project.root / "job.yaml"
    secret = project.root / "job.secret.yaml"
    secret.write_bytes(USER_BYTES)
    proc = project.cli(*case.argv(out), check_rc=2)
    assert str(secret) in proc.stderr and "--force" in proc.stderr
    assert secret.read_bytes() == USER_BYTES and not out.exists()
    project.cli(*case.argv(out), "--force", check_rc=0)
    assert secret.stat().st_mode & 0o777 == 0o600 and b"not-a-real-one" in secret.read_bytes()
    project.cli(*case.argv(out), check_rc=0)  # both are its own now
    tally("outputs", tried=3, overwritten=0)


def test_a_manifest_never_replaces_a_file_of_the_folder_it_hashes(project: Project) -> None:
    data = project.root / "data"
    data.mkdir()
    (data / "train.csv").write_bytes(USER_BYTES)
    err = project.cli("data", "snapshot", str(data), "-o", str(data / "train.csv"), "--force",
                      check_rc=2).stderr  # fmt: skip
    assert "which this command reads" in err and (data / "train.csv").read_bytes() == USER_BYTES
    # Its own manifest inside the folder is left out of the hash and replaced on a re-run.
    for _ in range(2):
        project.cli("data", "snapshot", str(data), "-o", str(data / "m.json"), check_rc=0)
    assert '"count": 1' in (data / "m.json").read_text()
    tally("outputs", tried=3, overwritten=0)
