"""`acceptrun export skypilot`: task YAML checked by SkyPilot's own parser."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from acceptrun.backends.skypilot import MIRROR_MOUNT, task_yaml
from acceptrun.cli.main import main
from acceptrun.errors import UserError
from acceptrun.spec.model import SKYPILOT_TEARDOWNS, load_spec

LAMBDA_H100 = """
name = "bert-h100"
command = ["python", "train.py"]
[resources]
gpus = 1
gpu_types = ["H100"]
cpus = 8
memory_gb = 64
[data]
path = "s3://acme-data/squad-v2"
[checkpoint]
every_steps = 500
mirror = "s3://acme-ckpt/bert"
[expect]
packages = { torch = "2.3.*", transformers = ">=4.40" }
[skypilot]
cloud = "lambda"
region = "us-east-1"
disk_size = 256
"""


@pytest.fixture(scope="module")
def sky() -> Any:
    """SkyPilot, imported once for the module (a few seconds)."""
    return pytest.importorskip("sky")


def write_spec(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('training')\n")
    path = root / "spec.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_lambda_h100_task_parses_with_skypilot(tmp_path: Path, sky: Any) -> None:
    spec_path = write_spec(tmp_path / "job", LAMBDA_H100)
    out = tmp_path / "task.yaml"
    assert main(["export", "skypilot", str(spec_path), "-o", str(out), "--run-id", "r-1"]) == 0
    task = sky.Task.from_yaml(str(out))
    assert task.name == "bert-h100"
    assert task.num_nodes == 1
    (res,) = list(task.resources)
    assert res.accelerators == {"H100": 1}
    assert str(res.cloud) == "Lambda"
    assert res.region == "us-east-1"
    assert res.disk_size == 256
    assert res.cpus == "8+" and res.memory == "64+"
    assert res.use_spot is False
    assert task.workdir == str(spec_path.parent)
    # The data bucket and the checkpoint mirror are mounted; the mirror holds the workspace.
    mounts = task.storage_mounts
    assert mounts["/data"].source == "s3://acme-data/squad-v2"
    assert mounts[MIRROR_MOUNT].source == "s3://acme-ckpt/bert"
    assert mounts[MIRROR_MOUNT].mode.value == "MOUNT_CACHED"
    # setup installs acceptrun (this checkout, with s3 support) and the pinned packages.
    assert task.setup is not None and task.run is not None
    assert "pip install '/opt/acceptrun-src[s3]'" in task.setup
    assert "'torch==2.3.*' 'transformers>=4.40'" in task.setup
    assert task.file_mounts is not None
    assert Path(task.file_mounts["/opt/acceptrun-src"], "pyproject.toml").exists()
    # run: the supervisor on the spec; a restarted section resumes from the mirror.
    assert 'run spec.toml --run-id "$RUN_ID"' in task.run
    assert 'resume "$RUN_ID" --force --from-scratch --from-mirror' in task.run
    assert f"WS={MIRROR_MOUNT}/.acceptrun" in task.run


def test_local_data_and_no_mirror_are_said_and_still_parse(tmp_path: Path, sky: Any) -> None:
    data = tmp_path / "shards"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x")
    spec_path = write_spec(
        tmp_path / "job",
        f"""
        name = "cpu job"
        command = ["python", "train.py"]
        [data]
        path = "{data}"
        [skypilot]
        accelerators = "A100:8"
        """,
    )
    text = task_yaml(load_spec(spec_path), run_id="r-2")
    assert (
        "# note: no bucket in checkpoint.mirror: after a preemption the run starts from step 0"
        in text
    )
    assert f"# note: data {data} is uploaded from this machine at every launch" in text
    out = tmp_path / "task.yaml"
    out.write_text(text)
    task = sky.Task.from_yaml(str(out))
    assert task.name == "cpu-job"
    assert next(iter(task.resources)).accelerators == {"A100": 8}
    assert task.file_mounts is not None and task.file_mounts[str(data)] == str(data)
    assert task.run is not None and "WS=~/.acceptrun" in task.run
    assert "--from-mirror" not in task.run


def test_spot_on_lambda_and_gpus_without_a_model_are_refused(tmp_path: Path) -> None:
    spot = write_spec(tmp_path / "a", LAMBDA_H100 + "use_spot = true\n")
    with pytest.raises(UserError, match="Lambda Cloud has no spot instances"):
        task_yaml(load_spec(spot))
    bare = write_spec(
        tmp_path / "b", 'name = "x"\ncommand = ["python", "train.py"]\n[resources]\ngpus = 2\n'
    )
    with pytest.raises(UserError, match=r'skypilot.accelerators = "H100:1"'):
        task_yaml(load_spec(bare))


def test_export_cli_prints_yaml_and_refuses_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = write_spec(tmp_path / "job", LAMBDA_H100)
    assert main(["export", "skypilot", str(spec_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# SkyPilot task for acceptrun spec 'bert-h100'")
    assert 'accelerators: "H100:1"' in out
    spot = write_spec(tmp_path / "spot", LAMBDA_H100 + "use_spot = true\n")
    assert main(["export", "skypilot", str(spot)]) == 2
    assert "UserError: skypilot.use_spot = true" in capsys.readouterr().err


def test_a_named_release_is_installed_from_the_index_and_nothing_is_uploaded(
    tmp_path: Path, sky: Any
) -> None:
    spec_path = write_spec(tmp_path / "job", LAMBDA_H100)
    out = tmp_path / "task.yaml"
    argv = ["export", "skypilot", str(spec_path), "-o", str(out), "--acceptrun-version", "0.1.0"]
    assert main(argv) == 0
    task = sky.Task.from_yaml(str(out))
    assert task.setup is not None and "pip install 'acceptrun[s3]==0.1.0'" in task.setup
    assert "/opt/acceptrun-src" not in (task.file_mounts or {})
    for bad in ("0.1.0; rm -rf ~", "latest", ""):
        with pytest.raises(UserError, match="is not a release number"):
            task_yaml(load_spec(spec_path), acceptrun_version=bad)


@pytest.mark.parametrize("mode", SKYPILOT_TEARDOWNS)
def test_the_cluster_ends_with_the_run_as_skypilots_parser_reads_it(
    tmp_path: Path, sky: Any, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_path = write_spec(
        tmp_path / "job",
        LAMBDA_H100 + f'teardown = "{mode}"\nidle_minutes = 7\n',
    )
    out = tmp_path / "task.yaml"
    assert main(["export", "skypilot", str(spec_path), "-o", str(out), "--run-id", "r-1"]) == 0
    said = capsys.readouterr().out
    (res,) = list(sky.Task.from_yaml(str(out)).resources)
    text = out.read_text()
    if mode == "keep":
        assert res.autostop_config is None or not res.autostop_config.enabled
        assert "NO autostop" in text and "bills until `sky down`" in text
        assert "bills until you run `sky down`" in said
        return
    auto = res.autostop_config
    assert auto is not None and auto.enabled and auto.down is True and auto.idle_minutes == 7
    if mode == "managed":
        assert "`sky jobs launch`" in text and "ends with the job" in said
    else:
        assert "No idle machine after the run" in text
        assert "torn down 7 min after the run ends" in said


def test_the_default_tears_the_cluster_down(tmp_path: Path, sky: Any) -> None:
    spec = load_spec(write_spec(tmp_path / "job", LAMBDA_H100))
    assert (spec.skypilot.teardown, spec.skypilot.idle_minutes) == ("down", 5)
    out = tmp_path / "task.yaml"
    out.write_text(task_yaml(spec, run_id="r-1"))
    (res,) = list(sky.Task.from_yaml(str(out)).resources)
    assert res.autostop_config.down is True and res.autostop_config.idle_minutes == 5


def test_an_unknown_teardown_names_the_field_and_the_choices(tmp_path: Path) -> None:
    from acceptrun.errors import SpecError

    with pytest.raises(SpecError, match=r"skypilot\.teardown: 'never'.*down, managed, keep"):
        load_spec(write_spec(tmp_path / "job", LAMBDA_H100 + 'teardown = "never"\n'))
