"""Run spec: loading, validation messages, durations, patterns, schema, frozen copy."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from acceptrun.errors import SpecError
from acceptrun.spec.model import (
    Condition,
    format_duration,
    load_spec,
    match_pattern,
    parse_condition,
    parse_duration,
    parse_spec,
)
from acceptrun.spec.schema import json_schema, starter_spec

MINIMAL = 'name = "job"\ncommand = ["python", "train.py"]\n'


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="spec.toml")
    return info.value.problems


def test_minimal_spec_has_defaults() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.name == "job"
    assert spec.command == ["python", "train.py"]
    assert spec.limits.max_restarts == 3
    assert spec.limits.grace_period == 30.0
    assert spec.checkpoint.keep_last == 2
    assert not spec.shell


def test_full_spec_parses_every_section(tmp_path: Path) -> None:
    text = MINIMAL + (
        'workdir = "sub"\nenv = { OMP_NUM_THREADS = "4" }\n'
        '[resources]\ngpus = 8\ngpu_types = ["H100", "H200"]\nmin_gpu_memory_gb = 80\n'
        '[expect]\npython = ">=3.11"\npackages = { torch = "2.13.*" }\ncuda = "12.*"\ndriver = ">=550"\ngpu = "H100"\n'
        '[data]\npath = "data"\nmanifest = "data.manifest.json"\n'
        '[checkpoint]\nevery_steps = 500\nevery = "30m"\nkeep_last = 3\nkeep_every = 5000\n'
        'keep_best = "eval/loss:min"\nmirror = "s3://bucket/ckpt"\n'
        '[limits]\nwall_time = "1h30m"\nexpected_runtime = ["20m", "2h"]\nmax_restarts = 5\n'
        'budget_usd = 40\nidle_window = "15m"\nhang_window = 600\ngrace_period = "45s"\n'
        '[cost]\nprovider = "lambda"\ninstance = "gpu_8x_h100_sxm5"\nprice_per_hour = 23.92\n'
        '[acceptance]\noutputs = ["model"]\ndrills = ["restore"]\n'
        '[acceptance.metrics]\n"eval/f1" = ">= 90"\n'
        '[cleanup]\ncommands = ["rm -rf /tmp/x"]\nremove = ["tmp/*"]\n'
    )
    (tmp_path / "spec.toml").write_text(text)
    spec = load_spec(tmp_path / "spec.toml")
    assert spec.workdir_path == (tmp_path / "sub").resolve()
    assert spec.limits.wall_time == 5400.0
    assert spec.limits.expected_runtime == [1200.0, 7200.0]
    assert spec.limits.hang_window == 600.0
    assert spec.checkpoint.every == 1800.0
    assert spec.acceptance.metrics == {"eval/f1": ">= 90"}
    assert spec.resolve_path("data") == str((tmp_path / "data").resolve())
    assert spec.resolve_path("s3://bucket/x") == "s3://bucket/x"


def test_string_command_runs_through_the_shell() -> None:
    spec = parse_spec('name = "j"\ncommand = "python train.py --lr 3e-4 && echo done"\n')
    assert spec.command == ["/bin/sh", "-c", "python train.py --lr 3e-4 && echo done"]
    assert spec.shell


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            MINIMAL + "[limits]\nwal_time = '2h'\n",
            "limits.wal_time: unknown key; did you mean 'wall_time'?",
            id="typo",
        ),
        pytest.param(
            MINIMAL + "[resource]\ngpus = 1\n",
            "resource: unknown key; did you mean 'resources'?",
            id="typo-section",
        ),
        pytest.param(
            MINIMAL + "[checkpoint]\nevery_steps = -5\n",
            "checkpoint.every_steps: -5 is not valid; expected a positive step count",
            id="negative-interval",
        ),
        pytest.param(
            MINIMAL + "[checkpoint]\nkeep_last = 1\n",
            "checkpoint.keep_last: 1 is not valid; expected 2 or more: the newest checkpoint may still be saving",
            id="keep-one",
        ),
        pytest.param(
            MINIMAL + "[limits]\nwall_time = 'forever'\n",
            "limits.wall_time: 'forever' is not valid; expected a duration",
            id="bad-duration",
        ),
        pytest.param(
            MINIMAL + "[limits]\nexpected_runtime = ['2h', '1h']\n",
            "limits.expected_runtime: ['2h00m', '1h00m'] is not valid; expected two durations [min, max] with min <= max",
            id="range-order",
        ),
        pytest.param(
            MINIMAL + "[limits]\nmax_restarts = 'three'\n",
            "limits.max_restarts: 'three' is not valid; expected a whole number",
            id="type",
        ),
        pytest.param(
            MINIMAL + "[acceptance.metrics]\n'eval/acc' = 'at least 0.9'\n",
            'acceptance.metrics."eval/acc": \'at least 0.9\' is not valid; expected a threshold such as ">= 0.9"',
            id="condition",
        ),
        pytest.param(
            MINIMAL + "[acceptance]\ndrills = ['fire']\n",
            "acceptance.drills: 'fire' is not valid; expected one of restore, kill, preempt",
            id="drill",
        ),
        pytest.param(
            MINIMAL + "[expect]\npython = '>>3'\n",
            "expect.python: '>>3' is not valid; expected a version pattern",
            id="pattern",
        ),
        pytest.param(
            MINIMAL + "[cost]\nprice_per_hour = -1.0\n",
            "cost.price_per_hour: -1.0 is not valid; expected 0 or more USD per hour",
            id="negative-price",
        ),
        pytest.param('command = ["x"]\n', "name: missing; Name of the job", id="missing-name"),
        pytest.param(
            'name = "x"\ncommand = []\n',
            "command: [] is not valid; expected a command such as",
            id="empty-command",
        ),
        pytest.param(
            MINIMAL + "limits = 3\n",
            "limits: 3 is not valid; expected a table ([limits])",
            id="not-a-table",
        ),
    ],
)
def test_validation_names_path_value_and_fix(text: str, expected: str) -> None:
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


_INSIDE = "expected a path or glob inside the workdir, relative to it"


@pytest.mark.parametrize(
    ("watch", "why"),
    [
        pytest.param("../ckpt.pt", "a '..' part leads out of it", id="parent"),
        pytest.param("out/../../ckpt.pt", "a '..' part leads out of it", id="parent-inside"),
        pytest.param("/tmp/ckpt.pt", "an absolute path", id="absolute"),
        pytest.param("/", "an absolute path", id="root"),
    ],
)
def test_watched_checkpoints_must_stay_inside_the_workdir(watch: str, why: str) -> None:
    """As outputs: a restart writes a watched checkpoint back where it was declared."""
    text = MINIMAL + f"[checkpoint]\nwatch = ['out/ok.pt', {watch!r}]\n"
    (found,) = problems(text)
    assert found.startswith(f"checkpoint.watch: {watch!r} is not valid; {_INSIDE}"), found
    assert "name what the run writes under its workdir" in found, found
    assert found.endswith(f"({why})"), found


def test_watched_checkpoints_inside_the_workdir_load() -> None:
    watch = ["out/ckpt.pt", "output/checkpoint-*", "a..b/c", ".hidden/ck", "./ck/*.pt"]
    spec = parse_spec(MINIMAL + f"[checkpoint]\nwatch = {watch!r}\n")
    assert spec.checkpoint.watch == watch


def test_all_problems_reported_in_one_pass() -> None:
    text = MINIMAL + "[limits]\nwal_time = '2h'\nmax_restarts = -1\n[checkpoint]\nkeep_last = 1\n"
    found = problems(text)
    assert len(found) == 3, found
    with pytest.raises(SpecError, match="3 problems"):
        parse_spec(text, source="spec.toml")


def test_toml_syntax_error_has_line_and_column() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec('name = "x"\ncommand = ["a", \nfoo = = 1\n', source="bad.toml")
    message = str(info.value)
    assert message.startswith("bad.toml: TOML syntax error at line 3, column")


def test_missing_file_suggests_init(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found; create one with `acceptrun init`"):
        load_spec(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90s", 90.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        ("250ms", 0.25),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


def test_format_duration() -> None:
    assert format_duration(None) == "-"
    assert format_duration(4.25) == "4.2s"
    assert format_duration(185) == "3m05s"
    assert format_duration(3720) == "1h02m"


def test_conditions() -> None:
    assert parse_condition(">= 0.9") == Condition(">=", 0.9)
    assert parse_condition("<1e-3").check(5e-4)
    assert not parse_condition("> 2").check(2)
    with pytest.raises(ValueError, match="threshold"):
        parse_condition("about 3")


@pytest.mark.parametrize(
    ("pattern", "found", "kind", "ok"),
    [
        (">=2.1", "2.13.0+cpu", "version", True),
        ("2.13.*", "2.13.0", "version", True),
        ("2.13", "2.13.0+cu121", "version", True),
        ("2.1", "2.13.0", "version", False),
        ("12", "12.4", "version", True),
        ("<3.0", "3.11.7", "version", False),
        (">=550", "550.54.15", "version", True),
        ("H100", "NVIDIA H100 80GB HBM3", "name", True),
        ("*a100*80gb*", "NVIDIA A100-SXM4-80GB", "name", True),
        ("H200", "NVIDIA H100 80GB HBM3", "name", False),
        (">=2.1", None, "version", False),
    ],
)
def test_match_pattern(pattern: str, found: str | None, kind: str, ok: bool) -> None:
    assert match_pattern(pattern, found, kind=kind) is ok


def test_frozen_spec_reloads_identically(tmp_path: Path) -> None:
    (tmp_path / "spec.toml").write_text(
        MINIMAL + '[data]\npath = "data"\n[limits]\nwall_time = "2h"\n'
    )
    spec = load_spec(tmp_path / "spec.toml")
    frozen = tmp_path / "frozen" / "spec.toml"
    frozen.parent.mkdir()
    frozen.write_text(spec.to_toml())
    again = load_spec(frozen)
    assert again.to_dict() == {
        **spec.to_dict(),
        "workdir": str(tmp_path.resolve()),
        "data": {"path": str((tmp_path / "data").resolve())},
    }
    assert again.limits.wall_time == 7200.0
    assert (
        spec.hash
        == parse_spec(MINIMAL + '[data]\npath = "data"\n[limits]\nwall_time = 7200\n').hash
    )


def test_schema_describes_every_section() -> None:
    schema = json_schema()
    json.dumps(schema)
    props = schema["properties"]
    assert schema["required"] == ["name", "command"]
    for section in (
        "resources",
        "expect",
        "data",
        "checkpoint",
        "limits",
        "cost",
        "acceptance",
        "cleanup",
    ):
        assert props[section]["type"] == "object"
        assert props[section]["additionalProperties"] is False
        assert props[section]["description"]
    assert props["limits"]["properties"]["max_restarts"]["default"] == 3


def test_starter_spec_validates() -> None:
    spec = parse_spec(starter_spec(name="bert", command="python run_squad.py"))
    assert spec.name == "bert"
    assert spec.command[-1] == "python run_squad.py"


@pytest.mark.parametrize(
    ("watch", "resume_args"),
    [
        ("out/ckpt.pt", ()),
        ("out/ckpt.pt", ("--init_from=resume",)),
        ("output/checkpoint-*", ("--resume_from_checkpoint", "{checkpoint}")),
        ("runs/{name}/model.pt", ()),  # braces in a path are not the template's
    ],
)
def test_a_starter_for_a_script_that_saves_its_own_checkpoints(
    watch: str, resume_args: tuple[str, ...]
) -> None:
    text = starter_spec(name="own", watch=watch, resume_args=resume_args)
    spec = parse_spec(text)
    assert spec.checkpoint.watch == [watch]
    assert spec.checkpoint.resume_args == list(resume_args)
    assert spec.progress.pattern is None and "[progress]" in text
    # What is left to fill in is written commented; filled in as shown, it is valid too.
    filled = re.sub(r"(?m)^# (resume_args|pattern) = ", r"\1 = ", text)
    assert ("# resume_args" in text) == (not resume_args)
    spec = parse_spec(filled)
    assert spec.checkpoint.resume_args and spec.progress.pattern is not None
    if not resume_args:  # the example to fill in resumes from the restored path
        assert "{checkpoint}" in spec.checkpoint.resume_args


def test_the_default_starter_has_no_watch_and_no_progress() -> None:
    text = starter_spec(name="bert")
    assert "watch" not in text and "[progress]" not in text
    assert "{own_checkpoints}" not in text and "{progress}" not in text


@pytest.mark.parametrize("file", ["acceptrun.toml", "specs/bert.toml", "my spec.toml"])
def test_the_starter_spec_names_the_file_it_is_written_to(file: str) -> None:
    text = starter_spec(name="bert", file=file)
    header = "\n".join(text.splitlines()[:2])
    quoted = shlex.quote(file)
    assert f"acceptrun spec check {quoted}" in header and f"acceptrun run {quoted}" in header
    assert "check spec.toml`" not in header  # not a file name it was not written to
    parse_spec(text)


def test_spec_reference_doc_is_in_sync() -> None:
    from acceptrun.spec.schema import reference_markdown

    doc = Path(__file__).parents[2] / "docs" / "spec.md"
    assert doc.read_text() == reference_markdown(), "regenerate: acceptrun spec docs > docs/spec.md"
