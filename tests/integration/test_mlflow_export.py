"""export_run and `acceptrun export mlflow` into a real local MLflow store, read back with
MLflow's own client."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from acceptrun._util.durable import append_jsonl
from acceptrun.backends.mlflow import export_run
from acceptrun.cli.main import main
from acceptrun.errors import UserError
from acceptrun.record.workspace import Workspace
from acceptrun.run.launch import launch
from conftest import Project

# find_spec, not importorskip: collecting this file must not import mlflow (seconds).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="the mlflow extra is not installed"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One SQLite store for the module: creating its tables takes MLflow ~5 s here."""
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}", root


@pytest.mark.slow
def test_a_real_run_exports_params_metrics_tags_and_artifacts(
    project: Project, store: tuple[str, Path]
) -> None:
    from mlflow.tracking import MlflowClient

    spec = project.spec(
        """
        import time, acceptrun
        run = acceptrun.init()
        for step in run.steps(12):
            with run.data_wait():
                time.sleep(0.01)
            run.log(step, loss=1.0 / (step + 1), samples=8)
        run.metric("eval/accuracy", 0.93)
        """,
        name="mlf",
        extra='[acceptance]\nmetrics = { "eval/accuracy" = ">= 0.9" }\nmax_data_wait = 1.0\n',
    )
    result = launch(spec, workspace=project.workspace, echo=False)
    assert result.verdict.accepted
    uri, root = store
    run_id = export_run(result.record.path, tracking_uri=uri, experiment="exp-a")

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "exp-a"
    assert run.info.status == "FINISHED" and run.info.run_name == result.record.run_id
    tags = run.data.tags
    assert tags["acceptrun.run_id"] == result.record.run_id
    assert tags["acceptrun.verdict"] == "accepted" and tags["acceptrun.status"] == "finished"
    assert "data wait is" in tags["acceptrun.hints"]
    params = run.data.params
    assert params["name"] == "mlf" and params["limits.max_restarts"] == "3"
    assert params["provenance.torch"].startswith("2.") and params["provenance.gpu"] == "none"
    history = client.get_metric_history(run_id, "loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(12))
    assert sorted(history, key=lambda m: m.step)[3].value == pytest.approx(0.25)
    assert len(client.get_metric_history(run_id, "data_wait")) == 12
    assert run.data.metrics["eval/accuracy"] == pytest.approx(0.93)
    assert run.data.metrics["summary/throughput_samples_per_s"] > 0
    assert run.data.metrics["summary/data_wait_share"] > 0.2
    assert "summary/breakdown_compute_s" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {"spec.toml", "verdict.json", "provenance.json", "run.json"}
    # Artifacts live beside the database, not in the current directory.
    assert (root / "mlartifacts").is_dir()


def test_every_step_value_is_exported_in_batches(tmp_path: Path, store: tuple[str, Path]) -> None:
    # 400 steps of 3 metrics: one of MLflow's 1,000-value batches and a partial last
    # one. How long the export takes is a figure, not a test (a loaded machine is slow).
    from mlflow.tracking import MlflowClient

    record = Workspace.create(tmp_path / ".acceptrun").create_run(
        "big", spec_text='name = "big"\ncommand = ["true"]\n', state={"status": "running"}
    )
    append_jsonl(record.events_path, {"t": 1000.0, "kind": "run_start"})
    with open(record.events_path, "a") as f:
        for i in range(400):
            f.write(
                f'{{"t":{1001 + i * 0.1},"kind":"step","attempt":1,"step":{i},'
                f'"step_time":0.1,"loss":{1 / (i + 1)},"samples":32}}\n'
            )
    run_id = export_run(record.path, tracking_uri=store[0])
    client = MlflowClient(tracking_uri=store[0])
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "big"
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(400))
    assert {m.step: m.value for m in history}[399] == pytest.approx(1 / 400)
    assert client.get_run(run_id).info.status == "RUNNING"  # still live: not terminated


def test_a_file_store_uri_is_refused_with_the_fix(tmp_path: Path) -> None:
    record = Workspace.create(tmp_path / ".acceptrun").create_run(
        "f", spec_text='name = "f"\ncommand = ["true"]\n', state={"status": "finished"}
    )
    with pytest.raises(UserError, match="sqlite:///"):
        export_run(record.path, tracking_uri=(tmp_path / "mlruns").as_uri())


@pytest.mark.slow
def test_export_mlflow_prints_the_mlflow_run_and_its_store(
    project: Project, store: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    ws = str(project.workspace)
    spec = project.spec(name="tiny", command=[sys.executable, "-c", "pass"])
    assert main(["--workspace", ws, "run", "-q", str(spec)]) == 0
    capsys.readouterr()
    uri = store[0]
    code = main(
        ["--workspace", ws, "export", "mlflow", "latest", "--tracking-uri", uri,
         "--experiment", "exp-1"]
    )  # fmt: skip
    assert code == 0
    line = capsys.readouterr().out.strip()
    assert "to MLflow run " in line and f"experiment 'exp-1', at {uri}" in line
    mlflow_id = line.split("to MLflow run ")[1].split(",")[0]
    got = MlflowClient(tracking_uri=uri).get_run(mlflow_id)
    assert got.data.tags["acceptrun.run_id"] == line.split()[2]
