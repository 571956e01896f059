"""`acceptrun export kubernetes`: manifests checked by the Kubernetes client's own models."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_models import UnknownField, validate

from acceptrun.backends.kubernetes import (
    CONTAINER,
    DEADLINE_MARGIN_S,
    GRACE_MARGIN_S,
    SPEC_MOUNT,
    TTL_AFTER_FINISHED_S,
    WORKSPACE_MOUNT,
    KubernetesOptions,
    Manifests,
    export_manifests,
    to_yaml,
)
from acceptrun.backends.kubernetes_node import pending_attempt
from acceptrun.cli.main import main
from acceptrun.errors import SpecError, UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.spec.model import RunSpec, load_spec
from acceptrun.workload.distributed import launch_command

TWO_NODES = """
name = "llm-pretrain"
command = ["python", "-u", "train.py", "--lr", "3e-4"]
[resources]
gpus = 8
processes = 8
nodes = 2
cpus = 96
memory_gb = 1536
[data]
path = "data"
[checkpoint]
every_steps = 500
mirror = "s3://acme-ckpt/llm"
[limits]
wall_time = "12h"
grace_period = "90s"
max_restarts = 5
"""

ONE_NODE_CPU = """
name = "charlm"
command = ["python", "train.py"]
[resources]
processes = 2
cpus = 4
memory_gb = 2.5
[limits]
grace_period = "0s"
"""

RUN_ID = "20261201-120000-llm-pretrain-ab12"


def write_spec(root: Path, text: str) -> RunSpec:
    """A project directory as the image holds it: the spec, its script and its data."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "data").mkdir(exist_ok=True)
    path = root / "spec.toml"
    path.write_text(textwrap.dedent(text))
    return load_spec(path)


def objects(out: Manifests) -> dict[str, dict[str, Any]]:
    """The documents by kind, each validated by the client's model first."""
    for doc in out.documents:
        validate(doc)
    return {doc["kind"]: doc for doc in out.documents}


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def pod_spec(tmp_path: Path, config: dict[str, Any]) -> RunSpec:
    """The ConfigMap's spec.toml, loaded the way `acceptrun run` loads it in the pod."""
    path = tmp_path / "pod-spec.toml"
    path.write_text(config["data"]["spec.toml"])
    return load_spec(path)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifests, Path]:
    """One export of the two-node, eight-GPU spec; several tests read it."""
    root = tmp_path_factory.mktemp("two") / "project"
    spec = write_spec(root, TWO_NODES)
    options = KubernetesOptions(
        image="ghcr.io/acme/llm:1", namespace="ml", run_id=RUN_ID, data_pvc="corpus",
        checkpoint_pvc="ckpt-rwx", node_selector={"nvidia.com/gpu.product": "H100"},
    )  # fmt: skip
    return export_manifests(spec, options), root


def test_two_nodes_indexed_job_and_headless_service(two_nodes: tuple[Manifests, Path]) -> None:
    out, _ = two_nodes
    kinds = objects(out)
    assert [d["kind"] for d in out.documents] == ["ConfigMap", "Service", "Job"]
    job, svc = validate(kinds["Job"]), validate(kinds["Service"])
    name = out.job_name
    assert name == "llm-pretrain-ab12" and job.metadata.namespace == "ml"
    assert job.spec.completion_mode == "Indexed"
    assert job.spec.completions == job.spec.parallelism == 2
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    assert svc.spec.selector == {"job-name": name} and svc.spec.ports[0].port == 29500
    pod = job.spec.template.spec
    assert pod.subdomain == svc.metadata.name == name  # pods are <job>-<i>.<service>
    (container,) = pod.containers
    env = {e.name: e.value for e in container.env}
    assert env["ACCEPTRUN_RDZV_HOST"] == f"{name}-0.{name}"
    assert env["ACCEPTRUN_RDZV_PORT"] == "29500"
    assert env["ACCEPTRUN_NODES_STARTED_BY"] == "kubernetes"
    assert container.ports[0].container_port == 29500
    assert pod.node_selector == {"nvidia.com/gpu.product": "H100"}


def test_resources_grace_restarts_and_deadline(two_nodes: tuple[Manifests, Path]) -> None:
    out, _ = two_nodes
    job = validate(objects(out)["Job"])
    pod = job.spec.template.spec
    (container,) = pod.containers
    assert container.name == CONTAINER and container.image == "ghcr.io/acme/llm:1"
    assert container.resources.limits == {
        "nvidia.com/gpu": "8", "cpu": "96", "memory": f"{1536 * 1024}Mi",
    }  # fmt: skip
    assert container.resources.requests == {"cpu": "96", "memory": f"{1536 * 1024}Mi"}
    assert pod.termination_grace_period_seconds == 90 + GRACE_MARGIN_S
    assert job.spec.backoff_limit == 5  # limits.max_restarts
    assert job.spec.active_deadline_seconds == 12 * 3600 + 90 + GRACE_MARGIN_S + DEADLINE_MARGIN_S
    assert pod.restart_policy == "Never"  # podFailurePolicy requires it
    assert job.spec.pod_replacement_policy == "Failed"  # never two pods of one index
    assert job.spec.ttl_seconds_after_finished == TTL_AFTER_FINISHED_S == 24 * 3600
    first, second = job.spec.pod_failure_policy.rules
    # A disruption (preemption, drain) is ignored: the replacement pod resumes, uncounted.
    assert first.action == "Ignore"
    assert [(c.type, c.status) for c in first.on_pod_conditions] == [("DisruptionTarget", "True")]
    assert second.action == "FailJob" and second.on_exit_codes.values == [1]
    assert second.on_exit_codes.container_name == CONTAINER


def test_volumes_data_checkpoints_and_shm(two_nodes: tuple[Manifests, Path]) -> None:
    out, _ = two_nodes
    pod = validate(objects(out)["Job"]).spec.template.spec
    volumes = {v.name: v for v in pod.volumes}
    mounts = {m.name: m for m in pod.containers[0].volume_mounts}
    assert volumes["workspace"].persistent_volume_claim.claim_name == "ckpt-rwx"
    assert mounts["workspace"].mount_path == WORKSPACE_MOUNT
    assert volumes["data"].persistent_volume_claim.claim_name == "corpus"
    assert volumes["data"].persistent_volume_claim.read_only
    assert mounts["data"].mount_path == "/workspace/data" and mounts["data"].read_only
    assert volumes["dshm"].empty_dir.medium == "Memory" and mounts["dshm"].mount_path == "/dev/shm"
    assert volumes["spec"].config_map.name == f"{out.job_name}-spec"
    assert mounts["spec"].mount_path == SPEC_MOUNT


def test_pods_launch_multinode_torchrun_without_srun(
    two_nodes: tuple[Manifests, Path], tmp_path: Path
) -> None:
    out, _ = two_nodes
    kinds = objects(out)
    spec = pod_spec(tmp_path, kinds["ConfigMap"])
    assert spec.workdir_path == Path("/workspace")
    assert spec.data.path == "/workspace/data"
    assert spec.resources.nodes == 2 and spec.checkpoint.mirror == "s3://acme-ckpt/llm"
    container = pod_of(kinds["Job"])["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update({"ACCEPTRUN_RUN_ID": RUN_ID, "ACCEPTRUN_ATTEMPT": "2"})
    argv = launch_command(spec, env)
    name = out.job_name
    assert argv == [
        "python", "-u", "-m", "torch.distributed.run", "--nnodes", "2",
        "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{name}-0.{name}:29500", "--rdzv-id", f"{RUN_ID}-a2",
        "--max-restarts", "0", "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    assert env["PET_SHUTDOWN_TIMEOUT"] == "90"  # torchrun waits out the grace period


def test_entrypoint_runs_then_resumes_from_the_mirror(two_nodes: tuple[Manifests, Path]) -> None:
    out, _ = two_nodes
    script = pod_of(objects(out)["Job"])["containers"][0]["command"]
    assert script[:2] == ["/bin/sh", "-c"]
    text = script[2]
    assert f"RUN_ID={RUN_ID}" in text
    assert 'exec python -m acceptrun.backends.kubernetes_node --workspace "$WS"' in text
    assert (
        'exec acceptrun --workspace "$WS" resume "$RUN_ID" --force --from-scratch --from-mirror'
        in text
    )
    assert f'exec acceptrun --workspace "$WS" run {SPEC_MOUNT}/spec.toml --run-id "$RUN_ID"' in text
    # pod 0's branch comes after the others' exit: a worker never runs the supervisor
    assert text.index("JOB_COMPLETION_INDEX") < text.index("resume")


def test_yaml_round_trips_through_a_yaml_parser(two_nodes: tuple[Manifests, Path]) -> None:
    out, _ = two_nodes
    assert list(yaml.safe_load_all(out.yaml())) == out.documents
    odd = {
        "yes": "no", "on": True, "a: b": "# not a comment", "n": None, "empty": [], "map": {},
        "text": " leading space\nline\n", "block": "line one\n  indented\n\nafter blank\n",
        "trailing": "spaces \nhere\n", "list": [{"a": 1, "b": [1, "2"]}, "x", [3]],
    }  # fmt: skip
    assert list(yaml.safe_load_all(to_yaml([odd, {"second": 2.5}]))) == [odd, {"second": 2.5}]


def test_one_node_cpu_has_no_service_gpus_or_rendezvous(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "p", ONE_NODE_CPU)
    out = export_manifests(spec, KubernetesOptions(image="charlm:1"))
    kinds = objects(out)
    assert "Service" not in kinds
    job = validate(kinds["Job"])
    assert job.spec.completions == job.spec.parallelism == 1
    assert job.spec.active_deadline_seconds is None  # no wall_time
    pod = job.spec.template.spec
    assert pod.subdomain is None and pod.containers[0].ports is None
    assert pod.termination_grace_period_seconds == GRACE_MARGIN_S  # grace_period 0
    assert pod.containers[0].resources.limits == {"cpu": "4", "memory": "2560Mi"}
    env = {e.name for e in pod.containers[0].env}
    assert not env & {"ACCEPTRUN_RDZV_HOST", "ACCEPTRUN_NODES_STARTED_BY"}
    assert pod.volumes[0].empty_dir is not None  # no --checkpoint-pvc
    assert any("die with the pod" in w for w in out.warnings)
    assert any("wall_time" in w for w in out.warnings)
    assert "JOB_COMPLETION_INDEX" not in pod.containers[0].command[2]
    assert "--from-mirror" not in pod.containers[0].command[2]  # no checkpoint.mirror
    pod_run = pod_spec(tmp_path, kinds["ConfigMap"])
    argv = launch_command(pod_run, {})
    assert argv[:6] == ["python", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    assert "--nproc-per-node" in argv and argv[argv.index("--nproc-per-node") + 1] == "2"


def test_warnings_name_what_the_manifests_cannot_express(tmp_path: Path) -> None:
    text = TWO_NODES.replace(
        "processes = 8", 'processes = 4\ngpu_types = ["H100"]\nmin_gpu_memory_gb = 80'
    ).replace('mirror = "s3://acme-ckpt/llm"', 'mirror = "mirror"\ndir = "ckpt"')
    spec = write_spec(tmp_path / "p", text)
    out = export_manifests(spec, KubernetesOptions(image="i:1", checkpoint_pvc="c"))
    said = "\n".join(out.warnings)
    for words in (
        "resources.gpu_types", "--node-selector", "min_gpu_memory_gb", "processes = 4",
        "checkpoint.dir", "checkpoint.mirror 'mirror' is a local path", "--data-pvc",
    ):  # fmt: skip
        assert words in said, words
    assert all(f"# warning: {w}" in out.yaml() for w in out.warnings)
    pod_run = pod_spec(tmp_path, objects(out)["ConfigMap"])
    assert pod_run.checkpoint.dir is None  # checkpoints stay in the record, on the volume
    assert pod_run.checkpoint.mirror == "/workspace/mirror"


@pytest.mark.parametrize(
    ("text", "options", "error", "words"),
    [
        pytest.param(ONE_NODE_CPU, {"image": None}, UserError, "--image", id="no-image"),
        pytest.param(TWO_NODES, {}, UserError, "ReadWriteMany", id="two-nodes-no-shared-volume"),
        pytest.param(ONE_NODE_CPU, {"name": "Bad_Name"}, UserError, "--name", id="bad-name"),
        pytest.param(ONE_NODE_CPU, {"workdir": "app"}, UserError, "absolute", id="relative-workdir"),
        pytest.param(ONE_NODE_CPU, {"port": 70000}, UserError, "TCP port", id="bad-port"),
        pytest.param(
            ONE_NODE_CPU, {"data_pvc": "d"}, UserError, "no local data.path", id="data-pvc-no-data"
        ),
        pytest.param(
            TWO_NODES.replace('["python", "-u", "train.py", "--lr", "3e-4"]', '"python train.py"'),
            {"checkpoint_pvc": "c"}, SpecError, "must be a list", id="two-nodes-shell-command",
        ),
        pytest.param(
            TWO_NODES.replace('["python", "-u", "train.py", "--lr", "3e-4"]', '["./train.sh"]'),
            {"checkpoint_pvc": "c"}, SpecError, "Python script or module", id="two-nodes-not-python",
        ),
    ],
)  # fmt: skip
def test_refusals_name_the_fix(
    tmp_path: Path, text: str, options: dict[str, Any], error: type[Exception], words: str
) -> None:
    spec = write_spec(tmp_path / "p", text)
    with pytest.raises(error, match=words):
        export_manifests(spec, KubernetesOptions(**{"image": "i:1", **options}))


def test_data_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "p", ONE_NODE_CPU + '[data]\npath = "train.py"\n')
    with pytest.raises(UserError, match="is a file"):
        export_manifests(spec, KubernetesOptions(image="i:1", data_pvc="d"))
    out = export_manifests(spec, KubernetesOptions(image="i:1"))  # read from the image: fine
    assert any("data.path is read from the image at /workspace/train.py" in w for w in out.warnings)


def test_validation_bites_on_unknown_fields_and_wrong_types(
    two_nodes: tuple[Manifests, Path],
) -> None:
    job = objects(two_nodes[0])["Job"]
    typo = yaml.safe_load(to_yaml([job]))
    pod_of(typo)["terminationGracePeriod"] = 30  # the real field ends in Seconds
    with pytest.raises(UnknownField, match="terminationGracePeriod"):
        validate(typo)
    wrong = yaml.safe_load(to_yaml([job]))
    wrong["spec"]["completions"] = "two"
    with pytest.raises(ValueError, match="completions"):
        validate(wrong)
    nameless = yaml.safe_load(to_yaml([job]))
    del pod_of(nameless)["containers"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        validate(nameless)


def test_cli_writes_the_file_and_warns_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_spec(tmp_path / "p", ONE_NODE_CPU)
    out = tmp_path / "job.yaml"
    argv = ["export", "kubernetes", str(tmp_path / "p" / "spec.toml"), "-o", str(out)]
    assert main([*argv, "--image", "charlm:1", "--node-selector", "pool=cpu"]) == 0
    captured = capsys.readouterr()
    assert "kubectl apply -f" in captured.out
    assert "warning: no --checkpoint-pvc" in captured.err
    docs = list(yaml.safe_load_all(out.read_text()))
    job = validate(docs[-1])
    assert job.spec.template.spec.node_selector == {"pool": "cpu"}
    assert main([*argv, "--node-selector", "novalue"]) == 2  # bad flag: the fix is named
    assert "KEY=VALUE" in capsys.readouterr().err


def test_cli_without_image_exits_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_spec(tmp_path / "p", ONE_NODE_CPU)
    assert main(["export", "kubernetes", str(tmp_path / "p" / "spec.toml")]) != 0
    assert "--image" in capsys.readouterr().err


def test_node_agent_joins_the_newest_attempt_still_running(tmp_path: Path) -> None:
    record = RunRecord(tmp_path / "runs" / RUN_ID)
    record.path.mkdir(parents=True)
    assert pending_attempt(record, 0) is None  # the supervisor has not started one
    record.attempt_dir(1).mkdir(parents=True)  # the supervisor makes it at launch...
    assert pending_attempt(record, 0) is None  # ...then writes the event
    record.event("attempt_start", attempt=1, pid=10, resume_step=None)
    assert pending_attempt(record, 0) == (1, None)
    record.write_json("attempts/1/exit.json", {"attempt": 1, "returncode": 143})
    assert pending_attempt(record, 0) is None  # ended before this node came
    record.attempt_dir(2).mkdir(parents=True)
    record.event("attempt_start", attempt=2, pid=11, resume_step=500)
    assert pending_attempt(record, 0) == (2, 500)
    assert pending_attempt(record, 2) is None  # already joined
