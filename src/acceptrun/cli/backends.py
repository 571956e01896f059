"""``acceptrun export skypilot | kubernetes | wheel | mlflow``: a spec as a SkyPilot task
or Kubernetes manifests, this acceptrun as a wheel, a run into MLflow.

Imports stay lazy: ``acceptrun --help`` loads none of the backends.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from acceptrun._util.argtypes import dir_arg, file_arg, path_arg, port, text
from acceptrun.cli.record import add_run_argument

__all__ = ["register"]


# The header line of each export: a file that has it is that export's earlier output, which
# exporting again replaces without --force (acceptrun._util.outputs).
SKYPILOT_MARK = "# Written by `acceptrun export skypilot`"
KUBERNETES_MARK = "# Written by `acceptrun export kubernetes`"
SECRET_MARK = "# The Secret of acceptrun run"


def cmd_export_skypilot(args: argparse.Namespace) -> int:
    from acceptrun._util.outputs import claim_output, write_output
    from acceptrun.backends.skypilot import task_yaml
    from acceptrun.capture.preflight import check_static
    from acceptrun.spec.model import load_spec

    claim = {
        "mark": SKYPILOT_MARK, "force": args.force, "inputs": [Path(args.spec)],
        "what": "SkyPilot task",
    }  # fmt: skip
    if args.output not in (None, "-"):
        claim_output(Path(args.output), **claim)  # before the spec is checked and exported
    spec = load_spec(args.spec)
    check_static(spec)
    text = task_yaml(spec, run_id=args.run_id, acceptrun_version=args.acceptrun_version)
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return 0
    write_output(Path(args.output), text, **claim)
    sky = spec.skypilot
    ends = {
        "down": f"the cluster is torn down {sky.idle_minutes} min after the run ends",
        "managed": "launch it with `sky jobs launch`: the cluster ends with the job",
        "keep": "skypilot.teardown = keep: the cluster bills until you run `sky down`",
    }[sky.teardown]
    print(
        f"wrote {args.output}; launch it with `sky launch -c {spec.name} {args.output}`, "
        f"or as a managed job (recovered after preemption) with `sky jobs launch {args.output}`; "
        f"{ends}"
    )
    return 0


def cmd_export_kubernetes(args: argparse.Namespace) -> int:
    import dataclasses

    from acceptrun._util.outputs import claim_output, write_output
    from acceptrun.backends.kubernetes import KubernetesOptions, export_manifests
    from acceptrun.capture.preflight import check_static
    from acceptrun.errors import UserError
    from acceptrun.spec.model import load_spec

    selector: dict[str, str] = {}
    for item in args.node_selector or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UserError(
                f"--node-selector {item!r}: write KEY=VALUE, e.g. nvidia.com/gpu.present=true"
            )
        selector[key] = value
    output = None if args.output in (None, "-") else Path(args.output)
    inputs = [Path(args.spec)]
    if output is not None:  # before the spec is checked and exported: a refusal costs nothing
        claim_output(output, mark=KUBERNETES_MARK, force=args.force, inputs=inputs, what="manifest")
    spec = load_spec(args.spec)
    # This machine holds the spec's directory as the image will: the command, workdir and
    # data must be there. Several nodes' launch is checked by the export, with the pods'
    # environment (here it would ask for a Slurm allocation).
    one_node = dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, nodes=1))
    check_static(one_node)
    options = KubernetesOptions(
        image=args.image, namespace=args.namespace, name=args.name, run_id=args.run_id,
        workdir=args.workdir, data_pvc=args.data_pvc, checkpoint_pvc=args.checkpoint_pvc,
        node_selector=selector, port=args.port,
    )  # fmt: skip
    out = export_manifests(spec, options)
    for warning in out.warnings:  # also in the YAML, as comments
        print(f"warning: {warning}", file=sys.stderr)
    ns = f" -n {args.namespace}" if args.namespace else ""
    secret_text = out.secret_yaml()
    if output is None:
        sys.stdout.write(out.yaml())
        if secret_text is not None:  # its values never go to the terminal
            literals = " ".join(f'--from-literal={k}="${k}"' for k in out.secret_names)
            print(
                f"note: the Secret {out.job_name}-env (the [env] values "
                f"{', '.join(out.secret_names)}) is not printed: pass --output FILE to have it "
                f"written to FILE's .secret.yaml (mode 0600), or create it from your own "
                f"values: kubectl create secret generic{ns} {out.job_name}-env {literals}",
                file=sys.stderr,
            )
        return 0
    secret_path = output.with_name(f"{output.stem}.secret.yaml")
    if secret_text is not None:  # both files are claimed before either is written
        claim_output(
            secret_path, mark=SECRET_MARK, force=args.force, inputs=[*inputs, output],
            what="Secret manifest",
        )  # fmt: skip
    write_output(output, out.yaml(), mark=KUBERNETES_MARK, force=args.force, inputs=inputs,
                 what="manifest")  # fmt: skip
    apply = f"-f {output}"
    if secret_text is not None:
        # The one file of an export that carries secrets: its owner's alone, unredacted;
        # 0600 whatever the file it replaces had.
        write_output(
            secret_path, secret_text, mark=SECRET_MARK, force=args.force,
            inputs=[*inputs, output], what="Secret manifest", mode=0o600, raw=True,
        )  # fmt: skip
        apply = f"-f {secret_path} {apply}"
        print(f"wrote {secret_path} (mode 0600): the Secret with the [env] secrets")
    print(
        f"wrote {args.output} (Job {out.job_name}, run {out.run_id}); launch it with "
        f"`kubectl apply{ns} {apply}`, follow it with `kubectl logs{ns} -f "
        f"job/{out.job_name}`"
    )
    return 0


def cmd_export_wheel(args: argparse.Namespace) -> int:
    from acceptrun.backends.ship import build_wheel

    wheel = build_wheel(Path(args.output))
    print(f"wrote {wheel}: this acceptrun, for an image or a machine that has none")
    print("  in a Dockerfile:")
    print(f"    COPY {wheel.name} /tmp/")
    print(f"    RUN python -m pip install /tmp/{wheel.name}")
    return 0


def cmd_export_mlflow(args: argparse.Namespace) -> int:
    from acceptrun.backends.mlflow import default_tracking_uri, export_run
    from acceptrun.cli.record import open_run

    record = open_run(args, args.run)
    mlflow_id = export_run(record.path, args.tracking_uri, args.experiment)
    where = args.tracking_uri or default_tracking_uri(record.path)
    experiment = args.experiment or str(record.state.get("name") or "acceptrun")
    print(
        f"exported run {record.run_id} to MLflow run {mlflow_id}, experiment {experiment!r}, at {where}"
    )
    return 0


_FORCE_HELP = "replace FILE even when it is not an earlier export (the spec never)"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    export = sub.add_parser(
        "export",
        help="a spec to SkyPilot or Kubernetes; a run's record to MLflow",
    )
    export_sub = export.add_subparsers(dest="export_command", required=True, metavar="TARGET")
    sky = export_sub.add_parser(
        "skypilot", help="write a SkyPilot task YAML that runs the spec under acceptrun"
    )
    sky.add_argument("spec", type=file_arg, help="the run spec (TOML)")
    sky.add_argument(
        "-o",
        "--output",
        type=file_arg,
        metavar="FILE",
        help="write the YAML here (default: stdout); an existing FILE is replaced only when "
        "it is an earlier export, or with --force (never the spec)",
    )
    sky.add_argument("--force", action="store_true", help=_FORCE_HELP)
    sky.add_argument(
        "--run-id", type=text(), help="the run id the task creates and resumes (default: a new one)"
    )
    sky.add_argument(
        "--acceptrun-version",
        type=text(most=100),
        metavar="VERSION",
        help="install this release of acceptrun from the package index on the machine "
        "(default: upload this acceptrun, its checkout or its wheel)",
    )
    sky.set_defaults(func=cmd_export_skypilot)
    kube = export_sub.add_parser(
        "kubernetes",
        help="write Kubernetes manifests (Indexed Job, headless Service) that run the spec "
        "under acceptrun",
    )
    kube.add_argument("spec", type=file_arg, help="the run spec (TOML)")
    kube.add_argument(
        "-o",
        "--output",
        type=file_arg,
        metavar="FILE",
        help="write the YAML here (default: stdout), and the Secret to FILE's .secret.yaml; "
        "an existing file is replaced only when it is an earlier export, or with --force "
        "(never the spec)",
    )
    kube.add_argument("--force", action="store_true", help=_FORCE_HELP)
    kube.add_argument(
        "--image",
        type=text(),
        help="container image with acceptrun, the workload's packages and the spec's directory "
        "(required)",
    )
    kube.add_argument(
        "--namespace", type=text(most=253), metavar="NS", help="namespace (default: kubectl's)"
    )
    kube.add_argument(
        "--name",
        type=text(most=253),
        help="Job and Service name (default: the spec's name and 4 characters of the run id)",
    )
    kube.add_argument(
        "--run-id", type=text(), help="the run id the Job creates and resumes (default: a new one)"
    )
    kube.add_argument(
        "--workdir",
        type=path_arg,
        default="/workspace",
        help="where the image holds the spec's directory (default: /workspace)",
    )
    kube.add_argument(
        "--data-pvc",
        type=text(most=253),
        metavar="CLAIM",
        help="PersistentVolumeClaim mounted read-only at data.path",
    )
    kube.add_argument(
        "--checkpoint-pvc",
        type=text(most=253),
        metavar="CLAIM",
        help="PersistentVolumeClaim for run records and checkpoints (ReadWriteMany for several "
        "nodes; default: an emptyDir that dies with the pod)",
    )
    kube.add_argument(
        "--node-selector",
        action="append",
        type=text(),
        metavar="KEY=VALUE",
        help="a node label the pods need, e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3; "
        "repeatable",
    )
    kube.add_argument(
        "--port", type=port, default=29500, help="rendezvous port on pod 0 (default: 29500)"
    )
    kube.set_defaults(func=cmd_export_kubernetes)
    wheel = export_sub.add_parser(
        "wheel",
        help="write this acceptrun as a wheel, to install it in an image (Kubernetes) or on "
        "a machine that has none",
    )
    wheel.add_argument(
        "-o",
        "--output",
        type=dir_arg,
        metavar="DIR",
        default=".",
        help="the folder to write it in (default: .)",
    )
    wheel.set_defaults(func=cmd_export_wheel)
    mlflow = export_sub.add_parser(
        "mlflow", help="copy a run's parameters, metrics, verdict and files into MLflow"
    )
    add_run_argument(mlflow)
    mlflow.add_argument(
        "--tracking-uri",
        type=text(most=4096),
        metavar="URI",
        help="MLflow tracking URI (default: sqlite:///<workspace>/mlflow.db)",
    )
    mlflow.add_argument(
        "--experiment",
        type=text(),
        metavar="NAME",
        help="MLflow experiment (default: the run's name)",
    )
    mlflow.set_defaults(func=cmd_export_mlflow)
