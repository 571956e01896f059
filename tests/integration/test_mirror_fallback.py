"""Mirror recovery falls back: a mirrored step that does not verify is passed over.

A run mirrors its checkpoints; its local store is lost (another machine, a preemption)
and the newest mirrored step has a flipped byte in its tensor file. ``acceptrun resume
--from-mirror`` restores the step before it, records a ``mirror_quarantine`` event for the
bad one, and the verdict says which step the attempt resumed from; ``--step N`` picks a
step; a missing ``--step`` exits 2 and writes nothing. The recovery commands of the
SkyPilot and Kubernetes exports (which call ``resume --from-mirror``) fall back the same
way. Then fetch on a real S3-compatible server, and mirror roots that belong to one run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.campaign import tally

from acceptrun.backends.kubernetes import KubernetesOptions, export_manifests
from acceptrun.backends.skypilot import task_yaml
from acceptrun.checkpoint.mirror import Mirror
from acceptrun.checkpoint.mirror_remote import fetch, remote_steps
from acceptrun.checkpoint.owner import StoreOwnedError, StoreOwner, mirror_root, store_root
from acceptrun.cli.main import main
from acceptrun.errors import RecordError, UserError
from acceptrun.record.workspace import RunRecord
from acceptrun.run.launch import launch
from acceptrun.spec.model import load_spec
from builders import make_checkpoint, tree

if TYPE_CHECKING:
    pass

pytest_plugins = ["s3server"]
BUCKET = "acceptrun-test"  # s3server.BUCKET

TRAIN = textwrap.dedent(
    """
    import os
    import torch
    import acceptrun

    torch.manual_seed(0)
    total = int(os.environ.get("TOTAL", "30"))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = acceptrun.init()
    start = run.restore(model=model, optimizer=opt)
    print(f"attempt {run.attempt} starts at step {start}", flush=True)
    for step in run.steps(start, total):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(step, loss=loss.item())
        run.maybe_checkpoint(step)
    """
)


def cli(capsys: pytest.CaptureFixture[str], ws: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--workspace", str(ws), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def flip_tensor_byte(step_dir: Path) -> None:
    """Bit rot in the mirrored copy: same size, one byte of the tensor file changed."""
    tensors = step_dir / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tensors.write_bytes(bytes(data))


def break_newest(record: RunRecord, url: str) -> tuple[int, int]:
    """Corrupt the newest mirrored step and lose the local store; (newest, the one before)."""
    steps = remote_steps(url)
    assert len(steps) >= 2, steps
    flip_tensor_byte(Path(url) / f"step-{steps[-1]}")
    shutil.rmtree(store_root(record))
    return steps[-1], steps[-2]


def attempt_steps(record: RunRecord, attempt: int) -> list[int]:
    return [e["step"] for e in record.events("step") if e.get("attempt") == attempt]


@pytest.fixture
def mirrored(tmp_path: Path) -> tuple[Path, RunRecord, str]:
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    (job / "spec.toml").write_text(
        f'name = "mf"\ncommand = [{json.dumps(sys.executable)}, "train.py"]\n'
        f"[checkpoint]\nevery_steps = 10\nkeep_last = 3\n"
        f"mirror = {json.dumps(str(tmp_path / 'mirror'))}\n"
        "[limits]\nmax_restarts = 0\n"
    )
    ws = tmp_path / "ws"
    result = launch(job / "spec.toml", workspace=ws, echo=False)
    assert result.verdict.accepted
    url = mirror_root(result.record, load_spec(result.record.spec_path))
    assert url is not None and remote_steps(url) == [9, 19, 29]
    return ws, result.record, url


def test_resume_from_mirror_falls_back_and_step_picks_one(
    mirrored: tuple[Path, RunRecord, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws, record, url = mirrored
    monkeypatch.setenv("TOTAL", "35")
    newest, previous = break_newest(record, url)
    assert (newest, previous) == (29, 19)

    code, out, err = cli(capsys, ws, "resume", record.run_id, "--force", "--from-mirror", "-q")

    assert code == 0, (out, err)
    (bad,) = record.events("mirror_quarantine")
    assert bad["step"] == 29 and bad["url"] == url and bad["attempt"] == 2
    assert "step-29/tensors.safetensors is corrupt" in bad["reason"]
    assert [e["step"] for e in record.events("mirror_fetch")] == [19]
    assert [e["step"] for e in record.events("restored")] == [19]
    assert [e["source"] for e in record.events("restored")] == ["mirror"]  # fetched back
    assert attempt_steps(record, 2) == list(range(20, 35))
    assert "mirrored step 29 does not verify, passed over" in err
    code, out, _ = cli(capsys, ws, "show", record.run_id)
    assert "attempt 2 from step 19" in out  # the verdict says which step was used
    code, out, _ = cli(capsys, ws, "show", "--explain", record.run_id)
    assert "mirror: step 29 did not verify" in " ".join(out.split())  # why, in its evidence

    # --step of a step the mirror does not have: exit 2, the steps it has, nothing written.
    shutil.rmtree(store_root(record))
    steps = remote_steps(url)
    before = {n: record.file(n).read_bytes() for n in ("run.json", "events.jsonl")}
    mirror_before = tree(Path(url))
    code, out, err = cli(
        capsys, ws, "resume", record.run_id, "--force", "--from-mirror", "--step", "99"
    )
    assert code == 2, (out, err)
    assert f"step 99 is not in the mirror at {url}" in err
    assert f"its committed steps: {', '.join(map(str, steps))}" in err
    assert {n: record.file(n).read_bytes() for n in before} == before
    assert not store_root(record).exists() and tree(Path(url)) == mirror_before
    code, _, err = cli(capsys, ws, "resume", record.run_id, "--force", "--step", "9")
    assert code == 2 and "add --from-mirror" in err

    # --step of a step that does not verify: exit 2, naming the fault and the others.
    flip_tensor_byte(Path(url) / f"step-{steps[0]}")
    code, out, err = cli(
        capsys, ws, "resume", record.run_id, "--force", "--from-mirror", "--step", str(steps[0])
    )
    assert code == 2, (out, err)
    assert f"step {steps[0]} in the mirror at {url} does not verify" in err
    assert f"the other committed steps there: {steps[1:]}" in err

    # --step N picks N, though newer mirrored steps verify.
    pick = steps[1]
    code, out, err = cli(
        capsys, ws, "resume", record.run_id, "--force", "--from-mirror", "--step", str(pick), "-q"
    )
    assert code == 0, (out, err)
    last = max(a for e in record.events("attempt_start") if (a := e["attempt"]))
    assert attempt_steps(record, last) == list(range(pick + 1, 35))
    assert list(record.events("restored"))[-1]["step"] == pick
    passed_over = list(record.events("mirror_quarantine"))  # each corrupt step a resume met
    tally("mirrored steps corrupted", tried=len(passed_over), tracebacks=0)
    assert [e["step"] for e in passed_over] == [29, steps[0]]


def _shell_scripts(node: Any) -> list[str]:
    """The ``/bin/sh -c SCRIPT`` scripts of a manifest's containers."""
    if isinstance(node, dict):
        command = node.get("command")
        if isinstance(command, list) and command[:2] == ["/bin/sh", "-c"]:
            return [command[2]]
        return [s for v in node.values() for s in _shell_scripts(v)]
    if isinstance(node, list):
        return [s for v in node for s in _shell_scripts(v)]
    return []


def _recovery_line(script: str) -> str:
    (line,) = [ln.strip() for ln in script.splitlines() if " resume " in ln]
    assert "--from-mirror" in line, line
    return line


@pytest.mark.parametrize("backend", ["skypilot", "kubernetes"])
def test_backend_recovery_commands_fall_back(
    mirrored: tuple[Path, RunRecord, str], backend: str, tmp_path: Path
) -> None:
    """The exports' own recovery line, run as a real shell would on the replacement machine."""
    ws, record, url = mirrored
    spec = load_spec(record.spec_path)
    if backend == "skypilot":
        # SkyPilot recovers from the mirror only when it is a bucket (mounted there).
        spec.checkpoint.mirror = f"s3://{BUCKET}/mirror"
        line = _recovery_line(task_yaml(spec, run_id=record.run_id))
    else:
        manifests = export_manifests(
            spec, KubernetesOptions(image="ghcr.io/me/train:1", run_id=record.run_id)
        )
        (script,) = _shell_scripts(manifests.documents)
        line = _recovery_line(script)
    newest, previous = break_newest(record, url)
    bindir = Path(sys.executable).parent
    proc = subprocess.run(
        ["bash", "-c", line.replace("exec ", "", 1)],
        env={"PATH": f"{bindir}:/usr/bin:/bin", "WS": str(ws), "RUN_ID": record.run_id,
             "TOTAL": "35", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (line, proc.stdout, proc.stderr)
    assert [e["step"] for e in record.events("mirror_quarantine")][-1] == newest
    assert list(record.events("mirror_fetch"))[-1]["step"] == previous
    assert list(record.events("restored"))[-1]["step"] == previous


# ---- fetch on S3, and mirror roots of one run ----------------------------------------------


def test_fetch_from_s3_passes_over_a_corrupt_step(s3: dict[str, Any], tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/fallback-{tmp_path.name}/run"
    options, server = s3["storage_options"], s3["server"]
    mirror = Mirror(url, state_path=tmp_path / "mirror.json", storage_options=options)
    for step in (10, 20, 30):
        mirror.upload(step, make_checkpoint(tmp_path / "ckpt", step))
    key = f"{url.removeprefix(f's3://{BUCKET}/')}/step-30/model.safetensors"
    size = (tmp_path / "ckpt" / "step-30" / "model.safetensors").stat().st_size
    server.client().put_object(Bucket=BUCKET, Key=key, Body=b"\0" * size)
    rejected: list[tuple[int, str]] = []

    path = fetch(
        url,
        tmp_path / "dest",
        storage_options=options,
        on_reject=lambda s, r: rejected.append((s, r)),
    )
    assert path == tmp_path / "dest" / "step-20"
    assert [s for s, _ in rejected] == [30] and "step-30/model.safetensors" in rejected[0][1]
    assert (tmp_path / "dest" / "LATEST").read_text() == "step-20\n"

    with pytest.raises(UserError, match=r"step 30 in the mirror .* does not verify.*\[10, 20\]"):
        fetch(url, tmp_path / "picked", step=30, storage_options=options)
    assert not (tmp_path / "picked").exists()
    with pytest.raises(UserError, match=r"step 40 is not in the mirror.*\[10, 20, 30\]"):
        fetch(url, tmp_path / "picked", step=40, storage_options=options)
    assert not (tmp_path / "picked").exists()
    assert fetch(url, tmp_path / "ten", step=10, storage_options=options).name == "step-10"


def test_a_mirror_root_belongs_to_one_run(s3: dict[str, Any], tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/owned-{tmp_path.name}/run"
    options = s3["storage_options"]
    a, b = StoreOwner("run-a", "a", "2026-01-01T00:00:00Z"), StoreOwner("run-a", "b", "2026-02-02")
    first = Mirror(url, state_path=tmp_path / "a.json", storage_options=options, owner=a)
    first.upload(5, make_checkpoint(tmp_path / "a", 5))
    # Another record with the same run id (another workspace) mirrors to the same root.
    second = Mirror(url, state_path=tmp_path / "b.json", storage_options=options, owner=b)
    with pytest.raises(RecordError, match=r"the mirror root .* belongs to run run-a \(spec 'a'"):
        second.upload(7, make_checkpoint(tmp_path / "b", 7))
    assert remote_steps(url, storage_options=options) == [5]
    with pytest.raises(StoreOwnedError, match="nothing was fetched"):
        fetch(url, tmp_path / "dest", storage_options=options, owner=b)
    assert not (tmp_path / "dest").exists()
    assert fetch(url, tmp_path / "dest", storage_options=options, owner=a).name == "step-5"
