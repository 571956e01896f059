"""Paths are confined by one mechanism: the spec's declared reach, then acceptrun._util.paths.

Every path-typed field of the spec declaration (found by its format, walked from RunSpec,
never listed by hand) is tried with ``..``, absolute, home, NUL, newline and
workspace-matching values: a field confined to the workdir is refused at parse time
naming the field; a field that may reach elsewhere declares why. The helper itself is
tried on real files and symlinks; manifest entries that lead out are corrupt input.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
from tests.campaign import tally

from acceptrun._util.paths import (
    WORKSPACE_NAME,
    check_removable,
    confine,
    escape_problem,
    lexical_problem,
)
from acceptrun.capture.data import load_manifest, snapshot, verify, write_manifest
from acceptrun.checkpoint.files import capture, put_back
from acceptrun.checkpoint.store import CheckpointInfo, CheckpointStore
from acceptrun.errors import DataError, RecordError, SpecError, UserError
from acceptrun.record.workspace import WORKSPACE_DIR
from acceptrun.spec.fields import FORMATS, fields_of, rules_of
from acceptrun.spec.model import RunSpec, parse_spec

MINIMAL = 'name = "t"\ncommand = ["python", "train.py"]\n'

# Values that lead out of the workdir, or into the workspace, or that the OS refuses.
ESCAPING = {
    "parent": "../victim/*",
    "parent-inside": "out/../../victim",
    "absolute": "/etc",
    "home": "~/victim",
    "workspace": ".acceptrun",
    "workspace-run": ".acceptrun/runs/x",
    "workspace-glob": "sub/.acceptrun/*",
    "nul": "out\x00x",
    "newline": "out\n#SBATCH --wrap=evil",
}
# What a field that may reach elsewhere still refuses: what no path holds.
NEVER_A_PATH = ("nul", "newline")


def _strip_none(tp: Any) -> Any:
    if get_origin(tp) in (Union, typing.Union) or type(tp).__name__ == "UnionType":
        return next(a for a in get_args(tp) if a is not type(None))
    return tp


def walk(
    cls: type = RunSpec, prefix: str = ""
) -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """(dotted path, field, type) of every declared field, nested sections included."""
    hints = typing.get_type_hints(cls)
    for name, f in fields_of(cls).items():
        tp = _strip_none(hints[name])
        if dataclasses.is_dataclass(tp):
            yield from walk(tp, f"{prefix}{name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{name}", f, tp


PATH_FIELDS = [
    (path, f, tp) for path, f, tp in walk() if FORMATS.get(rules_of(f).format or "", None)
    and FORMATS[str(rules_of(f).format)].reach is not None
]  # fmt: skip


def _toml(path: str, tp: Any, value: str) -> tuple[str, str]:
    """Spec text setting ``path`` to ``value`` (as a list item or table value when it is one),
    and the field path an error about it names."""
    *section, name = path.split(".")
    origin = get_origin(tp)
    if origin is list:
        item, named = f"[{json.dumps(value)}]", path
    elif origin is dict:
        item, named = f"{{ k = {json.dumps(value)} }}", f"{path}.k"
    else:
        item, named = json.dumps(value), path
    if section:
        return MINIMAL + f"[{'.'.join(section)}]\n{name} = {item}\n", named
    return MINIMAL + f"{name} = {item}\n", named


def _problems(text: str) -> list[str]:
    try:
        parse_spec(text)
    except SpecError as exc:
        return list(exc.problems)
    return []


def test_the_declaration_has_path_fields_of_both_reaches() -> None:
    reaches = {FORMATS[str(rules_of(f).format)].reach for _, f, _ in PATH_FIELDS}
    assert reaches == {"workdir", "anywhere"}
    names = {p for p, _, _ in PATH_FIELDS}
    # The fields the issue names are among them (a drop of a format would show here).
    assert {"cleanup.remove", "outputs", "checkpoint.watch", "data.path", "checkpoint.dir"} <= names


@pytest.mark.parametrize("path,f,tp", [pytest.param(*c, id=c[0]) for c in PATH_FIELDS])
def test_every_path_field_is_confined_or_says_why_not(
    path: str, f: dataclasses.Field[Any], tp: Any
) -> None:
    rules = rules_of(f)
    reach = FORMATS[str(rules.format)].reach
    tried = tracebacks = outside = 0
    for label, value in ESCAPING.items():
        tried += 1
        text, named = _toml(path, tp, value)
        try:
            found = _problems(text)
        except Exception:  # a traceback instead of a SpecError is what this test hunts
            tracebacks += 1
            continue
        # The problems about this value's path format (cross-field rules aside).
        accepts = FORMATS[str(rules.format)].accepts
        mine = [p for p in found if p.startswith(f"{named}:") and accepts in p]
        if reach == "workdir" or label in NEVER_A_PATH:
            assert mine, (label, value, found)
            assert repr(value) in mine[0], mine[0]
        else:
            assert not mine, (label, mine)
    if reach == "anywhere":
        assert rules.reach and len(rules.reach) > 10, (
            f"{path} must say why it may leave the workdir"
        )
    else:
        assert rules.reach is None
    tally("spec path fields", tried=tried, tracebacks=tracebacks, outside=outside)
    assert tracebacks == 0


def test_string_fields_named_like_paths_declare_a_path_format() -> None:
    """A new path field without a declared reach fails here (and at import: Rules asserts)."""
    words = ("path", "dir", "file", "manifest", "watch", "remove", "outputs", "payload",
             "tensorboard", "workdir", "mirror", "input", "output")  # fmt: skip
    checked = 0
    for path, f, tp in walk():
        leaf = path.rsplit(".", 1)[-1]
        scalar = get_args(tp)[-1] if get_origin(tp) in (list, dict) else tp
        named = any(w == leaf or leaf.endswith(f"_{w}") for w in words)
        told = any(w in f.metadata["doc"].lower() for w in ("path", "file", "director", "glob"))
        if scalar is not str or not (named and told):
            continue
        fmt = rules_of(f).format
        assert fmt is not None and FORMATS[fmt].reach is not None, (
            f"{path} looks like a path: declare format='workdir-glob' (confined) or "
            "format='path' with reach='why it may lead elsewhere'"
        )
        checked += 1
    assert checked >= 10  # data.path, checkpoint.dir, cleanup.remove, outputs, ...


def test_the_workspace_name_is_the_one_the_workspace_uses() -> None:
    assert WORKSPACE_NAME == WORKSPACE_DIR


def test_frozen_spec_with_absolute_paths_loads_again(tmp_path: Path) -> None:
    """Fields that may reach elsewhere are made absolute by to_toml; they must load back."""
    text = MINIMAL + '[data]\npath = "../data"\n[checkpoint]\ndir = "/tmp/ck"\n'
    spec = parse_spec(text, base_dir=tmp_path)
    again = parse_spec(spec.to_toml(), base_dir=tmp_path)
    assert again.workdir == str(tmp_path.resolve())


# ---- env names ---------------------------------------------------------------------------------

BAD_ENV_NAMES = {"equals": "A=B", "nul": "A\x00B", "empty": "", "newline": "A\nB", "esc": "A\x1bB"}


@pytest.mark.parametrize("name", [pytest.param(v, id=k) for k, v in BAD_ENV_NAMES.items()])
def test_env_names_the_os_refuses_are_refused_at_parse(name: str) -> None:
    text = MINIMAL + f'[env]\n{json.dumps(name)} = "1"\n'
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    (problem,) = info.value.problems
    assert problem.startswith("env.") and "environment variable name" in problem, problem
    assert "\n" not in problem  # the message itself is one line
    tally("env names", tried=1, tracebacks=0)


def test_env_names_the_os_takes_are_accepted() -> None:
    spec = parse_spec(MINIMAL + '[env]\nHF_HOME = "/x"\n"a.b-c" = "1"\nX = "line1\\nline2"\n')
    assert spec.env == {"HF_HOME": "/x", "a.b-c": "1", "X": "line1\nline2"}


# ---- the helper on real files -------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A workdir with a workspace, a store and data in it, and a victim outside it."""
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "tmp.bin").write_bytes(b"x")
    (work / ".acceptrun" / "runs" / "r1").mkdir(parents=True)
    (work / "ckpt").mkdir()
    (work / "data").mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (work / "link").symlink_to(victim, target_is_directory=True)
    (work / "filelink").symlink_to(victim / "precious.txt")
    return {"work": work, "victim": victim}


def test_confine_refuses_what_leads_out(tree: dict[str, Path]) -> None:
    work = tree["work"]
    assert confine(work, "out/tmp.bin", field="outputs.m") == (work / "out/tmp.bin").resolve()
    assert confine(work, "new/not-yet.txt", field="x") == work.resolve() / "new/not-yet.txt"
    for rel in ("../victim", "/etc", "link/precious.txt", "filelink", "out/../../victim", "a\x00"):
        with pytest.raises(UserError) as info:
            confine(work, rel, field="cleanup.remove", fix="name a path inside the workdir")
        text = str(info.value)
        assert text.startswith("cleanup.remove: ") and repr(rel) in text
        assert "name a path inside the workdir" in text
    with pytest.raises(RecordError):
        confine(work, "../x", field="manifest entry", error=RecordError)


def test_removal_guard(tree: dict[str, Path]) -> None:
    work, victim = tree["work"], tree["victim"]
    protected = [work / ".acceptrun", work / ".acceptrun/runs/r1", work / "ckpt", work / "data"]

    def why(rel: str) -> str | None:
        return check_removable(work / rel, workdir=work, protected=protected)

    assert why("out/tmp.bin") is None
    assert why("out") is None
    assert why("link") is None  # the link itself: removing it leaves the victim
    assert why("filelink") is None
    refused = {
        "link/precious.txt": "outside the workdir",
        ".acceptrun": "workspace",
        ".acceptrun/runs/r1": "workspace",
        "ckpt": "keeps",
        "data": "keeps",
        ".": "outside the workdir",
        "..": "outside the workdir",
    }
    for rel, words in refused.items():
        reason = why(rel)
        assert reason is not None and reason.startswith("refused") and words in reason, (
            rel,
            reason,
        )
    # A folder that holds a protected path is refused too; one holding a workspace as well.
    (work / "nest").mkdir()
    (work / "nest" / WORKSPACE_NAME).mkdir()
    assert "workspace" in str(why("nest"))
    holder = check_removable(work, workdir=work.parent, protected=protected)
    assert holder is not None and "holds" in holder
    assert (victim / "precious.txt").read_text() == "keep me"


def test_lexical_rules() -> None:
    assert lexical_problem("out/*.pt") is None and escape_problem("files/a/b") is None
    for value in ("", "../x", "/x", "a\x00"):
        assert lexical_problem(value) and escape_problem(value), value
    assert lexical_problem("~/x") and escape_problem("~x") is None  # a stored name "~x" is fine
    assert lexical_problem(".acceptrun/runs") and escape_problem(".acceptrun/runs") is None


# ---- manifest entries ---------------------------------------------------------------------------

ESCAPING_ENTRIES = ("../../etc/passwd", "/etc/passwd", "a/../../x", "", "a\x00b")


@pytest.mark.parametrize("entry", [pytest.param(e, id=repr(e)) for e in ESCAPING_ENTRIES])
def test_a_data_manifest_entry_leading_out_is_a_corrupt_manifest(
    tmp_path: Path, entry: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("a")
    manifest = snapshot(data)
    manifest["files"][entry] = dict(manifest["files"]["a.txt"])
    path = tmp_path / "m.json"
    write_manifest(path, manifest)
    tracebacks = 0
    with pytest.raises(DataError) as info:
        verify(data, load_manifest(path))
    assert repr(entry) in str(info.value) and "not a path inside the data" in str(info.value)
    tally("manifest entries", tried=1, tracebacks=tracebacks)


@pytest.mark.parametrize("entry", [pytest.param(e, id=repr(e)) for e in ESCAPING_ENTRIES])
def test_a_checkpoint_manifest_entry_leading_out_fails_verification(
    tmp_path: Path, entry: str
) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep_last=2)
    src = tmp_path / "work" / "ckpt.pt"
    src.parent.mkdir()
    src.write_bytes(b"weights")
    info, _ = capture(store, 1, {"ckpt.pt": src})
    manifest_path = info.path / "MANIFEST.json"
    doc = json.loads(manifest_path.read_text())
    doc["files"][entry] = dict(doc["files"]["files/ckpt.pt"])
    doc.pop("digest", None)  # as an old or hand-edited manifest: the entry rule still holds
    manifest_path.write_text(json.dumps(doc))
    result = store.verify(1)
    assert not result.ok and any("bad entry" in p or "digest" in p for p in result.problems), result
    tally("manifest entries", tried=1, tracebacks=0)


def test_a_restore_never_writes_outside_its_target(tmp_path: Path) -> None:
    """Defence in depth: a manifest that escaped the store's checks still cannot lead put_back out."""
    store = CheckpointStore(tmp_path / "ckpt", keep_last=2)
    src = tmp_path / "work" / "out"
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(b"w")
    info, _ = capture(store, 1, {"out": src})
    files = {"files/out/../../../../escaped.bin": info.files["files/out/w.bin"], **info.files}
    hostile = CheckpointInfo(info.step, info.path, info.created_at, files, info.total_bytes,
                             info.metrics, info.meta)  # fmt: skip
    with pytest.raises(RecordError, match="leads outside"):
        put_back(hostile, {"out": tmp_path / "restored"})
    assert not list(tmp_path.rglob("escaped.bin"))
    assert not (tmp_path / "restored").exists()  # a failed restore leaves what was there
    assert os.listdir(tmp_path / "work" / "out") == ["w.bin"]
