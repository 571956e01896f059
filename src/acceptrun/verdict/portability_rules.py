"""Portability's rules: what in a spec's own values ties a run to one provider or machine.

The tables (provider mounts, provider-only tools, bucket, region and registry patterns)
and :func:`check_spec`, which applies them to a spec's command, environment, data,
checkpoint and pins. What a clone of the code lacks is read by
:mod:`acceptrun.verdict.portability_git`; the report and its entry points are
:mod:`acceptrun.verdict.portability`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from acceptrun._util.git import run_git
from acceptrun._util.paths import inside
from acceptrun.errors import GitError
from acceptrun.spec.model import RunSpec

__all__ = [
    "BLOCKER",
    "NOTE",
    "PROVIDER_MOUNTS",
    "PROVIDER_TOOLS",
    "WARNING",
    "Finding",
    "check_spec",
    "command_tokens",
]

BLOCKER, WARNING, NOTE = "blocker", "warning", "note"

# Mount points that exist on one provider's or one cluster's machines only.
PROVIDER_MOUNTS: tuple[tuple[str, str], ...] = (
    ("/lambda/nfs", "Lambda Cloud's persistent filesystem, attached in one region"),
    ("/home/ubuntu", "the default user's home on Lambda and AWS Ubuntu images"),
    ("/home/ec2-user", "the default user's home on Amazon Linux"),
    ("/mnt/efs", "an AWS EFS mount, reachable only inside its VPC and region"),
    ("/efs", "an AWS EFS mount, reachable only inside its VPC and region"),
    ("/fsx", "an AWS FSx for Lustre filesystem, in one availability zone"),
    ("/mnt/fsx", "an AWS FSx for Lustre filesystem, in one availability zone"),
    ("/gpfs", "a cluster's GPFS (Spectrum Scale) filesystem"),
    ("/lustre", "a cluster's Lustre filesystem"),
    ("/scratch", "cluster scratch space: machine- or site-local, often purged"),
    ("/mnt/disks", "a GCP persistent or local SSD disk mount"),
    ("/mnt/nfs", "an NFS share of one site"),
    ("/nfs", "an NFS share of one site"),
    ("/workspace", "RunPod's and many container platforms' volume mount"),
    ("/opt/ml", "SageMaker's job directory"),
    ("/content", "a Colab VM's disk"),
    ("/dbfs", "Databricks' filesystem mount"),
    ("/mnt/azureml", "an Azure ML datastore mount"),
)

# Commands that exist, or work, on one provider's or one kind of machine only.
PROVIDER_TOOLS: dict[str, str] = {
    "aws": "the AWS CLI: needs AWS credentials and reaches AWS resources only",
    "gcloud": "the Google Cloud CLI: needs GCP credentials",
    "gsutil": "Google Cloud Storage's CLI: needs GCP credentials",
    "az": "the Azure CLI: needs Azure credentials",
    "azcopy": "Azure's copy tool: needs Azure credentials",
    "oci": "the Oracle Cloud CLI",
    "ibmcloud": "the IBM Cloud CLI",
    "sky": "SkyPilot: launches cloud machines from inside the job",
    "nvidia-smi": "needs an NVIDIA driver: fails on CPU-only and AMD machines",
    "dcgmi": "NVIDIA DCGM: installed on few machines",
    "rocm-smi": "needs an AMD ROCm driver",
    "sbatch": "Slurm: exists on Slurm clusters only",
    "srun": "Slurm: exists on Slurm clusters only",
    "salloc": "Slurm: exists on Slurm clusters only",
    "module": "environment modules (Lmod): a cluster's own software tree",
    "kubectl": "Kubernetes: needs that cluster's credentials",
    "modal": "Modal's CLI",
    "runpodctl": "RunPod's CLI",
}
_TOOL_FIX = {
    "nvidia-smi": "read GPU state from acceptrun's telemetry (telemetry.jsonl), or guard the call",
    "sbatch": "launch through `acceptrun submit --backend slurm` and keep the command itself plain",
    "srun": "launch through `acceptrun submit --backend slurm` and keep the command itself plain",
    "salloc": "launch through `acceptrun submit --backend slurm` and keep the command itself plain",
    "module": "record the software with [expect] and install it in a venv or an image instead",
}
_DEFAULT_TOOL_FIX = (
    "move the step out of the command (fetch data or credentials before the run, "
    "or use fsspec URLs the job reads itself)"
)

_BUCKET = re.compile(r"\b(s3|s3a|gs|gcs|az|abfs|abfss|adl|oci|r2|wasbs?)://[^\s'\"]+")
_REGION = re.compile(
    r"\b(?:us|eu|ap|sa|ca|me|af|il|mx)-(?:north|south|east|west|central|northeast|southeast|"
    r"northwest|southwest)-\d\b|\b(?:us|europe|asia|australia|southamerica|northamerica)-"
    r"[a-z]+\d\b"
)
_REGION_ENV = (
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "CLOUDSDK_COMPUTE_REGION",
    "GOOGLE_CLOUD_REGION",
    "AZURE_REGION",
)
# Each host part starts only where its run of characters does (the lookbehinds): else a
# search over a long run of letters or digits retried every start, quadratic in its length.
_PRIVATE_REGISTRY = re.compile(
    r"((?<!\d)\d+\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com|(?<![a-z0-9-])[a-z0-9-]+-docker\.pkg\.dev|"
    r"(?<![a-z])(?:[a-z]+\.)?gcr\.io|(?<![a-z0-9])[a-z0-9]+\.azurecr\.io|nvcr\.io)/[^\s'\"]+"
)
_REGION_FS = re.compile(r"fs-[0-9a-f]+\.(?:efs|fsx)\.[a-z0-9-]+\.amazonaws\.com")
_SHELL_SPLIT = {"&&", "||", ";", "|", "(", ")", "&"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that ties a run to a provider or a machine, and the step that moves it."""

    severity: str
    """``blocker``, ``warning`` or ``note`` (see the module docstring)."""
    kind: str
    """``mount``, ``path``, ``bucket``, ``region``, ``image``, ``gpu``, ``tool``, ``pin``,
    ``data``, ``checkpoint`` or ``code``."""
    where: str
    """The field it was found in, e.g. ``command[1]``, ``env.DATA_DIR``, ``data.path``."""
    value: str
    why: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {
            "severity": self.severity,
            "kind": self.kind,
            "where": self.where,
            "value": self.value,
            "why": self.why,
            "fix": self.fix,
        }


def check_spec(spec: RunSpec, *, home: Path | None) -> list[Finding]:
    """Findings in a spec's own values.

    ``home`` is the directory whose contents travel with the code (a run's git root):
    absolute paths under it are portable. ``None`` reads the spec as written, where any
    absolute path is a finding and a relative one travels with the spec file.
    """
    out: list[Finding] = []
    if home is None or not inside(home, spec.workdir_path):
        out += _path_findings(
            "workdir", spec.workdir if home is None else str(spec.workdir_path), home
        )
    for i, token in enumerate(command_tokens(spec)):
        where = f"command[{i}]" if not spec.shell else "command"
        out += _value_findings(where, token, home)
    for tool, where in _tools(spec):
        out.append(
            Finding(WARNING, "tool", where, tool, PROVIDER_TOOLS[tool],
                    _TOOL_FIX.get(tool, _DEFAULT_TOOL_FIX))
        )  # fmt: skip
    for name, value in sorted(spec.env.items()):
        out += _value_findings(f"env.{name}", value, home)
        if name in _REGION_ENV:
            out.append(
                Finding(NOTE, "region", f"env.{name}", value,
                        "the job talks to one region's services",
                        "read the region from the machine's own environment instead of the spec")
            )  # fmt: skip
        if name == "AWS_PROFILE":
            out.append(
                Finding(WARNING, "code", f"env.{name}", value,
                        "a credentials profile that exists only in this machine's ~/.aws",
                        "pass credentials through the new machine's own environment or role")
            )  # fmt: skip
    for cmd_i, cmd in enumerate(spec.cleanup.commands):
        out += _value_findings(f"cleanup.commands[{cmd_i}]", cmd, home)
    out += _data_findings(spec, home)
    out += _checkpoint_findings(spec, home)
    out += _pin_findings(spec)
    return out


# ---- values: paths, buckets, images ------------------------------------------------------------


def _mount_of(path: str) -> tuple[str, str] | None:
    p = PurePosixPath(path)
    for mount, why in PROVIDER_MOUNTS:
        if p == PurePosixPath(mount) or p.is_relative_to(mount):
            return mount, why
    return None


def _path_findings(where: str, value: str, home: Path | None) -> list[Finding]:
    """An absolute path: a provider mount, or a path outside the code's checkout."""
    path = value.split("=", 1)[1] if value.startswith("-") and "=" in value else value
    if path.startswith("~"):
        return [
            Finding(WARNING, "path", where, value, "a path in this user's home directory",
                    "make it relative to the spec file, or read it from an environment variable")
        ]  # fmt: skip
    if not path.startswith("/"):
        return []
    if home is not None and inside(home, path):
        return []
    mount = _mount_of(path)
    if mount is not None:
        return [
            Finding(WARNING, "mount", where, value, f"{mount[0]} is {mount[1]}",
                    f"copy what is under {mount[0]} to object storage or into the repository, "
                    "and name it relative to the spec or through an environment variable")
        ]  # fmt: skip
    if PurePosixPath(path).name.startswith("python") and "/bin/" in path:
        return [
            Finding(WARNING, "path", where, value,
                    "an interpreter named by its absolute path on this machine",
                    'use "python" from PATH (activate the venv before `acceptrun run`); '
                    "[expect] records the version it must be")
        ]  # fmt: skip
    return [
        Finding(WARNING, "path", where, value, "an absolute path that exists on this machine only",
                "make it relative to the spec file, or read it from an environment variable")
    ]  # fmt: skip


def _value_findings(where: str, value: str, home: Path | None) -> list[Finding]:
    """Paths, bucket URLs, region-bound filesystems and private images inside one value."""
    out: list[Finding] = []
    for match in _BUCKET.finditer(value):
        out += _bucket_findings(where, match.group(0))
    for match in _REGION_FS.finditer(value):
        out.append(
            Finding(WARNING, "region", where, match.group(0),
                    "a filesystem reachable only inside one AWS region and VPC",
                    "copy the data to object storage the next machine can read, keep the manifest")
        )  # fmt: skip
    for match in _PRIVATE_REGISTRY.finditer(value):
        out += _image_findings(where, match.group(0))
    if "://" in value:
        return out
    for token in _words(value):
        out += _path_findings(where, token, home)
    return out


def _bucket_findings(where: str, url: str) -> list[Finding]:
    scheme = url.split("://", 1)[0]
    provider = {"s3": "AWS S3", "s3a": "AWS S3", "gs": "Google Cloud Storage",
                "gcs": "Google Cloud Storage", "r2": "Cloudflare R2",
                "oci": "Oracle Object Storage"}.get(scheme, "Azure storage")  # fmt: skip
    region = _REGION.search(url)
    why = f"a bucket on {provider}: other clouds pay egress and need its credentials"
    if region:
        why += f"; named for region {region.group(0)}"
    return [
        Finding(NOTE, "bucket", where, url, why,
                "give the next machine read credentials, or mirror the bucket near it "
                "(the data manifest proves the copy is the same)")
    ]  # fmt: skip


def _image_findings(where: str, image: str) -> list[Finding]:
    out = [
        Finding(WARNING, "image", where, image,
                "an image in a provider's registry: pulls need that provider's credentials",
                "push the image to a registry both machines can read, and name it by digest")
    ]  # fmt: skip
    if "@sha256:" not in image:
        out.append(
            Finding(NOTE, "image", where, image, "a tag can move to another image later",
                    "name the image by digest (image@sha256:...)")
        )  # fmt: skip
    return out


def _words(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:
        return value.split()


def command_tokens(spec: RunSpec) -> list[str]:
    return _words(spec.command[2]) if spec.shell else list(spec.command)


def _tools(spec: RunSpec) -> list[tuple[str, str]]:
    """Provider-only programs the command (or cleanup) runs: each word in program position."""
    found: list[tuple[str, str]] = []
    sources = [("command", command_tokens(spec))]
    sources += [(f"cleanup.commands[{i}]", _words(c)) for i, c in enumerate(spec.cleanup.commands)]
    for where, tokens in sources:
        program = True
        for token in tokens:
            if token in _SHELL_SPLIT:
                program = True
                continue
            name = PurePosixPath(token).name
            fresh = (name, where) not in found
            if program and "=" not in token and name in PROVIDER_TOOLS and fresh:
                found.append((name, where))
            if program and "=" in token and not token.startswith("-"):
                continue  # VAR=value before the program
            program = name in ("sudo", "env", "exec", "time", "nohup", "xargs")
    return found


# ---- spec sections -----------------------------------------------------------------------------


def _data_findings(spec: RunSpec, home: Path | None) -> list[Finding]:
    out: list[Finding] = []
    if spec.data.path:
        value = spec.data.path
        out += _value_findings("data.path", value, home)
        local = "://" not in value
        travels = local and (
            (home is None and not value.startswith(("/", "~")))
            or (home is not None and inside(home, value) and _tracked(value, home))
        )
        in_checkout = home is not None and inside(home, value) and (home / ".git").exists()
        if local and not travels and not in_checkout:  # in a checkout: git_data_findings
            out.append(
                Finding(WARNING, "data", "data.path", value,
                        "local data with no copy elsewhere: another machine cannot fetch it",
                        "copy it to object storage and point data.path at the URL; the manifest "
                        "proves the copy is the same")
            )  # fmt: skip
        if not spec.data.manifest:
            out.append(
                Finding(WARNING, "data", "data.manifest", "(none)",
                        "without a manifest nobody can check that a copy is the same data",
                        f"`acceptrun data snapshot {value} -o data.manifest.json` and set data.manifest")
            )  # fmt: skip
    if spec.data.manifest:
        out += _value_findings("data.manifest", spec.data.manifest, home)
    return out


def _tracked(path: str, home: Path) -> bool:
    """True when git tracks something at ``path`` in the checkout at ``home``."""
    if not (home / ".git").exists():
        return True  # the checkout is not on this machine: trust that it was committed
    try:
        rel = Path(path).resolve().relative_to(home.resolve())
        res = run_git(home, "ls-files", "--", str(rel))
    except (OSError, ValueError, GitError):
        return False
    return res.returncode == 0 and bool(res.stdout.strip())


def _checkpoint_findings(spec: RunSpec, home: Path | None) -> list[Finding]:
    ck = spec.checkpoint
    out: list[Finding] = []
    if ck.dir:
        out += _path_findings("checkpoint.dir", ck.dir, home)
    if ck.mirror:
        out += _value_findings("checkpoint.mirror", ck.mirror, home)
    elif ck.every_steps is not None or ck.every is not None:
        out.append(
            Finding(WARNING, "checkpoint", "checkpoint.mirror", "(none)",
                    "checkpoints stay on this machine: a resume elsewhere starts from scratch",
                    'set checkpoint.mirror = "s3://bucket/prefix" (or another machine\'s path); '
                    "`acceptrun resume --from-mirror` fetches it")
        )  # fmt: skip
    return out


_EXACT = re.compile(r"^\s*(?:==\s*)?\d+(?:\.\d+)*\s*$")  # one \s* per gap: linear


def _pin_findings(spec: RunSpec) -> list[Finding]:
    out: list[Finding] = []
    if spec.resources.gpu_types:
        names = ", ".join(spec.resources.gpu_types)
        out.append(
            Finding(NOTE, "gpu", "resources.gpu_types", names,
                    "pinned GPU models: other providers may not have them, or name them differently",
                    "list every model the run accepts, e.g. [\"H100\", \"H200\"]")
        )  # fmt: skip
    if spec.expect.gpu:
        out.append(
            Finding(NOTE, "gpu", "expect.gpu", spec.expect.gpu,
                    "every GPU must match this model name",
                    "widen the pattern to the models the run accepts")
        )  # fmt: skip
    if spec.skypilot.accelerators:
        out.append(
            Finding(NOTE, "gpu", "skypilot.accelerators", spec.skypilot.accelerators,
                    "SkyPilot looks for this accelerator only",
                    "use a set of accelerators SkyPilot may choose from")
        )  # fmt: skip
    if spec.skypilot.region:
        out.append(
            Finding(NOTE, "region", "skypilot.region", spec.skypilot.region,
                    "launches in one region only", "leave skypilot.region unset unless the data needs it")
        )  # fmt: skip
    image = spec.skypilot.image_id
    if image and _PRIVATE_REGISTRY.search(image):
        out += _image_findings("skypilot.image_id", image)
    elif image and "@sha256:" not in image:
        out.append(
            Finding(NOTE, "image", "skypilot.image_id", image, "a tag can move to another image later",
                    "name the image by digest (image@sha256:...)")
        )  # fmt: skip
    for name in ("cuda", "driver"):
        value = getattr(spec.expect, name)
        if value and value != "none" and _EXACT.match(value):
            out.append(
                Finding(WARNING, "pin", f"expect.{name}", value,
                        f"an exact {name.upper() if name == 'cuda' else name} version: "
                        "another machine will likely have another one",
                        f'accept a range, e.g. ">={value.lstrip("=").strip()}"')
            )  # fmt: skip
    for pkg, pattern in sorted(spec.expect.packages.items()):
        if "+cu" in pattern:
            out.append(
                Finding(NOTE, "pin", f"expect.packages.{pkg}", pattern,
                        "a build for one CUDA version", "pin the version without the +cu local tag")
            )  # fmt: skip
    return out
