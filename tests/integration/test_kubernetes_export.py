"""`acceptrun export kubernetes` as a user runs it, and the pods' two commands run for real.

No cluster runs here: the manifests are checked by the Kubernetes client's own models
(tests/unit/kube_models.py), the container's script by ``sh -n``, and the two things the
pods run, pod 0's ``acceptrun run`` of the exported spec and the node agent of the other
pods, as local processes that meet at a rendezvous on 127.0.0.1 (two "nodes" of one
process each, gloo): a run taken to ACCEPTED, and a run whose worker "pod" is preempted
(SIGTERM to its node agent), stops on every rank with a checkpoint, and resumes from it
with a replacement node agent.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from kube_models import validate

from acceptrun.checkpoint.store import CheckpointStore
from acceptrun.record.workspace import RunRecord
from conftest import PYTHON, Project, toml_str, wait_for

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


@dataclass
class Pods:
    """The exported Job's two commands, ready to start as local processes."""

    project: Project
    run_id: str
    spec: Path  # the ConfigMap's spec.toml
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)

    def supervisor(self) -> subprocess.Popen[bytes]:
        """Pod 0: `acceptrun run` of the exported spec."""
        return self._start(
            [ACCEPTRUN, "--workspace", str(self.project.workspace), "run", str(self.spec),
             "--run-id", self.run_id], index=0,
        )  # fmt: skip

    def node(self) -> subprocess.Popen[bytes]:
        """Pod 1 (or its replacement): the node agent."""
        return self._start(
            [PYTHON, "-m", "acceptrun.backends.kubernetes_node",
             "--workspace", str(self.project.workspace), "--run-id", self.run_id], index=1,
        )  # fmt: skip

    def _start(self, argv: list[str], *, index: int) -> subprocess.Popen[bytes]:
        log = self.project.root / f"pod{index}-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as f:
            return subprocess.Popen(
                argv, env={**self.env, "JOB_COMPLETION_INDEX": str(index)}, stdout=f,
                stderr=subprocess.STDOUT, cwd=self.spec.parent,
            )  # fmt: skip

    def output(self) -> str:
        """The pods' logs, each cut to its last 3,000 characters (for a failure message)."""
        return "".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.logs)

    def said(self, line: str) -> bool:
        """Whether a pod's whole log holds ``line`` (a torch warning of a few KB can come after
        the agent's first line when the store's host leaves first)."""
        return any(line in p.read_text() for p in self.logs)

    @property
    def record(self) -> RunRecord:
        return RunRecord(self.project.workspace / "runs" / self.run_id)


def exported_pods(project: Project, **env: str) -> Pods:
    """Export a 2-node spec running k8s_node_worker.py; the pods' environment from the Job."""
    job = project.root / "job"
    job.mkdir()
    shutil.copy(Path(__file__).with_name("k8s_node_worker.py"), job / "worker.py")
    spec = job / "spec.toml"
    spec.write_text(
        'name = "k8s-pods"\n'
        f'command = [{toml_str(PYTHON)}, "worker.py"]\n'
        f"env = {{ {', '.join(f'{k} = {toml_str(v)}' for k, v in env.items())} }}\n"
        "[resources]\nnodes = 2\nprocesses = 1\ncpus = 1\nmemory_gb = 1\n"
        '[limits]\nmax_restarts = 1\nrestart_backoff = 0\ngrace_period = "60s"\n'
    )  # fmt: skip
    out = project.root / "job.yaml"
    # The image's workdir is this directory here, so the exported paths work on this host.
    proc = export(spec, out, "--image", "i:1", "--checkpoint-pvc", "c", "--workdir", str(job))
    assert proc.returncode == 0, proc.stderr
    config, _, manifest = yaml.safe_load_all(out.read_text())
    pod_spec = project.root / "pod-spec.toml"
    pod_spec.write_text(config["data"]["spec.toml"])
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    pod_env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}}
    # Both "pods" on this host: the rendezvous at 127.0.0.1 instead of <job>-0.<job>.
    pod_env.update(ACCEPTRUN_RDZV_HOST="127.0.0.1", ACCEPTRUN_RDZV_PORT=str(free_port()))
    pod_env["ACCEPTRUN_WORKSPACE"] = str(project.workspace)
    run_id = manifest["metadata"]["annotations"]["acceptrun/run-id"]
    return Pods(project, run_id, pod_spec, pod_env)


def finish(pods: Pods, *procs: subprocess.Popen[bytes]) -> list[int]:
    """Wait for the processes (generously: torch starts slowly on a busy machine)."""
    try:
        return [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_exported_pods_take_a_two_node_run_to_accepted(project: Project) -> None:
    """Pod 0's supervisor and pod 1's node agent, from the exported manifests, on one host."""
    out = project.root / "out"
    out.mkdir()
    pods = exported_pods(project, TOTAL="8", EVERY="4", OUT=str(out))
    node = pods.node()
    rcs = finish(pods, pods.supervisor(), node)
    assert rcs == [0, 0], pods.output()  # the node agent leaves once the run is accepted
    assert pods.said("joining attempt 1") and pods.said("was accepted"), pods.output()
    record = pods.record
    assert record.state["verdict"] == "accepted"
    (start,) = record.events("attempt_start")
    argv = start["command"]
    assert "srun" not in argv and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--rdzv-id") + 1] == f"{pods.run_id}-a1"
    (ws,) = record.events("workload_start")
    assert ws["world_size"] == 2  # one rank from each "pod"
    latest = CheckpointStore(record.checkpoints_dir).latest()
    assert latest is not None and latest.step == 7
    assert {f.split("/")[0] for f in latest.files} >= {"rank-0", "rank-1"}


@pytest.mark.slow
def test_preempted_worker_pod_stops_every_rank_and_its_replacement_resumes(
    project: Project,
) -> None:
    out = project.root / "out"
    out.mkdir()
    pods = exported_pods(project, TOTAL="10", EVERY="4", HOLD_AT="5", OUT=str(out))
    first = pods.node()
    supervisor = pods.supervisor()
    try:
        wait_for(
            lambda: (out / "held-0").exists() and (out / "held-1").exists(),
            timeout=600, what="both ranks at step 5",
        )  # fmt: skip
        first.send_signal(signal.SIGTERM)  # the kubelet's SIGTERM to the preempted pod
        assert first.wait(timeout=600) == 143, pods.output()
        replacement = pods.node()  # the Job's new pod for index 1
    except BaseException:
        finish(pods, supervisor, first)
        raise
    rcs = finish(pods, supervisor, replacement)
    assert rcs == [0, 0], pods.output()
    record = pods.record
    assert record.state["verdict"] == "accepted"
    exit1 = record.read_json("attempts/1/exit.json")
    # torchrun's agent exits 1 when a rank stops; the stopped event says why
    assert exit1["class"] == "preempted" and exit1["decision"].startswith("restart"), exit1
    stopped = {(e["rank"], e["attempt"], e["step"]) for e in record.events("stopped")}
    assert stopped == {(0, 1, 5), (1, 1, 5)}  # every rank on both "pods", at the same step
    commits = [(e["attempt"], e["step"]) for e in record.events("checkpoint_commit")]
    assert (1, 5) in commits
    (restored,) = record.events("restored")
    assert restored["attempt"] == 2 and restored["step"] == 5
    resumed = [e["step"] for e in record.events("step") if e["attempt"] == 2]
    assert resumed == list(range(6, 10))
    assert pods.said("joining attempt 2") and pods.said("was accepted"), pods.output()
