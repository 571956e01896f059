"""Provenance over real things: git repositories, interpreters, probe subprocesses."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import acceptrun
from acceptrun._util.hashing import hash_file
from acceptrun.capture import provenance
from acceptrun.capture.provenance import Change

PARTS = ["os", "host", "cpu", "memory", "python", "packages", "git", "torch", "gpus", "env"]


def git(repo: Path, *args: str) -> str:
    cmd = [
        "git",
        "-c", "user.name=Test",
        "-c", "user.email=test@example.com",
        "-c", "commit.gpgsign=false",
        "-c", "init.defaultBranch=main",
        *args,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed repository with a text file and a binary file."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "train.py").write_text("lr = 0.1\n")
    (root / "weights.bin").write_bytes(bytes(range(256)))
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def make_venv(where: Path, packages: dict[str, str]) -> Path:
    """A venv without pip or torch, holding ``packages`` as real .dist-info metadata."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python*/site-packages")
    for name, version in packages.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return where / "bin" / "python"


@pytest.fixture
def bare_python(tmp_path: Path) -> str:
    return str(make_venv(tmp_path / "venv", {"Demo_Pkg": "1.2.3"}))


@pytest.fixture(scope="module")
def child_capture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """capture() of this venv, run in a fresh child process so its sys.modules can be read."""
    code = textwrap.dedent(
        """
        import json, sys
        from acceptrun.capture import provenance
        prov = provenance.capture()
        print(json.dumps({
            "torch_imported": "torch" in sys.modules,
            "prov": prov,
            "text": provenance.format_provenance(prov),
        }))
        """
    )
    cwd = tmp_path_factory.mktemp("child")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True, text=True
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_capture_has_every_part_and_round_trips_as_json(child_capture: dict[str, Any]) -> None:
    prov = child_capture["prov"]
    assert list(prov) == ["schema", "captured_at", *PARTS, "hashes", "acceptrun", "probe"]
    assert prov["acceptrun"]["version"] == acceptrun.__version__
    assert prov["schema"] == 1
    when = datetime.datetime.fromisoformat(prov["captured_at"])
    assert when.utcoffset() == datetime.timedelta(0)
    assert set(prov["hashes"]) == {*PARTS, "all"}
    assert all(h.startswith("xxh3_128:") for h in prov["hashes"].values())
    assert json.loads(json.dumps(prov)) == prov
    assert prov["python"]["executable"] == sys.executable
    assert prov["memory"]["total_bytes"] > 0
    assert prov["cpu"]["count_logical"] >= 1


def test_torch_comes_from_the_probe_and_the_caller_never_imports_it(
    child_capture: dict[str, Any],
) -> None:
    assert child_capture["torch_imported"] is False
    torch_part = child_capture["prov"]["torch"]
    # PyPI wheels say "2.5.1" in their metadata and "2.5.1+cu124" in torch.__version__
    assert torch_part["version"].split("+")[0] == metadata.version("torch").split("+")[0]
    assert isinstance(torch_part["cuda_available"], bool)
    assert isinstance(torch_part["device_count"], int)
    if "+cpu" in torch_part["version"]:  # a CPU build records None, not an absent part
        assert torch_part["cuda"] is None and torch_part["nccl"] is None
        assert torch_part["device_count"] == 0
    packages = child_capture["prov"]["packages"]
    assert packages["list"]["torch"] == metadata.version("torch")  # read in this process
    assert packages["count"] == len(packages["list"])


def test_gpus_part_degrades_to_absent_with_the_nvml_reason(child_capture: dict[str, Any]) -> None:
    gpus = child_capture["prov"]["gpus"]
    if gpus.get("absent"):  # this CPU machine: no NVML library
        assert gpus["reason"].startswith("nvidia-ml-py")
        assert f"absent ({gpus['reason']})" in child_capture["text"]
    else:
        assert gpus["count"] == len(gpus["devices"]) >= 1
        assert gpus["devices"][0]["memory_total_bytes"] > 0


def test_dirty_repo_records_commit_and_a_diff_that_applies(
    repo: Path, bare_python: str, tmp_path: Path
) -> None:
    (repo / "train.py").write_text("lr = 0.05\n")
    (repo / "weights.bin").write_bytes(bytes(reversed(range(256))))
    (repo / "notes.txt").write_text("untracked\n")
    diff_path = tmp_path / "git.diff"

    part = provenance.capture(python=bare_python, cwd=repo / ".", diff_path=diff_path)["git"]

    assert part["root"] == str(repo)
    assert part["commit"] == git(repo, "rev-parse", "HEAD")
    assert part["branch"] == "main"
    assert part["dirty"] is True
    assert part["diff_file"] == "git.diff"
    assert (part["diff_hash"], part["diff_bytes"]) == hash_file(diff_path)
    text = diff_path.read_bytes()
    assert b"-lr = 0.1\n+lr = 0.05\n" in text
    assert b"#   notes.txt\n" in text  # untracked files are named, not included

    # The recorded diff rebuilds the working tree on a clean checkout of the commit.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "apply", str(diff_path))
    assert (clone / "train.py").read_text() == "lr = 0.05\n"
    assert (clone / "weights.bin").read_bytes() == bytes(reversed(range(256)))


def test_clean_detached_repo_and_repo_without_commits(
    repo: Path, bare_python: str, tmp_path: Path
) -> None:
    empty_diff = provenance.capture(python=bare_python, cwd=repo)["git"]
    assert empty_diff["dirty"] is False
    assert empty_diff["diff_bytes"] == 0
    assert empty_diff["diff_file"] is None

    git(repo, "checkout", "-q", "--detach", "HEAD")
    detached = provenance.capture(python=bare_python, cwd=repo)["git"]
    assert detached["branch"] is None
    assert detached["commit"] == git(repo, "rev-parse", "HEAD")

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    git(fresh, "init", "-q")
    (fresh / "a.py").write_text("x = 1\n")
    part = provenance.capture(python=bare_python, cwd=fresh)["git"]
    assert part["commit"] is None
    assert part["dirty"] is True


def test_remote_credentials_never_reach_the_record(repo: Path, bare_python: str) -> None:
    git(repo, "remote", "add", "origin", "https://alice:s3cret-token@git.example.com/team/x.git")
    prov = provenance.capture(python=bare_python, cwd=repo)
    assert prov["git"]["remote"] == "https://<redacted>@git.example.com/team/x.git"
    assert "s3cret-token" not in json.dumps(prov)


def test_outside_a_repository_git_is_absent_with_the_reason(
    bare_python: str, tmp_path: Path
) -> None:
    part = provenance.capture(python=bare_python, cwd=tmp_path)["git"]
    assert part["absent"] is True
    assert "not a git repository" in part["reason"]


def test_env_keeps_chosen_variables_and_redacts_secrets(bare_python: str) -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "hf_abcdef",
        "ACCEPTRUN_API_KEY": "k-123",
        "SLURM_DB_PASSWORD": "pw",
        "HF_ENDPOINT": "https://bob:hunter2@hf.example.com/api",
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
    }
    part = provenance.capture(python=bare_python, env=env)["env"]
    assert part == {
        "ACCEPTRUN_API_KEY": "<redacted>",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_ENDPOINT": "https://<redacted>@hf.example.com/api",
        "HF_TOKEN": "<redacted>",
        "NCCL_DEBUG": "INFO",
        "PATH": "/usr/bin:/bin",
        "SLURM_DB_PASSWORD": "<redacted>",
    }


def test_without_git_on_path_git_is_absent_with_the_reason(
    bare_python: str, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    part = provenance.capture(python=bare_python, cwd=repo)["git"]
    assert part["absent"] is True
    assert part["reason"].startswith("git is not installed or not on PATH")


def test_another_interpreter_reports_its_own_python_packages_and_torch(bare_python: str) -> None:
    prov = provenance.capture(python=bare_python)
    assert prov["python"]["executable"] == bare_python
    assert prov["python"]["version"].count(".") == 2
    assert prov["packages"]["list"] == {"demo-pkg": "1.2.3"}  # PEP 503 name
    assert prov["packages"]["count"] == 1
    assert prov["torch"]["absent"] is True
    assert prov["torch"]["reason"].startswith("torch is not installed for " + bare_python)


def test_a_missing_interpreter_marks_its_parts_absent(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    prov = provenance.capture(python=missing, cwd=tmp_path)
    for name in ("python", "packages", "torch"):
        assert prov[name]["absent"] is True
        assert missing in prov[name]["reason"]
    assert prov["os"]["system"]  # the rest is still recorded


def test_diff_of_a_real_package_upgrade(tmp_path: Path) -> None:
    python = str(make_venv(tmp_path / "venv", {"demo_pkg": "1.2.3", "gone": "1.0"}))
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    before = provenance.capture(python=python, cwd=tmp_path, env=env)
    site = next((tmp_path / "venv").glob("lib/python*/site-packages"))
    (site / "demo_pkg-1.2.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: demo_pkg\nVersion: 1.2.4\n"
    )
    for f in (site / "gone-1.0.dist-info").iterdir():
        f.unlink()
    (site / "gone-1.0.dist-info").rmdir()
    after = provenance.capture(python=python, cwd=tmp_path, env=env)

    changes = provenance.diff(before, after)

    assert [c.path for c in changes] == [
        "packages.count",
        "packages.hash",
        "packages.list.demo-pkg",
        "packages.list.gone",
    ]
    assert changes[2] == Change("packages.list.demo-pkg", "1.2.3", "1.2.4")
    assert changes[3] == Change("packages.list.gone", "1.0", None)
    assert provenance.diff(before, before) == []


def test_hashes_change_only_for_the_part_that_changed(bare_python: str, tmp_path: Path) -> None:
    a = provenance.capture(python=bare_python, cwd=tmp_path, env={"OMP_NUM_THREADS": "4"})
    b = provenance.capture(python=bare_python, cwd=tmp_path, env={"OMP_NUM_THREADS": "8"})
    changed = {name for name in a["hashes"] if a["hashes"][name] != b["hashes"][name]}
    assert changed == {"env", "all"}


def test_format_provenance_summarises_the_key_facts(child_capture: dict[str, Any]) -> None:
    prov, text = child_capture["prov"], child_capture["text"]
    labels = [line.split()[0] for line in text.splitlines()]
    parts = ["os", "host", "cpu", "memory", "python", "packages", "git", "torch", "gpus"]
    parts.append("acceptrun")  # the acceptrun that captured it (not a hashed part)
    # A probe answered from the cache (an earlier test of this worker probed the same
    # interpreter) says so on a line of its own.
    cached = ["probe"] if prov["probe"]["cached"] else []
    assert labels == parts + cached, text
    assert prov["torch"]["version"] in text
    assert sys.executable in text
    assert f"{prov['packages']['count']} installed, {prov['packages']['hash']}" in text
    assert "GiB" in text
    assert "absent (" + prov["git"]["reason"] + ")" in text  # the child ran outside any repo


def test_device_smoke_without_a_gpu_does_not_run() -> None:
    result = provenance.device_smoke()
    assert result["ok"] is True
    if result["ran"]:  # a GPU machine: every visible device was exercised
        assert all(d["error"] is None for d in result["devices"])
    else:
        assert result == {"ran": False, "ok": True, "reason": "no CUDA device visible to torch"}


def test_device_smoke_reports_failures_instead_of_raising(bare_python: str, tmp_path: Path) -> None:
    no_torch = provenance.device_smoke(python=bare_python)
    assert no_torch["ran"] is False and no_torch["ok"] is True
    assert no_torch["reason"].startswith("torch is not installed")

    missing = provenance.device_smoke(python=str(tmp_path / "nope"))
    assert missing["ok"] is False and "nope" in missing["error"]

    slow = provenance.device_smoke(timeout=0.01)
    assert slow == {"ran": True, "ok": False, "error": slow["error"]}
    assert "timed out after 0.01 s" in slow["error"]


def test_probe_runs_standalone_without_acceptrun_on_the_path(bare_python: str) -> None:
    probe = Path(provenance.__file__).with_name("_probe.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [bare_python, str(probe)], capture_output=True, text=True, check=True, env=env
    )
    answer = json.loads(out.stdout)
    assert set(answer) == {"python", "packages", "torch"}
    assert answer["packages"]["list"] == {"demo-pkg": "1.2.3"}


def test_probe_ignores_modules_that_sit_beside_it(bare_python: str, tmp_path: Path) -> None:
    # acceptrun's folder may hold a module named like a stdlib one (queue.py); running the
    # probe as a script must not let it shadow the stdlib for torch or the probe itself.
    probe = tmp_path / "pkg" / "_probe.py"
    probe.parent.mkdir()
    probe.write_bytes(Path(provenance.__file__).with_name("_probe.py").read_bytes())
    for name in ("json", "platform", "re"):
        (probe.parent / f"{name}.py").write_text("raise SystemExit('shadowed stdlib')\n")
    out = subprocess.run([bare_python, str(probe)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["python"]["executable"] == bare_python
