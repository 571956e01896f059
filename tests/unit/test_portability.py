"""Portability findings: what ties a spec to one provider or machine, and how to move it."""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun.verdict.portability import check_spec_file, format_portability
from acceptrun.verdict.portability_rules import NOTE, WARNING
from builders import LAMBDA_SPEC


def _by_where(findings: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for f in findings:
        out.setdefault(f["where"], []).append(f)
    return out


def test_a_lambda_spec_is_tied_to_lambda_and_each_finding_says_how_to_move(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(LAMBDA_SPEC)
    report = check_spec_file(spec)
    found = _by_where([f.to_dict() for f in report.findings])
    assert not report.blockers  # tied to Lambda, but every step to move it is known

    mounts = [f for f in report.findings if f.kind == "mount"]
    assert {f.where for f in mounts} == {"command", "env.HF_HOME", "data.path", "checkpoint.dir"}
    lam = next(f for f in mounts if f.where == "data.path")
    assert lam.severity == WARNING
    assert lam.why == "/lambda/nfs is Lambda Cloud's persistent filesystem, attached in one region"
    assert lam.fix.startswith("copy what is under /lambda/nfs to object storage")
    home = found["checkpoint.dir"][0]
    assert home["why"] == "/home/ubuntu is the default user's home on Lambda and AWS Ubuntu images"

    tools = {f.value: f for f in report.findings if f.kind == "tool"}
    assert set(tools) == {"nvidia-smi", "aws"}  # python and cd are not provider tools
    assert "fails on CPU-only and AMD machines" in tools["nvidia-smi"].why

    data = {f["why"] for f in found["data.path"]}
    assert "local data with no copy elsewhere: another machine cannot fetch it" in data
    assert found["data.manifest"][0]["fix"].startswith("`acceptrun data snapshot /lambda/nfs/data")
    assert found["checkpoint.mirror"][0]["severity"] == WARNING  # checkpoints stay on the box

    bucket = next(f for f in report.findings if f.kind == "bucket")
    assert bucket.severity == NOTE and "named for region us-east-1" in bucket.why
    assert found["env.AWS_REGION"][0]["kind"] == "region"
    assert "env.RUN_NOTE" not in found
    assert found["resources.gpu_types"][0]["severity"] == NOTE
    cuda = found["expect.cuda"][0]
    assert cuda["severity"] == WARNING and cuda["fix"] == 'accept a range, e.g. ">=12.4"'
    assert "expect.driver" not in found  # a range travels
    images = found["skypilot.image_id"]
    assert {f["severity"] for f in images} == {WARNING, NOTE}
    assert any("provider's registry" in f["why"] for f in images)

    text = format_portability(report)
    assert text.splitlines()[0].startswith(f"{spec}: ")
    assert "move it: " in text


def test_a_relative_spec_travels(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "ok"\ncommand = ["python", "train.py", "--out", "out"]\n'
        '[data]\npath = "data"\nmanifest = "data.manifest.json"\n'
        '[checkpoint]\nevery_steps = 10\nmirror = "s3://bucket/ok"\n'
    )
    report = check_spec_file(spec)
    assert [(f.severity, f.kind, f.where) for f in report.findings] == [
        (NOTE, "bucket", "checkpoint.mirror")
    ]


@pytest.mark.parametrize(
    ("command", "tools"),
    [
        pytest.param('"srun python train.py"', {"srun"}, id="slurm"),
        pytest.param('"OMP_NUM_THREADS=4 gcloud storage cp x y"', {"gcloud"}, id="env-prefix"),
        pytest.param('"sudo nvidia-smi -pm 1; python train.py"', {"nvidia-smi"}, id="sudo"),
        pytest.param('["python", "aws.py"]', set(), id="script-named-like-a-tool"),
    ],
)
def test_provider_tools_are_found_in_program_position(
    tmp_path: Path, command: str, tools: set[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(f'name = "t"\ncommand = {command}\n')
    report = check_spec_file(spec)
    assert {f.value for f in report.findings if f.kind == "tool"} == tools
