"""Where an MLflow export goes by default (the exports themselves, into a real local
MLflow store: tests/integration/test_mlflow_export.py)."""

from __future__ import annotations

from pathlib import Path

from acceptrun.backends.mlflow import default_tracking_uri


def test_the_default_store_is_a_database_in_the_workspace(tmp_path: Path) -> None:
    run_dir = tmp_path / ".acceptrun" / "runs" / "20261130-000000-x-0000"
    assert default_tracking_uri(run_dir) == f"sqlite:///{tmp_path / '.acceptrun' / 'mlflow.db'}"
