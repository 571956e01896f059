"""The SkyPilot export: a run spec as a SkyPilot task YAML.

::

    text = task_yaml(load_spec("spec.toml"))       # or: acceptrun export skypilot spec.toml
    sky launch -c train task.yaml                  # one cluster
    sky jobs launch task.yaml                      # a managed job: recovered after preemption

The task runs the supervisor on the cloud machine: ``setup`` installs acceptrun and the
spec's pinned packages, ``run`` starts ``acceptrun run SPEC --run-id RUN``. A managed job
restarts the ``run`` section after a preemption, on a new machine; with a
``checkpoint.mirror`` bucket the workspace lives in that bucket (mounted
``MOUNT_CACHED``), so the restarted section finds the record and runs ``acceptrun resume
RUN --from-mirror`` from the newest mirrored checkpoint. Without a mirror a new machine
starts from step 0 (the YAML says so in a comment).

The acceptrun ``setup`` installs is the one that wrote the task
(:mod:`acceptrun.backends.ship`): a source checkout is uploaded and built there, an
installed acceptrun is packed back into its wheel and uploaded; ``acceptrun_version``
(``--acceptrun-version``) installs that release from the package index instead.

The YAML is written by hand (no YAML library needed); SkyPilot's own parser
(``sky.Task.from_yaml``) checks it in the tests.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from acceptrun._util.redact import redact_text
from acceptrun._version import RELEASE
from acceptrun.backends.ship import Shipped, this_acceptrun
from acceptrun.errors import UserError
from acceptrun.record.workspace import new_run_id
from acceptrun.spec.model import RunSpec

__all__ = ["MIRROR_MOUNT", "accelerators", "task_yaml"]

MIRROR_MOUNT = "/acceptrun"  # the checkpoint mirror's bucket, mounted on every node
DATA_MOUNT = "/data"  # a data URL, mounted read-only by the workload's choice
SOURCE_MOUNT = "/opt/acceptrun-src"  # this checkout of acceptrun, uploaded at launch
WHEEL_MOUNT = "/opt/acceptrun-wheel"  # or this install's wheel, uploaded at launch
_BUCKET = re.compile(r"^(s3|gs|r2|cos|oci|az|https)://[^/]+")


def accelerators(spec: RunSpec) -> str | None:
    """``skypilot.accelerators``, else ``<first of resources.gpu_types>:<gpus>``, else None."""
    if spec.skypilot.accelerators:
        return spec.skypilot.accelerators
    gpus = spec.resources.gpus
    if gpus <= 0:
        return None
    if not spec.resources.gpu_types:
        raise UserError(
            f"resources.gpus = {gpus} but neither skypilot.accelerators nor "
            'resources.gpu_types names a GPU model; add e.g. skypilot.accelerators = "H100:1"'
        )
    model = re.sub(r"\s+", "-", spec.resources.gpu_types[0].strip())
    return f"{model}:{gpus}"


def task_yaml(
    spec: RunSpec,
    *,
    run_id: str | None = None,
    spec_file: Path | None = None,
    acceptrun_version: str | None = None,
) -> str:
    """The SkyPilot task YAML for ``spec``; ``run_id`` fixes the run's id (new by default).

    ``acceptrun_version`` installs that release of acceptrun from the package index; by
    default the task uploads this acceptrun (its checkout, or its wheel).

    Raises :class:`UserError` for what the chosen cloud cannot do (spot or image ids on
    Lambda) and for paths the task cannot reach.
    """
    cloud = (spec.skypilot.cloud or "").lower() or None
    _check_cloud(spec, cloud)
    if acceptrun_version is not None and not RELEASE.match(acceptrun_version):
        raise UserError(
            f"--acceptrun-version {acceptrun_version!r} is not a release number; give one "
            "the package index holds, e.g. 0.1.0 (or leave it out to upload this acceptrun)"
        )
    run_id = run_id or new_run_id(spec.name)
    spec_file = Path(spec_file or spec.source).resolve()
    base = Path(spec.base_dir).resolve()
    notes: list[str] = []
    lines = [
        f"# SkyPilot task for acceptrun spec {spec.name!r}, run {run_id}.",
        "# Written by `acceptrun export skypilot`; edit the spec and export again.",
        f"name: {_q(_task_name(spec.name))}",
        "",
        "resources:",
        *_resources(spec, cloud),
    ]
    lines += ["", f"num_nodes: {spec.resources.nodes}", "", f"workdir: {_q(str(base))}"]
    mirror = spec.checkpoint.mirror
    persistent = mirror is not None and _BUCKET.match(mirror) is not None
    mounts = _data_mount(spec, base, notes) + _mirror_mount(mirror, persistent, notes)
    shipped = None if acceptrun_version else this_acceptrun()
    mounts += _acceptrun_mount(shipped, notes)
    if mounts:
        lines += ["", "file_mounts:", *mounts]

    workspace = f"{MIRROR_MOUNT}/.acceptrun" if persistent else "~/.acceptrun"
    try:
        spec_rel = spec_file.relative_to(base).as_posix()
    except ValueError:
        raise UserError(
            f"the spec {spec_file} is not inside its directory {base}; export it from there"
        ) from None
    lines += ["", "setup: |", *_indent(_setup(spec, shipped, acceptrun_version))]
    lines += ["", "run: |", *_indent(_run(run_id, spec_rel, workspace, persistent))]
    return _redacted("\n".join(lines) + "\n", notes)


def _check_cloud(spec: RunSpec, cloud: str | None) -> None:
    """Refuse what the chosen cloud cannot do: spot instances or machine images on Lambda."""
    sky = spec.skypilot
    if cloud == "lambda" and sky.use_spot:
        raise UserError(
            "skypilot.use_spot = true, but Lambda Cloud has no spot instances (SkyPilot "
            "refuses them); set use_spot = false or choose another cloud"
        )
    if cloud == "lambda" and sky.image_id and not sky.image_id.startswith("docker:"):
        raise UserError(
            f"skypilot.image_id = {sky.image_id!r}: Lambda Cloud does not take machine "
            'images in SkyPilot; use a Docker image ("docker:nvcr.io/...") or none'
        )


def _resources(spec: RunSpec, cloud: str | None) -> list[str]:
    """The ``resources:`` section's lines: what the machine needs, then its teardown."""
    sky = spec.skypilot
    resources: list[tuple[str, object]] = [
        ("cloud", cloud),
        ("region", sky.region),
        ("accelerators", accelerators(spec)),
        ("use_spot", sky.use_spot),
        ("image_id", sky.image_id),
        ("disk_size", sky.disk_size),
        ("cpus", f"{spec.resources.cpus}+" if spec.resources.cpus else None),
        ("memory", f"{spec.resources.memory_gb:g}+" if spec.resources.memory_gb else None),
    ]
    lines = [f"  {k}: {_q(v)}" for k, v in resources if v is not None]
    return lines + _teardown(sky.teardown, sky.idle_minutes)


def _data_mount(spec: RunSpec, base: Path, notes: list[str]) -> list[str]:
    """The data's mount: a URL mounted at :data:`DATA_MOUNT`, a local path outside the workdir
    uploaded to the same path; a note says which."""
    data = spec.data.path
    if data and "://" in data:
        return [f"  {DATA_MOUNT}:\n    source: {_q(data)}\n    mode: MOUNT"]
    if not data:
        return []
    local = Path(spec.resolve_path(data))
    if local.is_relative_to(base):
        notes.append(f"data {local} is inside the workdir: uploaded with it")
        return []
    # The same absolute path on the machine keeps the frozen spec's path valid.
    notes.append(f"data {local} is uploaded from this machine at every launch")
    return [f"  {_q(str(local))}: {_q(str(local))}"]


def _mirror_mount(mirror: str | None, persistent: bool, notes: list[str]) -> list[str]:
    """The checkpoint mirror's bucket at :data:`MIRROR_MOUNT`; without one, a note that a
    preempted run starts again from step 0."""
    if persistent:
        assert mirror is not None
        return [f"  {MIRROR_MOUNT}:\n    source: {_q(mirror)}\n    mode: MOUNT_CACHED"]
    if mirror:
        notes.append(
            f"checkpoint.mirror {mirror!r} is not a bucket URL: a new machine cannot see it"
        )
    notes.append("no bucket in checkpoint.mirror: after a preemption the run starts from step 0")
    return []


def _acceptrun_mount(shipped: Shipped | None, notes: list[str]) -> list[str]:
    """This acceptrun, uploaded with the task: its checkout, or its wheel (with a note)."""
    if shipped is None:
        return []
    if shipped.kind == "source":
        return [f"  {SOURCE_MOUNT}: {_q(str(shipped.path))}"]
    notes.append(
        f"acceptrun {shipped.version} is uploaded with the task as {shipped.path} (this "
        "install, packed back into its wheel); --acceptrun-version V installs V from "
        "the package index instead"
    )
    return [f"  {WHEEL_MOUNT}/{shipped.path.name}: {_q(str(shipped.path))}"]


def _redacted(text: str, notes: list[str]) -> str:
    """The task as shown, with its notes at the end, both through the redactor."""
    # The task is shown and shared like a record: no credential goes in it. SkyPilot mounts
    # buckets with the cloud's own credentials (`sky check`), not a URL's user:password@.
    shown = redact_text(text)
    if shown != text:
        notes.append(
            "a credential in the spec (a URL's user:password@, a signed URL) is redacted in "
            "this task: SkyPilot reaches buckets with the cloud's credentials (`sky check`); "
            "give secrets to the run with `sky launch --env NAME` (see [env])"
        )
    if notes:
        # notes quote the spec's paths and URLs: through the same redactor as the task
        shown += "\n" + redact_text("".join(f"# note: {n}\n" for n in notes))
    return shown


def _teardown(mode: str, idle_minutes: int) -> list[str]:
    """``resources.autostop`` and the comment that says what ends the cluster (``skypilot.teardown``).

    ``sky launch`` keeps a cluster until ``sky down``: an idle GPU bills all night. With
    ``down: true`` SkyPilot's autostop tears it down (not only stops it: a stopped
    cluster still bills its disks) ``idle_minutes`` after its last job, the run, ended.
    """
    autostop = f"  autostop: {{idle_minutes: {idle_minutes}, down: true}}"
    if mode == "keep":
        return [
            '  # skypilot.teardown = "keep": NO autostop. The cluster stays up after the run',
            "  # and bills until `sky down`; acceptrun's ledger does not count that time.",
        ]
    if mode == "managed":
        return [
            '  # skypilot.teardown = "managed": launch with `sky jobs launch`; the jobs',
            "  # controller tears the cluster down when the job ends. Under `sky launch` the",
            f"  # autostop below still tears it down {idle_minutes} min after the run ends.",
            autostop,
        ]
    return [
        f"  # No idle machine after the run: autostop tears the cluster down {idle_minutes} min",
        "  # after the run ends (skypilot.teardown, skypilot.idle_minutes in the spec).",
        autostop,
    ]


def _setup(spec: RunSpec, shipped: Shipped | None, index_version: str | None) -> list[str]:
    urls = [u for u in (spec.data.path, spec.checkpoint.mirror) if u and "://" in u]
    extras = ",".join(sorted({"s3"} if any(u.startswith("s3://") for u in urls) else set()))
    with_extras = f"[{extras}]" if extras else ""
    if shipped is None:  # the user named a release on the package index
        package = f"acceptrun{with_extras}=={index_version}"
    elif shipped.kind == "source":
        package = f"{SOURCE_MOUNT}{with_extras}"
    else:
        package = f"{WHEEL_MOUNT}/{shipped.path.name}{with_extras}"
    pins = [_pin(name, want) for name, want in sorted(spec.expect.packages.items())]
    out = [
        "set -e",
        "# acceptrun itself, then the packages the spec pins (expect.packages).",
        f"pip install {shlex.quote(package)}",
    ]
    if pins:
        out.append("pip install " + " ".join(shlex.quote(p) for p in pins))
    out.append("if [ -f requirements.txt ]; then pip install -r requirements.txt; fi")
    return out


def _run(run_id: str, spec_rel: str, workspace: str, persistent: bool) -> list[str]:
    q = shlex.quote
    ws = workspace if workspace.startswith("~") else q(workspace)
    resume = 'resume "$RUN_ID" --force --from-scratch'
    resume += " --from-mirror" if persistent else ""
    return [
        f"RUN_ID={q(run_id)}",
        f"WS={ws}",
        "# A managed job restarts this section after a preemption: continue the run.",
        'if [ -f "$WS/runs/$RUN_ID/run.json" ]; then',
        '  if python -c \'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("verdict") != "accepted")\' "$WS/runs/$RUN_ID/run.json"; then',
        '    echo "acceptrun: run $RUN_ID was already accepted"; exit 0',
        "  fi",
        f'  acceptrun --workspace "$WS" {resume} --reason "skypilot restart"',
        "else",
        f'  acceptrun --workspace "$WS" run {q(spec_rel)} --run-id "$RUN_ID"',
        "fi",
    ]


def _pin(name: str, want: str) -> str:
    """``expect.packages`` patterns as pip requirements: ``2.3.*`` -> ``==2.3.*``."""
    want = want.strip()
    return f"{name}{want}" if want[:1] in "<>=!~" else f"{name}=={want}"


def _task_name(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "acceptrun"


def _q(value: object) -> str:
    """A YAML scalar: JSON's literals and double-quoted strings are valid YAML."""
    return json.dumps(value)


def _indent(lines: list[str]) -> list[str]:
    return [f"  {line}" if line else "" for line in lines]
