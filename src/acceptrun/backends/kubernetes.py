"""The Kubernetes export: a run spec as manifests for plain Kubernetes.

::

    out = export_manifests(load_spec("spec.toml"), KubernetesOptions(image="ghcr.io/me/train:1"))
    out.yaml()          # or: acceptrun export kubernetes spec.toml --image ghcr.io/me/train:1
    kubectl apply -f job.yaml

The layout is the one the field uses for multi-node torchrun on plain Kubernetes (the
JobSet and Kubeflow PyTorchJob layouts reduce to it): one Indexed Job of ``resources.nodes``
pods (``completions = parallelism = nodes``), a headless Service whose name is the pods'
``subdomain`` so that pod ``<job>-0`` is reachable as ``<job>-0.<job>``, and torchrun on
every pod with ``--rdzv-backend c10d --rdzv-endpoint <job>-0.<job>:29500``.

acceptrun runs inside the pods, so its guarantees hold there:

- pod 0 runs the supervisor (``acceptrun run``), whose workload is node 0's torchrun;
  its record, checkpoints and verdict live in the workspace on the checkpoint volume
  (``/acceptrun``). A pod that replaces it (preemption, node failure) finds the record
  and runs ``acceptrun resume RUN --from-mirror``: the newest checkpoint that verifies on
  the volume, else the newest in ``checkpoint.mirror``;
- pods 1..N-1 run a node agent (:mod:`acceptrun.backends.kubernetes_node`): it
  waits for each attempt the supervisor starts, joins it with the same contract
  environment (run record, attempt, checkpoint to resume from), ends its torchrun when
  the attempt ends, and exits once the run is accepted. With more than one node the
  checkpoint volume must be one ReadWriteMany claim that every pod mounts at the same
  path: every rank writes its part of each checkpoint into the same step directory.

The image must hold the acceptrun that wrote the manifests (its record format, its
resume): the container's script compares ``acceptrun --version`` with the exporter's and
stops with the fix when they differ, before any run; ``acceptrun export wheel`` writes this
acceptrun's wheel for the image's Dockerfile (:mod:`acceptrun.backends.ship`).

The spec goes into a ConfigMap (``spec.toml``) with its paths made absolute inside the
image (the spec's directory is the image's ``--workdir``). A ConfigMap is readable by
anyone who may list the namespace's objects, so it holds no secret: ``[env]`` entries
whose name looks secret (``HF_TOKEN``, ``WANDB_API_KEY``, ...; :mod:`acceptrun._util.redact`)
go into a Secret (``<job>-env``) that the container takes with ``envFrom``, and whatever
else in the spec looks like a credential (a URL's ``user:password@``, ``--token X``) is
redacted in the ConfigMap with a warning. The Secret is the one document that carries
secret values, so it is not part of :meth:`Manifests.yaml` (the terminal and every file
acceptrun writes are redacted): :meth:`Manifests.secret_yaml` gives it, and
``acceptrun export kubernetes --output job.yaml`` writes it alone to
``job.secret.yaml`` with mode 0600, or says how to create it from the user's own values. For several nodes the pods'
environment names the rendezvous (``ACCEPTRUN_NODES_STARTED_BY=kubernetes``,
``ACCEPTRUN_RDZV_HOST=<job>-0.<job>``, ``ACCEPTRUN_RDZV_PORT``), so that each pod's launch
is its own torchrun with a rendezvous id per attempt
(:func:`acceptrun.workload.distributed.launch_command`). Whatever the spec asks that a
manifest cannot express is a warning (:attr:`Manifests.warnings`, printed to stderr and
written into the YAML) or a :class:`UserError`, never dropped silently.

The YAML is written by hand (:func:`to_yaml`; no YAML library at run time): block
mappings and lists whose scalars are JSON literals, which YAML reads as they are.
The tests check every document with the Kubernetes Python client's own models.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w

from acceptrun._util.redact import is_secret_name, redact_text
from acceptrun._version import __version__
from acceptrun.errors import UserError
from acceptrun.record.workspace import new_run_id
from acceptrun.spec.model import ResourcesSpec, RunSpec

__all__ = [
    "CONTAINER",
    "GRACE_MARGIN_S",
    "RDZV_PORT",
    "SPEC_MOUNT",
    "TTL_AFTER_FINISHED_S",
    "WORKSPACE_MOUNT",
    "KubernetesOptions",
    "Manifests",
    "export_manifests",
    "to_yaml",
]

CONTAINER = "acceptrun"  # the container's name: podFailurePolicy's exit-code rule names it
WORKSPACE_MOUNT = "/acceptrun"  # the checkpoint volume: the workspace (records, checkpoints)
SPEC_MOUNT = "/etc/acceptrun"  # the ConfigMap with spec.toml
SHM_MOUNT = "/dev/shm"
RDZV_PORT = 29500  # torchrun's c10d rendezvous store on pod 0 (torchrun's default port)
# terminationGracePeriodSeconds = limits.grace_period + this: after the workload's grace
# period the supervisor still writes exit.json, the verdict and the report, and a rank
# past its grace period is killed by the supervisor, not by the kubelet (seconds).
GRACE_MARGIN_S = 60
# activeDeadlineSeconds = limits.wall_time + grace + this: the supervisor's own wall-time
# stop (checkpoint first) must fire before the Job's deadline kills the pods; the Job
# counts from its creation, so image pulls and scheduling come out of it (seconds).
DEADLINE_MARGIN_S = 900
# ttlSecondsAfterFinished: a finished Job's pods hold no GPU (a pod that has ended frees
# its requests at once, so the cluster autoscaler can remove an idle node), but the Job
# and its pods stay as objects until deleted; a day after the Job ends Kubernetes deletes
# them, pod logs with them (the record stays on the checkpoint claim) (seconds).
TTL_AFTER_FINISHED_S = 24 * 3600
# How long a torchrun agent waits for every node to join a rendezvous: a pod that replaces
# a preempted one may wait for an autoscaler to bring up a GPU node (seconds).
RDZV_JOIN_TIMEOUT_S = 1800
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_BARE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
# Words YAML 1.1 parsers read as booleans or null: such keys stay quoted.
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_MAX_JOB_NAME = 52  # pod hostnames are <job>-<index>, a DNS label of at most 63


@dataclass(kw_only=True, frozen=True)
class KubernetesOptions:
    """What the manifests need beyond the spec (``acceptrun export kubernetes`` flags)."""

    image: str | None = None
    """Container image with acceptrun, the workload's packages and the spec's directory."""
    namespace: str | None = None
    """Namespace of every object; default: the one ``kubectl`` uses."""
    name: str | None = None
    """Job and Service name; default: the spec's name and the run id's last 4 characters."""
    run_id: str | None = None
    """The run id the Job creates and resumes; default: a new one."""
    workdir: str = "/workspace"
    """Where the image holds the spec's directory (paths in the spec resolve against it)."""
    data_pvc: str | None = None
    """PersistentVolumeClaim mounted read-only at the spec's data path."""
    checkpoint_pvc: str | None = None
    """PersistentVolumeClaim for the workspace; without it an emptyDir (dies with the pod)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Node labels the pods need, e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}."""
    port: int = RDZV_PORT
    """TCP port of the rendezvous on pod 0."""


@dataclass(frozen=True)
class Manifests:
    """The exported objects, in apply order, and what the export could not express."""

    documents: list[dict[str, Any]]
    warnings: list[str]
    run_id: str
    job_name: str
    secret: dict[str, Any] | None = None
    """The Secret with the ``[env]`` values whose names look secret (None: there are none);
    not among ``documents``: it is written apart, mode 0600 (:meth:`secret_yaml`)."""

    def yaml(self) -> str:
        """All documents as one multi-document YAML text, the warnings as comments."""
        head = [
            f"# Kubernetes manifests for acceptrun run {self.run_id} (Job {self.job_name}).",
            "# Written by `acceptrun export kubernetes`; edit the spec and export again.",
            *(f"# warning: {w}" for w in self.warnings),
        ]
        return "\n".join(head) + "\n" + to_yaml(self.documents)

    def secret_yaml(self) -> str | None:
        """The Secret alone as YAML, with its values (None when there is none): write it
        where only its owner reads it, never through a redacted writer."""
        if self.secret is None:
            return None
        head = (
            f"# The Secret of acceptrun run {self.run_id} (Job {self.job_name}): the [env] "
            "values with secret names.\n# Keep this file private (mode 0600); apply it "
            "before the Job.\n"
        )
        return head + to_yaml([self.secret])

    @property
    def secret_names(self) -> list[str]:
        """The variables the Secret holds, for a `kubectl create secret` line."""
        return sorted((self.secret or {}).get("stringData", {}))


def export_manifests(spec: RunSpec, options: KubernetesOptions) -> Manifests:
    """The ConfigMap, headless Service (several nodes) and Indexed Job that run ``spec``.

    Raises :class:`UserError` for what no manifest can do (no image, several nodes without
    a shared checkpoint volume, a command torchrun cannot wrap, names Kubernetes refuses).
    """
    if not options.image:
        raise UserError(
            "the Kubernetes export needs the container image the pods run: pass --image, "
            "e.g. --image ghcr.io/me/train:1 (an image with acceptrun, the workload's "
            f"packages and the spec's directory at {options.workdir})"
        )
    if not PurePosixPath(options.workdir).is_absolute():
        raise UserError(f"--workdir {options.workdir!r} must be an absolute path in the image")
    res, limits = spec.resources, spec.limits
    nodes = res.nodes
    run_id = options.run_id or new_run_id(spec.name)
    name = options.name or _job_name(spec.name, run_id)
    if not _DNS_LABEL.match(name) or len(name) > _MAX_JOB_NAME:
        raise UserError(
            f"Job name {name!r} is not usable: Kubernetes needs lowercase letters, digits and "
            f"'-', starting with a letter, at most {_MAX_JOB_NAME} characters (pod host names "
            "add -<index>); pass --name, e.g. --name train-1"
        )
    if not 0 < options.port < 65536:
        raise UserError(f"--port {options.port} is not a TCP port; use 1 to 65535, e.g. 29500")
    if nodes > 1 and not options.checkpoint_pvc:
        raise UserError(
            f"resources.nodes = {nodes}: every pod's ranks write into the same checkpoint and "
            "run record, so they need one shared volume; pass --checkpoint-pvc NAME, a "
            "PersistentVolumeClaim with access mode ReadWriteMany (EFS, Filestore, Lustre...)"
        )
    warnings: list[str] = []
    mapped = _PodPaths(spec, options.workdir, warnings)
    secret_env = {k: v for k, v in spec.env.items() if is_secret_name(k)}
    spec_text = _pod_spec_toml(spec, mapped, warnings, set(secret_env))
    env = _pod_env(spec, name, options.port)
    if nodes > 1:  # the command torchrun wraps, checked as the pods will launch it
        from acceptrun.workload.distributed import launch_command

        launch_command(spec, {e["name"]: e["value"] for e in env})
    _warn_unexpressed(spec, options, warnings)

    labels = {"app.kubernetes.io/name": "acceptrun", "app.kubernetes.io/instance": name}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if options.namespace:
        meta["namespace"] = options.namespace
    annotations = {"acceptrun/run-id": run_id, "acceptrun/spec": spec.name}
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "name": f"{name}-spec", "annotations": annotations},
        "data": {"spec.toml": spec_text},
    }
    documents: list[dict[str, Any]] = [config]
    if nodes > 1:
        documents.append(_service(meta, options.port))
    secret: dict[str, Any] | None = None
    if secret_env:
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {**meta, "name": f"{name}-env", "annotations": annotations},
            "type": "Opaque",
            "stringData": secret_env,
        }
    job = _job(spec, options, meta, annotations, run_id, mapped, env, warnings)
    if secret is not None:
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["envFrom"] = [{"secretRef": {"name": secret["metadata"]["name"]}}]
    documents.append(job)
    if limits.wall_time is None:
        warnings.append(
            "limits.wall_time is not set: the Job has no activeDeadlineSeconds and runs "
            "until the supervisor ends it"
        )
    return Manifests(documents, warnings, run_id, name, secret)


# ---- the objects ------------------------------------------------------------------------------


def _service(meta: dict[str, Any], port: int) -> dict[str, Any]:
    """The headless Service: DNS names <job>-<index>.<job> for the pods (rendezvous)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            # The rendezvous starts before any pod is Ready: publish their names at once.
            "publishNotReadyAddresses": True,
            "selector": {"job-name": meta["name"]},
            "ports": [{"name": "rdzv", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def _job(
    spec: RunSpec,
    options: KubernetesOptions,
    meta: dict[str, Any],
    annotations: dict[str, str],
    run_id: str,
    mapped: _PodPaths,
    env: list[dict[str, str]],
    warnings: list[str],
) -> dict[str, Any]:
    """The Job: ``spec.resources.nodes`` indexed pods, each of them :func:`_pod`; a
    disruption replaces a pod, a rejected run (exit 1) fails the Job."""
    res, limits = spec.resources, spec.limits
    grace = round(float(limits.grace_period))
    pod = _pod(spec, options, meta, run_id, mapped, env, warnings)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": res.nodes,
        "parallelism": res.nodes,
        # Pod failures that are not disruptions: limits.max_restarts, as the supervisor
        # allows for its attempts.
        "backoffLimit": limits.max_restarts,
        # A replacement pod only once the old one has ended: two pods of one index would be
        # two supervisors of one record, or two ranks of one node.
        "podReplacementPolicy": "Failed",
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
        "podFailurePolicy": {
            "rules": [
                {
                    # Preemption, eviction, node drain or loss: the replacement pod
                    # resumes, and it does not count against backoffLimit.
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
                {
                    # acceptrun exits 1 for a rejected run (and for errors it reported): a
                    # new pod would reach the same verdict.
                    "action": "FailJob",
                    "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [1]},
                },
            ]
        },
        "template": {"metadata": {"labels": meta["labels"]}, "spec": pod},
    }
    if limits.wall_time is not None:
        job_spec["activeDeadlineSeconds"] = (
            round(float(limits.wall_time)) + grace + GRACE_MARGIN_S + DEADLINE_MARGIN_S
        )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**meta, "annotations": annotations},
        "spec": job_spec,
    }


def _pod(
    spec: RunSpec,
    options: KubernetesOptions,
    meta: dict[str, Any],
    run_id: str,
    mapped: _PodPaths,
    env: list[dict[str, str]],
    warnings: list[str],
) -> dict[str, Any]:
    """The pod template's spec: one container running the supervisor, its volumes, and
    the hostname (``subdomain``) the other nodes reach it by."""
    res = spec.resources
    grace = round(float(spec.limits.grace_period))
    mounts, volumes = _volumes(options, mapped, meta["name"], warnings)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": options.image,
        "command": ["/bin/sh", "-c", _entrypoint(spec, run_id)],
        "workingDir": mapped.workdir,
        "env": env,
        "volumeMounts": mounts,
    }
    resources = _container_resources(res)
    if resources:
        container["resources"] = resources
    if res.nodes > 1:
        container["ports"] = [{"name": "rdzv", "containerPort": options.port, "protocol": "TCP"}]
    pod: dict[str, Any] = {
        # Never: a failed pod is replaced by the Job (podFailurePolicy decides whether it
        # counts), and the supervisor inside restarts attempts itself.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace + GRACE_MARGIN_S,
        "containers": [container],
        "volumes": volumes,
    }
    if res.nodes > 1:
        pod["subdomain"] = meta["name"]
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    return pod


def _container_resources(res: ResourcesSpec) -> dict[str, Any]:
    """The container's ``limits`` and ``requests``: GPUs, CPUs and memory of ``resources``."""
    limit_map: dict[str, str] = {}
    request_map: dict[str, str] = {}
    if res.gpus > 0:
        limit_map["nvidia.com/gpu"] = str(res.gpus)  # extended resource: limits only
    if res.cpus:
        limit_map["cpu"] = request_map["cpu"] = str(res.cpus)
    if res.memory_gb:
        # Requests equal to limits: the Guaranteed QoS class, evicted last under pressure.
        limit_map["memory"] = request_map["memory"] = f"{round(res.memory_gb * 1024)}Mi"
    resources: dict[str, Any] = {}
    if limit_map:
        resources["limits"] = limit_map
    if request_map:
        resources["requests"] = request_map
    return resources


def _volumes(
    options: KubernetesOptions, mapped: _PodPaths, name: str, warnings: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mounts: list[dict[str, Any]] = [
        {"name": "workspace", "mountPath": WORKSPACE_MOUNT},
        {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": SHM_MOUNT},
    ]
    if options.checkpoint_pvc:
        workspace: dict[str, Any] = {
            "name": "workspace",
            "persistentVolumeClaim": {"claimName": options.checkpoint_pvc},
        }
    else:
        workspace = {"name": "workspace", "emptyDir": {}}
        warnings.append(
            "no --checkpoint-pvc: the run record and its checkpoints live in an emptyDir and "
            "die with the pod; a replacement pod starts the run again from step 0 "
            "(checkpoint.mirror cannot help without the record). Pass --checkpoint-pvc NAME"
        )
    volumes: list[dict[str, Any]] = [
        workspace,
        {"name": "spec", "configMap": {"name": f"{name}-spec"}},
        # NCCL and DataLoader workers share memory through /dev/shm; a container's default
        # is 64 MiB, which a few workers exhaust ("Bus error").
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if options.data_pvc:
        if mapped.data is None:
            raise UserError(
                f"--data-pvc {options.data_pvc} but the spec has no local data.path to mount it "
                'at; set data.path (e.g. "data") or leave out --data-pvc'
            )
        if mapped.data_is_file:
            raise UserError(
                f"--data-pvc {options.data_pvc}: data.path {mapped.spec.data.path!r} is a file, "
                "and the claim is mounted as a directory there; point data.path at the "
                "directory that holds it"
            )
        mounts.append({"name": "data", "mountPath": mapped.data, "readOnly": True})
        volumes.append(
            {
                "name": "data",
                "persistentVolumeClaim": {"claimName": options.data_pvc, "readOnly": True},
            }
        )
    elif mapped.data is not None:
        warnings.append(
            f"data.path is read from the image at {mapped.data}; pass --data-pvc NAME to mount "
            "a volume there instead"
        )
    return mounts, volumes


def _entrypoint(spec: RunSpec, run_id: str) -> str:
    """The container's shell script: supervisor on pod 0, node agent on the others."""
    q = shlex.quote
    mirror = " --from-mirror" if spec.checkpoint.mirror else ""
    want = f"acceptrun {__version__}"
    lines = [
        "set -eu",
        "# The image's acceptrun must be the one that wrote this Job (the record format it",
        "# reads and writes): `acceptrun export wheel` writes it for the image's Dockerfile.",
        'HAVE="$(acceptrun --version 2>/dev/null || true)"',
        f'if [ "$HAVE" != {q(want)} ]; then',
        f'  echo "acceptrun: this Job was exported by {want}, the image holds '
        f"${{HAVE:-no acceptrun}}: install {want} in the image (acceptrun export wheel, "
        f'then pip install the wheel in its Dockerfile)" >&2',
        "  exit 2",
        "fi",
        f"WS={WORKSPACE_MOUNT}",
        f"RUN_ID={q(run_id)}",
        'RUN="$WS/runs/$RUN_ID"',
    ]
    if spec.resources.nodes > 1:
        lines += [
            "# Pods 1..N-1: join every attempt that the supervisor on pod 0 starts.",
            'if [ "${JOB_COMPLETION_INDEX:-0}" != 0 ]; then',
            '  exec python -m acceptrun.backends.kubernetes_node --workspace "$WS" '
            '--run-id "$RUN_ID"',
            "fi",
        ]
    lines += [
        "# A pod that replaces pod 0 (preemption, node loss) continues the run.",
        'if [ -f "$RUN/run.json" ]; then',
        "  if python -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get"
        '("verdict") != "accepted")\' "$RUN/run.json"; then',
        '    echo "acceptrun: run $RUN_ID was already accepted"; exit 0',
        "  fi",
        f'  exec acceptrun --workspace "$WS" resume "$RUN_ID" --force --from-scratch{mirror} '
        '--reason "kubernetes pod restart"',
        "fi",
        f'exec acceptrun --workspace "$WS" run {SPEC_MOUNT}/spec.toml --run-id "$RUN_ID"',
    ]
    return "\n".join(lines) + "\n"


# ---- the spec inside the pod ----------------------------------------------------------------


class _PodPaths:
    """The spec's local paths as the pod sees them: the spec's directory is ``workdir``."""

    def __init__(self, spec: RunSpec, workdir: str, warnings: list[str]) -> None:
        self.spec = spec
        self.root = PurePosixPath(workdir)
        self.base = Path(spec.base_dir).resolve()
        self.warnings = warnings
        self.workdir = self.path(str(spec.workdir_path), "workdir")
        data = spec.data.path
        self.data: str | None = None
        self.data_is_file = False
        if data and "://" not in data:
            local = Path(spec.resolve_path(data))
            self.data = self.path(str(local), "data.path")
            self.data_is_file = local.is_file()

    def path(self, value: str, what: str) -> str:
        """``value`` (absolute or relative to the spec) inside the image."""
        local = Path(self.spec.resolve_path(value))
        try:
            rel = local.relative_to(self.base)
        except ValueError:
            self.warnings.append(
                f"{what} {local} is outside the spec's directory {self.base}: the pod must have "
                "it at that same path (in the image or on a volume you add)"
            )
            return local.as_posix()
        return str(self.root / rel.as_posix()) if rel.parts else str(self.root)


def _pod_spec_toml(
    spec: RunSpec, mapped: _PodPaths, warnings: list[str], secret_env: set[str]
) -> str:
    """The spec the pods run: the same, with its paths inside the image, without the
    ``[env]`` entries of the Secret and with any other credential redacted."""
    data = spec.to_dict()
    for key in secret_env:
        del data["env"][key]  # the pod has them from the Secret (envFrom)
    data["workdir"] = mapped.workdir
    if spec.data.path:
        data["data"]["path"] = mapped.data or spec.data.path
    if spec.data.manifest:
        data["data"]["manifest"] = mapped.path(spec.data.manifest, "data.manifest")
    if spec.checkpoint.dir:
        warnings.append(
            f"checkpoint.dir {spec.checkpoint.dir!r} is not used in the pod: checkpoints go to "
            f"the run record on the checkpoint volume ({WORKSPACE_MOUNT}/runs/<run>/checkpoints)"
        )
        del data["checkpoint"]["dir"]
    mirror = spec.checkpoint.mirror
    if mirror and "://" not in mirror:
        data["checkpoint"]["mirror"] = mapped.path(mirror, "checkpoint.mirror")
        warnings.append(
            f"checkpoint.mirror {mirror!r} is a local path: in the pod it is "
            f"{data['checkpoint']['mirror']} on the container's disk, lost with the pod; use a "
            "bucket URL (s3://..., gs://...) so that a pod on another node can resume from it"
        )
    elif not mirror:
        warnings.append(
            "no checkpoint.mirror: a pod that replaces pod 0 resumes only from the checkpoint "
            "volume; set checkpoint.mirror to a bucket URL to survive the volume's loss too"
        )
    if spec.inference.input:
        data["inference"]["input"] = mapped.path(spec.inference.input, "inference.input")
        data["inference"]["output"] = mapped.path(spec.inference.output, "inference.output")
    if spec.serving.payload:
        data["serving"]["payload"] = mapped.path(spec.serving.payload, "serving.payload")
    header = (
        f"# acceptrun spec {spec.name!r} as the pods run it (exported from {spec.source});\n"
        "# paths inside the image, durations in seconds.\n"
    )
    text = header + tomli_w.dumps(_drop_none(data))
    shown = redact_text(text, [])
    if shown != text:
        warnings.append(
            "the spec holds a credential outside [env] (a URL's user:password@, a --token "
            "argument, a key=value with a secret name): it is redacted in the ConfigMap, which "
            "any reader of the namespace sees; give it to the pods through [env] with a "
            "secret name (it then goes into the Secret), e.g. AWS_SECRET_ACCESS_KEY for an s3:// "
            "mirror"
        )
    return shown


def _warn_unexpressed(spec: RunSpec, options: KubernetesOptions, warnings: list[str]) -> None:
    res = spec.resources
    if res.gpu_types and not options.node_selector:
        warnings.append(
            f"resources.gpu_types {res.gpu_types} is not expressed: GPU model labels differ "
            "by cluster; pass --node-selector, e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 "
            "(GPU feature discovery) or cloud.google.com/gke-accelerator=nvidia-h100-80gb (GKE)"
        )
    if res.min_gpu_memory_gb:
        warnings.append(
            f"resources.min_gpu_memory_gb = {res.min_gpu_memory_gb:g} is checked by the "
            "preflight inside the pod, not by the scheduler"
        )
    if res.gpus > 0 and res.processes != res.gpus:
        warnings.append(
            f"resources.gpus = {res.gpus} but resources.processes = {res.processes}: each pod "
            "gets all its GPUs; usually one process per GPU"
        )
    if not res.cpus or not res.memory_gb:
        warnings.append(
            "resources.cpus or resources.memory_gb is not set: the pods request no CPU or "
            "memory and may land on a node without enough of them"
        )
    if spec.telemetry.prometheus_port is not None:
        warnings.append(
            "telemetry.prometheus_port serves on 127.0.0.1 inside pod 0: reach it with "
            "`kubectl port-forward`, not through a Service"
        )


def _pod_env(spec: RunSpec, name: str, port: int) -> list[dict[str, str]]:
    """The container's environment: the workspace and, for several nodes, the rendezvous."""
    from acceptrun.workload.distributed import (
        ENV_NODES_STARTED_BY,
        ENV_RDZV_HOST,
        ENV_RDZV_PORT,
    )

    env = {"PYTHONUNBUFFERED": "1", "ACCEPTRUN_WORKSPACE": WORKSPACE_MOUNT}
    if spec.resources.nodes > 1:
        env[ENV_NODES_STARTED_BY] = "kubernetes"  # each pod starts its own torchrun
        env[ENV_RDZV_HOST] = f"{name}-0.{name}"  # pod 0, through the headless Service
        env[ENV_RDZV_PORT] = str(port)
        # torchrun reads --rdzv-conf from here: how long a node waits for the others.
        env["PET_RDZV_CONF"] = f"join_timeout={RDZV_JOIN_TIMEOUT_S}"
    return [{"name": k, "value": v} for k, v in env.items()]


def _job_name(name: str, run_id: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    slug = re.sub(r"^[^a-z]+", "", slug)[: _MAX_JOB_NAME - 5].strip("-") or "acceptrun"
    return f"{slug}-{run_id[-4:].lower()}"


def _drop_none(value: Any) -> Any:
    """TOML has no null: unset fields stay out of the file."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


# ---- YAML --------------------------------------------------------------------------------------


def to_yaml(documents: Sequence[dict[str, Any]]) -> str:
    """Documents as multi-document YAML: block style, JSON scalars, ``|`` for long text."""
    out: list[str] = []
    for doc in documents:
        out.append("---")
        out += _yaml_lines(doc, 0)
    return "\n".join(out) + "\n"


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            lines += _yaml_entry(f"{pad}{_key(str(key))}:", item, indent)
    else:
        for item in value:
            if isinstance(item, dict) and item:
                first, *others = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {first[indent + 2 :]}")
                lines += others
            else:
                lines += _yaml_entry(f"{pad}-", item, indent)
    return lines


def _yaml_entry(head: str, item: Any, indent: int) -> list[str]:
    if isinstance(item, dict | list) and item:
        return [head, *_yaml_lines(item, indent + 2)]
    if isinstance(item, str) and "\n" in item and item.endswith("\n"):
        body = item[:-1].split("\n")
        # A literal block keeps the text as is, but cannot start with a space (that would
        # set its indentation), keep trailing spaces visible, or hold tabs or CR.
        plain = not any(line != line.rstrip() or "\t" in line or "\r" in line for line in body)
        if plain and body[0][:1] not in (" ", ""):
            pad = " " * (indent + 2)
            return [f"{head} |", *(f"{pad}{line}" if line else "" for line in body)]
    return [f"{head} {_scalar(item)}"]


def _key(key: str) -> str:
    """A mapping key, bare where YAML reads it as the same string (``apiVersion``)."""
    if _BARE_KEY.match(key) and key.lower() not in _YAML11_WORDS:
        return key
    return json.dumps(key)


def _scalar(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value)  # JSON's literals and double-quoted strings are valid YAML
