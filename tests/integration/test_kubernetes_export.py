"""`acceptrun export kubernetes` as a user runs it, and the pods' two commands run for real.

No cluster runs here: the manifests are checked by the Kubernetes client's own models
(tests/unit/kube_models.py), the container's script by ``sh -n``, and the two things the
pods run, pod 0's ``acceptrun run`` of the exported spec and the node agent of the other
pods, as two local processes that meet at a rendezvous on 127.0.0.1 (two "nodes" of one
process each, gloo, examples/ddp) and take the run to ACCEPTED.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_models import validate

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project, toml_str

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp"
ACCEPTRUN = str(Path(PYTHON).with_name("acceptrun"))
RUN_ID = "20261201-120000-k8s-2node-ab12"


def two_node_job(project: Project, *, steps: int) -> Path:
    """examples/ddp with a spec of 2 nodes x 1 process (CPU), as a user's directory."""
    job = project.root / "job"
    shutil.copytree(EXAMPLE, job, ignore=shutil.ignore_patterns("out", "spec.toml"))
    (job / "spec.toml").write_text(
        'name = "k8s-2node"\n'
        f'command = [{toml_str(PYTHON)}, "train.py", "--hidden", "16"]\n'
        f'env = {{ DDP_STEPS = "{steps}" }}\n'
        "[resources]\nnodes = 2\nprocesses = 1\ncpus = 1\nmemory_gb = 1\n"
        "[checkpoint]\nevery_steps = 4\n"
        '[limits]\nmax_restarts = 1\nrestart_backoff = 0\ngrace_period = "60s"\n'
        'wall_time = "30m"\n'
    )  # fmt: skip
    return job / "spec.toml"


def export(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ACCEPTRUN, "export", "kubernetes", spec.name, "-o", str(out), *extra],
        cwd=spec.parent, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_cli_writes_manifests_the_client_models_accept(project: Project) -> None:
    spec = two_node_job(project, steps=8)
    out = project.root / "job.yaml"
    args = ("--image", "ghcr.io/acme/ddp:1", "--checkpoint-pvc", "ckpt", "--namespace", "ml")
    proc = export(spec, out, *args, "--run-id", RUN_ID)
    assert proc.returncode == 0, proc.stderr
    assert "kubectl apply -n ml -f" in proc.stdout
    assert "warning: no checkpoint.mirror" in proc.stderr  # said, not silently dropped
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    job = [validate(d) for d in docs][-1]
    assert job.spec.completion_mode == "Indexed" and job.spec.completions == 2
    assert job.metadata.annotations["acceptrun/run-id"] == RUN_ID
    script = job.spec.template.spec.containers[0].command[2]
    syntax = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr
    refused = export(spec, out.with_name("no.yaml"), "--image", "i:1")  # 2 nodes, no shared volume
    assert refused.returncode == 2 and "ReadWriteMany" in refused.stderr
    assert not out.with_name("no.yaml").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_exported_pods_take_a_two_node_run_to_accepted(project: Project) -> None:
    """Pod 0's supervisor and pod 1's node agent, from the exported manifests, on one host."""
    spec = two_node_job(project, steps=8)
    out = project.root / "job.yaml"
    job_dir = str(spec.parent)  # the image's workdir is this directory here
    proc = export(spec, out, "--image", "i:1", "--checkpoint-pvc", "c", "--workdir", job_dir)
    assert proc.returncode == 0, proc.stderr
    config, _, job = yaml.safe_load_all(out.read_text())
    run_id = job["metadata"]["annotations"]["acceptrun/run-id"]
    pod_spec = project.root / "pod-spec.toml"
    pod_spec.write_text(config["data"]["spec.toml"])
    container = job["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, Any] = {e["name"]: e["value"] for e in container["env"]}
    # Both "pods" on this host: the rendezvous at 127.0.0.1 instead of <job>-0.<job>.
    env.update(ACCEPTRUN_RDZV_HOST="127.0.0.1", ACCEPTRUN_RDZV_PORT=str(free_port()))
    env["ACCEPTRUN_WORKSPACE"] = str(project.workspace)
    pod_env = {**os.environ, **env}
    logs = project.root
    with open(logs / "pod0.log", "w") as p0, open(logs / "pod1.log", "w") as p1:
        node = subprocess.Popen(
            [PYTHON, "-m", "acceptrun.backends.kubernetes", "node",
             "--workspace", str(project.workspace), "--run-id", run_id],
            env={**pod_env, "JOB_COMPLETION_INDEX": "1"}, stdout=p1, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            supervisor = subprocess.run(
                [ACCEPTRUN, "--workspace", str(project.workspace), "run", str(pod_spec),
                 "--run-id", run_id],
                env={**pod_env, "JOB_COMPLETION_INDEX": "0"}, cwd=job_dir, stdout=p0,
                stderr=subprocess.STDOUT, timeout=600, check=False,
            )  # fmt: skip
            node_rc = node.wait(timeout=120)  # it leaves once the run is accepted
        finally:
            if node.poll() is None:
                node.kill()
    pod0, pod1 = (logs / "pod0.log").read_text(), (logs / "pod1.log").read_text()
    assert supervisor.returncode == 0, pod0[-3000:] + pod1[-3000:]
    assert node_rc == 0, pod1[-3000:]
    assert "joining attempt 1" in pod1 and "was accepted" in pod1
    record = RunRecord(project.workspace / "runs" / run_id)
    assert record.state["verdict"] == "accepted"
    (start,) = record.events("attempt_start")
    argv = start["command"]
    assert "srun" not in argv and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-id") + 1] == f"{run_id}-a1"
    (ws,) = record.events("workload_start")
    assert ws["world_size"] == 2  # one rank from each "pod"
    latest = CheckpointStore(record.checkpoints_dir).latest()
    assert latest is not None and latest.step == 7
    assert {f.split("/")[0] for f in latest.files} >= {"rank-0", "rank-1"}
    frozen = json.loads(json.dumps(record.read_json("run.json")))
    assert frozen["status"] == "finished"
