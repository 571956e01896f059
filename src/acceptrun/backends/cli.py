"""``acceptrun export skypilot | mlflow``: a spec as a SkyPilot task, a run into MLflow.

Imports stay lazy: ``acceptrun --help`` loads none of the backends.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def cmd_export_skypilot(args: argparse.Namespace) -> int:
    from acceptrun._util.durable import write_atomic
    from acceptrun.backends.skypilot import task_yaml
    from acceptrun.capture.preflight import check_static
    from acceptrun.spec.model import load_spec

    spec = load_spec(args.spec)
    check_static(spec)
    text = task_yaml(spec, run_id=args.run_id)
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return 0
    write_atomic(Path(args.output), text)
    print(
        f"wrote {args.output}; launch it with `sky launch -c {spec.name} {args.output}`, "
        f"or as a managed job (recovered after preemption) with `sky jobs launch {args.output}`"
    )
    return 0


def cmd_export_mlflow(args: argparse.Namespace) -> int:
    from acceptrun.backends.mlflow import default_tracking_uri, export_run
    from acceptrun.record.workspace import find_workspace

    record = find_workspace(args.workspace).get_run(args.run)
    mlflow_id = export_run(record.path, args.tracking_uri, args.experiment)
    where = args.tracking_uri or default_tracking_uri(record.path)
    experiment = args.experiment or str(record.state.get("name") or "acceptrun")
    print(
        f"exported run {record.run_id} to MLflow run {mlflow_id}, experiment {experiment!r}, at {where}"
    )
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    export = sub.add_parser(
        "export", help="export a spec as a SkyPilot task, or a run's record into MLflow"
    )
    export_sub = export.add_subparsers(dest="export_command", required=True, metavar="TARGET")
    sky = export_sub.add_parser(
        "skypilot", help="write a SkyPilot task YAML that runs the spec under acceptrun"
    )
    sky.add_argument("spec", help="the run spec (TOML)")
    sky.add_argument("-o", "--output", metavar="FILE", help="write the YAML here (default: stdout)")
    sky.add_argument(
        "--run-id", help="the run id the task creates and resumes (default: a new one)"
    )
    sky.set_defaults(func=cmd_export_skypilot)
    mlflow = export_sub.add_parser(
        "mlflow", help="copy a run's parameters, metrics, verdict and files into MLflow"
    )
    mlflow.add_argument("run", help="run id, unique prefix, or latest")
    mlflow.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow tracking URI (default: sqlite:///<workspace>/mlflow.db)",
    )
    mlflow.add_argument(
        "--experiment", metavar="NAME", help="MLflow experiment (default: the run's name)"
    )
    mlflow.set_defaults(func=cmd_export_mlflow)
