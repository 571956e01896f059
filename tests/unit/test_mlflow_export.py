"""export_run into a real local MLflow store, read back with MLflow's own client."""

from __future__ import annotations

from pathlib import Path

import pytest

from acceptrun._util.durable import append_jsonl
from acceptrun.backends.mlflow import default_tracking_uri, export_run
from acceptrun.errors import UserError
from acceptrun.record.workspace import Workspace

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One SQLite store for the module: creating its tables takes MLflow ~5 s here."""
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}", root


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


def test_the_default_store_is_a_database_in_the_workspace(tmp_path: Path) -> None:
    run_dir = tmp_path / ".acceptrun" / "runs" / "20261130-000000-x-0000"
    assert default_tracking_uri(run_dir) == f"sqlite:///{tmp_path / '.acceptrun' / 'mlflow.db'}"


def test_a_file_store_uri_is_refused_with_the_fix(tmp_path: Path) -> None:
    record = Workspace.create(tmp_path / ".acceptrun").create_run(
        "f", spec_text='name = "f"\ncommand = ["true"]\n', state={"status": "finished"}
    )
    with pytest.raises(UserError, match="sqlite:///"):
        export_run(record.path, tracking_uri=(tmp_path / "mlruns").as_uri())
