"""Portability: what ties a spec or a run to one provider or one machine, and how to move it.

``acceptrun portability RUN|SPEC`` lists each finding with where it is (a field path such
as ``command[1]`` or ``env.DATA_DIR``), why it ties the run down, and the one step that
moves it. A spec file is read as written (a relative path travels with the spec, an
absolute one does not); a run is read from its frozen spec and provenance, where paths
under the code's checkout (the git root) travel with the code.

Severity:

- ``blocker``: the run cannot be repeated elsewhere from its record as it stands: the
  command's own script is neither committed nor in ``git.diff`` (untracked), or the
  recorded ``git.diff`` is missing or does not match its hash. The verdict's exit test
  fails on a blocker.
- ``warning``: tied to this provider or machine (a provider mount, an absolute path, a
  provider-only tool, local data with no copy elsewhere, data inside the repository that
  git ignores, a spec or data manifest that is not committed, no git remote); one step
  moves it.
- ``note``: worth knowing when moving (a pinned GPU model, a bucket in one region, a
  CUDA build of torch); nothing to do to repeat it on a like machine.

A run is checked once, as it closes (:func:`write_portability`, called by run/close.py
before the verdict): ``portability.json`` in the record holds what was found then, and
the verdict's exit check and every view of the closed run read it
(:func:`recorded_portability`), never the checkout as it is later.

>>> report = check_spec_file("spec.toml")
>>> print(format_portability(report))
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from acceptrun._util.git import run_git
from acceptrun._util.hashing import hash_file
from acceptrun._util.paths import inside
from acceptrun.errors import GitError, RecordError
from acceptrun.record.models import stamp
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec, load_spec

__all__ = [
    "BLOCKER",
    "NOTE",
    "PORTABILITY_FILE",
    "WARNING",
    "Finding",
    "GitState",
    "PortabilityReport",
    "check_run",
    "check_spec",
    "check_spec_file",
    "format_portability",
    "git_state",
    "portability_of",
    "recorded_portability",
    "write_portability",
]

PORTABILITY_FILE = "portability.json"  # the findings as the run closed (write_portability)

BLOCKER, WARNING, NOTE = "blocker", "warning", "note"
_ORDER = {BLOCKER: 0, WARNING: 1, NOTE: 2}

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


@dataclass(slots=True)
class PortabilityReport:
    """All findings for a spec file or a run, blockers first."""

    subject: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == BLOCKER]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PortabilityReport:
        """The report :meth:`to_dict` wrote (``portability.json``)."""
        findings = [Finding(**{k: str(f[k]) for k in _FINDING_KEYS}) for f in data["findings"]]
        return cls(str(data["subject"]), findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "blockers": len(self.blockers),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.findings],
        }


_FINDING_KEYS = ("severity", "kind", "where", "value", "why", "fix")


# ---- entry points --------------------------------------------------------------------------


def write_portability(record: RunRecord) -> PortabilityReport:
    """Check the run as it closes and write ``portability.json``: what its views read."""
    report = check_run(record)
    record.write_json(PORTABILITY_FILE, {**stamp(), **report.to_dict()})
    return report


def recorded_portability(record: RunRecord) -> PortabilityReport | None:
    """The findings written as the run closed; None when it has no portability.json
    (a run still going, or one closed by an older release)."""
    data = record.read_json(PORTABILITY_FILE)
    if data is None:
        return None
    try:
        return PortabilityReport.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise RecordError(
            f"{record.file(PORTABILITY_FILE)} is damaged ({type(exc).__name__}: {exc}); "
            f"`acceptrun portability {record.run_id}` checks the run again"
        ) from None


def portability_of(record: RunRecord) -> PortabilityReport:
    """The findings written at close when there are some, else checked now."""
    return recorded_portability(record) or check_run(record)


def check_spec_file(path: str | Path) -> PortabilityReport:
    """Findings for a spec file, its values read as written (relative paths travel).

    In a git checkout, also what a clone would lack: the spec itself or its data
    manifest not committed, data inside the repository that git ignores.
    """
    spec = load_spec(path)
    findings = check_spec(spec, home=None)
    root = _checkout_of(Path(path).resolve().parent)
    if root is not None:
        findings += _committed_findings("spec", str(path), git_state(path, root))
        findings += _git_data_findings(spec, root, None)
    return PortabilityReport(str(path), _sorted(findings))


def check_run(record: RunRecord) -> PortabilityReport:
    """Findings for a run: its frozen spec, plus its code as provenance recorded it."""
    spec = record.spec
    prov = record.read_json("provenance.json") or {}
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    home: Path | None = None
    if git and not git.get("absent") and git.get("root"):
        home = Path(str(git["root"]))
    else:
        source = record.state.get("spec_source")
        home = Path(str(source)).parent if source else spec.workdir_path
    findings = check_spec(spec, home=home)
    findings += _code_findings(record, spec, git or {})
    findings += _build_findings(prov)
    if git and not git.get("absent") and git.get("root"):
        root = Path(str(git["root"]))
        at_run = recorded_states(record, root)
        source = record.state.get("spec_source")
        if source:
            findings += _committed_findings("spec", str(source), _state_of(source, root, at_run))
        findings += _git_data_findings(spec, root, at_run)
    return PortabilityReport(record.run_id, _sorted(findings))


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
    for i, token in enumerate(_command_tokens(spec)):
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


def _command_tokens(spec: RunSpec) -> list[str]:
    return _words(spec.command[2]) if spec.shell else list(spec.command)


def _tools(spec: RunSpec) -> list[tuple[str, str]]:
    """Provider-only programs the command (or cleanup) runs: each word in program position."""
    found: list[tuple[str, str]] = []
    sources = [("command", _command_tokens(spec))]
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
        if local and not travels and not in_checkout:  # in a checkout: _git_data_findings
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


# ---- what a clone lacks: files git ignores, files not committed ---------------------------------


@dataclass(frozen=True, slots=True)
class GitState:
    """What git holds of a file or directory in a checkout, as ``git status`` tells it."""

    state: str
    """``committed``, ``modified``, ``untracked`` or ``ignored`` (the clone lacks some of it)."""
    rel: str
    """The path relative to the checkout's root."""
    rule: str | None = None
    """For ``ignored``: the rule that ignores it, ``.gitignore:3:data/``."""
    in_diff: bool = False
    """Read from a run's ``git.diff``: a modified file's changes travel with the record."""


def _checkout_of(directory: Path) -> Path | None:
    """The root of the git checkout holding ``directory``, or None."""
    for d in (directory, *directory.parents):
        if (d / ".git").exists():
            return d
    return None


def _git_out(root: Path, *args: str) -> str | None:
    """git's output, or None when git could not answer (1 is an answer: check-ignore's "no")."""
    try:
        res = run_git(root, *args)
    except GitError:
        return None
    return res.stdout if res.returncode in (0, 1) else None


def git_state(path: str | Path, root: Path) -> GitState | None:
    """What a clone of the checkout at ``root`` has of ``path`` now; None when unknown.

    Unknown: the checkout is not on this machine, ``path`` is outside it or missing, or
    git cannot answer. ``ignored`` wins over the others: a clone lacks those files.

    >>> git_state("data", Path(".")).state
    'ignored'
    """
    if not (root / ".git").exists():
        return None
    try:
        target = Path(path).resolve()
        rel = target.relative_to(root.resolve()).as_posix()
    except (OSError, ValueError):
        return None
    if not target.exists() or rel == ".":
        return None
    status = _git_out(
        root, "status", "--porcelain=v1", "--ignored=matching", "--untracked-files=all", "--", rel
    )
    tracked = _git_out(root, "ls-files", "--", rel)
    if status is None or tracked is None:
        return None
    # git lists ignored directories whatever the pathspec: keep the entries at, under or
    # above ``rel`` (an ignored "data/" holds "data/train").
    entries = [
        (line[:2], line[3:].strip().strip('"').rstrip("/"))
        for line in status.splitlines()
        if line.strip()
    ]
    entries = [
        (code, p) for code, p in entries
        if p == rel or p.startswith(rel + "/") or rel.startswith(p + "/")
    ]  # fmt: skip
    codes = {code for code, _ in entries}
    if "!!" in codes:
        found = (_git_out(root, "check-ignore", "-v", "--", rel) or "").strip()
        if not found:  # a file below it is ignored: name that one's rule
            first = next(p for code, p in entries if code == "!!")
            found = (_git_out(root, "check-ignore", "-v", "--", first) or "").strip()
        rule = found.split("\t", 1)[0] if found else None
        return GitState("ignored", rel, rule)
    if not tracked.strip():
        return GitState("untracked", rel)
    if codes:
        return GitState("modified", rel)
    return GitState("committed", rel)


def recorded_states(record: RunRecord, root: Path) -> dict[str, GitState]:
    """Files the run's ``git.diff`` shows as untracked or changed, by absolute path.

    What was uncommitted when the run started, from the record alone.
    """
    out: dict[str, GitState] = {}
    for rel in _untracked(record):
        out[str(root / rel)] = GitState("untracked", rel)
    path = record.file("git.diff")
    if path.is_file():
        with open(path, "rb") as f:
            for raw in f:
                if raw.startswith(b"diff --git a/"):
                    rel = raw.decode(errors="replace").split(" b/", 1)[0][len("diff --git a/") :]
                    out.setdefault(str(root / rel), GitState("modified", rel))
    return out


def _committed_findings(what: str, path: str, state: GitState | None) -> list[Finding]:
    """A spec or data manifest that a clone lacks or has in another version."""
    if state is None or state.state == "committed":
        return []
    where = {"spec": "spec", "manifest": "data.manifest"}[what]
    noun = {"spec": "the spec", "manifest": "the data manifest"}[what]
    if state.state == "modified" and state.in_diff:
        return [
            Finding(NOTE, "code", where, state.rel,
                    f"{noun} had uncommitted changes: they travel in the record's git.diff, "
                    "a clone at the commit alone has another version",
                    f"`git add {state.rel} && git commit`, and push")
        ]  # fmt: skip
    if state.state == "modified":
        return [
            Finding(WARNING, "code", where, state.rel,
                    f"{noun} has uncommitted changes: a clone at the commit has another version",
                    f"`git add {state.rel} && git commit`, and push")
        ]  # fmt: skip
    if state.state == "ignored":
        return [
            Finding(WARNING, "code", where, state.rel,
                    f"git ignores {noun} ({state.rule or 'a .gitignore rule'}): a clone lacks it",
                    f"`git add -f {state.rel} && git commit`, or drop the rule")
        ]  # fmt: skip
    return [
        Finding(WARNING, "code", where, state.rel,
                f"{noun} is not committed (untracked): a clone lacks it",
                f"`git add {state.rel} && git commit`, and push")
    ]  # fmt: skip


def _git_data_findings(
    spec: RunSpec, root: Path, at_run: dict[str, GitState] | None
) -> list[Finding]:
    """Data and manifest inside the checkout that a clone would not have.

    ``at_run``: a run's files as its ``git.diff`` recorded them; None for a spec file.
    """
    out: list[Finding] = []
    if spec.data.path and "://" not in spec.data.path:
        path = spec.resolve_path(spec.data.path)
        state = git_state(path, root)
        if state is not None and state.state == "ignored":
            rule = state.rule or "a .gitignore rule"
            out.append(
                Finding(WARNING, "data", "data.path", state.rel,
                        f"the data is inside the repository but git ignores it ({rule}): "
                        "another engineer's clone does not have it",
                        "copy it to object storage and point data.path at the URL (the manifest "
                        f"proves the copy is the same), or commit it with `git add -f {state.rel}` "
                        "if it is small")
            )  # fmt: skip
        elif state is not None and state.state == "untracked":
            out.append(
                Finding(WARNING, "data", "data.path", state.rel,
                        "the data is inside the repository but not committed: a clone lacks it",
                        f"`git add {state.rel} && git commit`, or copy it to object storage and "
                        "point data.path at the URL")
            )  # fmt: skip
    if spec.data.manifest and "://" not in spec.data.manifest:
        manifest = spec.resolve_path(spec.data.manifest)
        out += _committed_findings("manifest", manifest, _state_of(manifest, root, at_run))
    return out


def _state_of(path: str, root: Path, at_run: dict[str, GitState] | None) -> GitState | None:
    """For a run (``at_run``): as ``git.diff`` recorded it, else ignored now; else as now."""
    if at_run is None:
        return git_state(path, root)
    recorded = at_run.get(str(Path(path).resolve())) or at_run.get(path)
    if recorded is not None:
        return GitState(recorded.state, recorded.rel, recorded.rule, in_diff=True)
    now = git_state(path, root)  # git.diff does not list ignored files
    return now if now is not None and now.state == "ignored" else None


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


# ---- code and build (runs only) ------------------------------------------------------------


def _untracked(record: RunRecord) -> list[str]:
    """Untracked files named in the header of git.diff (see provenance: not in the diff)."""
    path = record.file("git.diff")
    if not path.is_file():
        return []
    names: list[str] = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            if not line.startswith("#"):
                break
            if line.startswith("#   "):
                names.append(line[4:])
    return names


def _code_findings(record: RunRecord, spec: RunSpec, git: dict[str, Any]) -> list[Finding]:
    if not git or git.get("absent"):
        why = str(git.get("reason", "no git information recorded")) if git else "no provenance"
        return [
            Finding(WARNING, "code", "provenance.git", "(none)",
                    f"the code is not under git ({why}): nobody can fetch this exact code",
                    "put the code in a git repository, commit, push, and run again")
        ]  # fmt: skip
    out: list[Finding] = []
    root = Path(str(git.get("root")))
    if not git.get("remote"):
        out.append(
            Finding(WARNING, "code", "provenance.git.remote", "(none)",
                    "the repository has no remote: the commit exists on this machine only",
                    "`git remote add origin URL && git push origin HEAD`")
        )  # fmt: skip
    if git.get("dirty"):
        diff = record.file("git.diff")
        if not git.get("diff_file") or not diff.is_file():
            out.append(
                Finding(BLOCKER, "code", "git.diff", "(missing)",
                        "the working tree had uncommitted changes and the record has no git.diff",
                        "commit the changes and run again")
            )  # fmt: skip
        elif git.get("diff_hash") and hash_file(diff)[0] != git["diff_hash"]:
            out.append(
                Finding(BLOCKER, "code", "git.diff", str(diff),
                        "git.diff no longer matches the hash provenance recorded",
                        "commit the changes and run again; this record's code cannot be rebuilt")
            )  # fmt: skip
        elif int(git.get("diff_bytes") or 0) > 0:
            out.append(
                Finding(NOTE, "code", "git.diff", f"{git.get('diff_bytes')} bytes",
                        "uncommitted changes travel as git.diff in the record",
                        "commit them, so a clone at the commit is the code that ran")
            )  # fmt: skip
    untracked = _untracked(record)
    named = set()
    for token in _command_tokens(spec):
        if token.startswith("-") or "://" in token:
            continue
        candidate = Path(token) if token.startswith("/") else spec.workdir_path / token
        try:
            rel = str(candidate.resolve().relative_to(root.resolve()))
        except (OSError, ValueError):
            continue
        if rel in untracked:
            named.add(rel)
            out.append(
                Finding(BLOCKER, "code", "command", token,
                        f"{rel} is untracked: it is neither in commit "
                        f"{str(git.get('commit') or '?')[:12]} nor in git.diff",
                        f"commit it (`git add {rel} && git commit`) and run again")
            )  # fmt: skip
    workdir_rel = _rel(spec.workdir_path, root)
    others = [
        n for n in untracked
        if n.endswith(".py") and n not in named
        and (workdir_rel is None or workdir_rel == "." or n.startswith(workdir_rel + "/"))
    ]  # fmt: skip
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        out.append(
            Finding(WARNING, "code", "git", shown,
                    "untracked Python files beside the job: if it imports them, a clone lacks them",
                    "commit them, or add them to .gitignore if the job does not use them")
        )  # fmt: skip
    return out


def _rel(path: Path, root: Path) -> str | None:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except (OSError, ValueError):
        return None


def _build_findings(prov: dict[str, Any]) -> list[Finding]:
    torch = prov.get("torch") if isinstance(prov.get("torch"), dict) else None
    if not torch or torch.get("absent"):
        return []
    version = str(torch.get("version") or "")
    if "+cu" in version:
        return [
            Finding(NOTE, "pin", "provenance.torch.version", version,
                    f"torch built for CUDA {torch.get('cuda') or version.split('+cu')[1]}: the "
                    "next machine's driver must support that CUDA version",
                    "install the same wheel there (`acceptrun howto RUN` prints the command), "
                    "or check [expect] driver")
        ]  # fmt: skip
    return []


def _sorted(findings: list[Finding]) -> list[Finding]:
    unique = list(dict.fromkeys(findings))
    return sorted(unique, key=lambda f: (_ORDER.get(f.severity, 3), f.where))


# ---- output ----------------------------------------------------------------------------------


def format_portability(report: PortabilityReport) -> str:
    """One block per finding: severity, where, value, why, and the step that moves it."""
    if not report.findings:
        return f"{report.subject}: nothing ties it to one provider or machine"
    counts = ", ".join(
        f"{n} {label}{'s' if n != 1 else ''}"
        for label, n in (
            (BLOCKER, len(report.blockers)),
            (WARNING, len(report.warnings)),
            (NOTE, len(report.findings) - len(report.blockers) - len(report.warnings)),
        )
        if n
    )
    lines = [f"{report.subject}: {counts}"]
    for f in report.findings:
        lines.append(f"  {f.severity:<7} {f.where}: {f.value}")
        lines.append(f"          {f.why}")
        lines.append(f"          move it: {f.fix}")
    return "\n".join(lines)
