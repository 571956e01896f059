"""Every string of the spec reaches a Slurm script or a YAML export inert, or is refused.

Each string field of the declaration (and each list or table of strings), enumerated from
RunSpec, gets a value that tries to break out of a line: a newline, then a ``#SBATCH``
header, then a YAML key. Either ``parse_spec`` refuses it naming the field, or every
export built from the spec carries it inert: the Slurm batch script has no header or
command line it did not write, and the Kubernetes and SkyPilot YAML parse back (with
``yaml.safe_load``) to exactly the objects the export meant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from tests.campaign import tally

from acceptrun.backends.kubernetes import KubernetesOptions, export_manifests
from acceptrun.backends.skypilot import task_yaml
from acceptrun.backends.slurm import batch_script
from acceptrun.errors import SpecError, UserError
from acceptrun.record.workspace import Workspace
from acceptrun.spec.fields import fields_of
from acceptrun.spec.model import RunSpec, load_spec, parse_spec

INJECTED = "#SBATCH --wrap=evil"
PAYLOAD = f"v\n{INJECTED}\nevil_field: injected\n- evil_item"
BASE = 'name = "t"\ncommand = ["python", "train.py"]\n'


def _strip_none(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    return args[0] if type(None) in get_args(tp) and len(args) == 1 else tp


def string_slots(cls: type = RunSpec, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted field path, "str" | "list" | "dict") of every field that holds strings."""
    hints = typing.get_type_hints(cls)
    for name, _ in fields_of(cls).items():
        tp = _strip_none(hints[name])
        if dataclasses.is_dataclass(tp):
            yield from string_slots(tp, f"{prefix}{name}.")  # type: ignore[arg-type]
        elif tp is str:
            yield f"{prefix}{name}", "str"
        elif get_origin(tp) is list and get_args(tp) == (str,):
            yield f"{prefix}{name}", "list"
        elif get_origin(tp) is dict and get_args(tp)[-1] is str:
            yield f"{prefix}{name}", "dict"


SLOTS = list(string_slots())


# A section whose fields only count once it is switched on: the keys that switch it on.
ENABLE = {
    "inference": {"input": '"items.jsonl"'},
    "serving": {
        "url": '"http://127.0.0.1:8000/v1"', "ready_url": '"http://127.0.0.1:8000/health"',
        "rate": "1.0", "duration": '"10s"',
    },
}  # fmt: skip


def _spec_text(path: str, kind: str, value: str) -> str:
    *section, name = path.split(".")
    item = {"str": json.dumps(value), "list": f"[{json.dumps(value)}]"}.get(
        kind, f"{{ k = {json.dumps(value)} }}"
    )
    line = f"{name} = {item}\n"
    if not section:  # a top-level key: it replaces the base's own
        top = {"name": '"t"', "command": '["python", "train.py"]', name: item}
        return "".join(f"{k} = {v}\n" for k, v in top.items())
    table = ".".join(section)
    enable = {k: v for k, v in ENABLE.get(table, {}).items() if k != name}
    return BASE + f"[{table}]\n{line}" + "".join(f"{k} = {v}\n" for k, v in enable.items())


def _exports(spec: RunSpec, tmp: Path) -> dict[str, str]:
    """Every export of the spec as text; an export that refuses the spec is left out."""
    out: dict[str, str] = {}
    ws = Workspace(tmp / "ws" / ".acceptrun")
    # An export that refuses the spec says why and writes nothing: nothing injected.
    with contextlib.suppress(UserError):
        out["slurm"] = batch_script(
            spec, workspace=ws, run_id="r1", spec_file=tmp / "spec.toml", job_dir=tmp / "job"
        )
    with contextlib.suppress(UserError):
        out["kubernetes"] = export_manifests(
            spec, KubernetesOptions(image="i:1", run_id="r1")
        ).yaml()
    with contextlib.suppress(UserError):
        out["skypilot"] = task_yaml(spec, run_id="r1")
    return out


def _slurm_lines_injected(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith((INJECTED, "evil_field", "- evil"))]


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return {str(k) for k in value} | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _load(root: Path, text: str) -> RunSpec:
    """The spec as a project holds it: spec.toml beside train.py (the exports read both)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "spec.toml").write_text(text)
    return load_spec(root / "spec.toml")


def test_the_declaration_has_string_slots() -> None:
    kinds = {kind for _, kind in SLOTS}
    assert kinds == {"str", "list", "dict"} and len(SLOTS) >= 40, SLOTS


@pytest.mark.parametrize("path,kind", [pytest.param(p, k, id=p) for p, k in SLOTS])
def test_a_line_breaking_string_is_refused_or_inert_in_every_export(
    tmp_path: Path, path: str, kind: str
) -> None:
    named = f"{path}.k" if kind == "dict" else path
    tracebacks = 0  # any other exception fails the test before it tallies
    try:
        spec = _load(tmp_path / "planted", _spec_text(path, kind, PAYLOAD))
    except SpecError as exc:
        # Refused: the problem names the field (or a rule that needs a sibling field).
        assert any(p.startswith((named, path)) for p in exc.problems), exc.problems
        tally("spec strings reaching a shell/Slurm/YAML", tried=1, tracebacks=0)
        return
    base = _load(tmp_path / "clean", BASE)
    planted, clean = _exports(spec, tmp_path / "p"), _exports(base, tmp_path / "b")
    assert set(planted) == set(clean), (planted.keys(), clean.keys())
    if "slurm" in planted:
        assert not _slurm_lines_injected(planted["slurm"]), planted["slurm"]
        headers = [ln for ln in planted["slurm"].splitlines() if ln.startswith("#SBATCH")]
        assert len(headers) >= len(
            [ln for ln in clean["slurm"].splitlines() if ln.startswith("#SBATCH")]
        )
    if "kubernetes" in planted:
        docs = list(yaml.safe_load_all(planted["kubernetes"]))
        again = export_manifests(spec, KubernetesOptions(image="i:1", run_id="r1")).documents
        assert [d for d in docs if d is not None] == again  # parses back to what was meant
        assert "evil_field" not in _keys(docs)
    if "skypilot" in planted:
        task = yaml.safe_load(planted["skypilot"])
        assert "evil_field" not in _keys(task)
        assert set(task) == set(yaml.safe_load(clean["skypilot"]))
    tally("spec strings reaching a shell/Slurm/YAML", tried=1, tracebacks=tracebacks)


def test_the_slurm_writer_refuses_a_line_break_on_its_own(tmp_path: Path) -> None:
    """Defence in depth: a spec built in code past the parser still cannot inject a header."""
    spec = _load(tmp_path, BASE + '[slurm]\npartition = "gpu"\n')
    spec.slurm.partition = PAYLOAD  # as a caller that skipped validation
    ws = Workspace(tmp_path / ".acceptrun")
    with pytest.raises(UserError, match="control character"):
        batch_script(spec, workspace=ws, run_id="r1", spec_file=tmp_path / "s", job_dir=tmp_path)


def test_a_newline_in_slurm_partition_is_refused_at_spec_check() -> None:
    """The issue's example: it broke out of the #SBATCH line into the job script's body."""
    with pytest.raises(SpecError) as info:
        parse_spec(BASE + f"[slurm]\npartition = {json.dumps('gpu' + chr(10) + 'rm -rf ~')}\n")
    (problem,) = info.value.problems
    assert problem.startswith("slurm.partition:") and "one line of text" in problem
