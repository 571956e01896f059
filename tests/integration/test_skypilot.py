"""`acceptrun export skypilot`: task YAML checked by SkyPilot's own parser; `export mlflow`."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from acceptrun.cli.main import main


def write_spec(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('training')\n")
    path = root / "spec.toml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.slow
def test_export_mlflow_prints_the_mlflow_run_and_its_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mlflow")
    ws = tmp_path / "ws"
    spec_path = write_spec(
        tmp_path / "job", f'name = "tiny"\ncommand = ["{sys.executable}", "-c", "pass"]\n'
    )
    assert main(["--workspace", str(ws), "run", "-q", str(spec_path)]) == 0
    capsys.readouterr()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = main(
        ["--workspace", str(ws), "export", "mlflow", "latest", "--tracking-uri", uri,
         "--experiment", "exp-1"]
    )  # fmt: skip
    assert code == 0
    line = capsys.readouterr().out.strip()
    assert "to MLflow run " in line and f"experiment 'exp-1', at {uri}" in line
    mlflow_id = line.split("to MLflow run ")[1].split(",")[0]
    from mlflow.tracking import MlflowClient

    got = MlflowClient(tracking_uri=uri).get_run(mlflow_id)
    assert got.data.tags["acceptrun.run_id"] == line.split()[2]
