"""acceptrun installed the way a user installs it, into a fresh environment holding torch.

The README's install lines run as written (``python -m pip install "./acceptrun"``, the
clone a copy of this checkout's sources) in a new virtual environment that holds only
torch 2.13.0, the user's own. Nothing of the dev environment is there: no safetensors,
no s3fs, no tensorboard. In that environment, with its ``acceptrun``:

- a client-API script SIGKILLed by ``--inject`` resumes from its checkpoint and is
  ACCEPTED (its restore needs no package the save did not);
- a script that knows nothing of acceptrun, with ``checkpoint.watch``, is killed after
  its first captured save and resumes from its own file;
- a spec whose mirror needs s3fs is refused at preflight, before any attempt, naming
  s3fs, the interpreter and ``acceptrun[s3]``;
- ``acceptrun ui`` answers;
- ``acceptrun export skypilot`` uploads this install as its wheel (there is no index
  package to fall back on): the task's set-up line, run as written in another fresh
  environment against the uploaded file, installs the same acceptrun, file for file;
  ``acceptrun export wheel`` writes that same wheel for an image;
- last, each extra alone, installed as the README says, enables its feature: with
  ``[tensorboard]`` a script that only writes TensorBoard logs has its steps read; with
  ``[s3]`` a run mirrors its checkpoints to an S3 server on loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest

import acceptrun
from conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WATCHED = Path(__file__).with_name("watched_train.py")
pytestmark = pytest.mark.slow
# The S3 fixtures (tests/integration/s3server.py): a real S3-compatible server on loopback.
pytest_plugins = ["s3server"]


def readme_install_lines() -> list[str]:
    """The commands of the README's install block, as a user would type them."""
    text = README.read_text()
    found = re.search(r"<!-- install:[^>]*-->\s*```sh\n(.*?)```", text, re.S)
    assert found, "README.md lost its install block (<!-- install: ... --> then ```sh)"
    return [ln for ln in found.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def _clone(dest: Path) -> None:
    """What a clone holds of the package's sources (no build output, no caches)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "src", dest / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
    )  # fmt: skip


class Env:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "venv" / "bin"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
        self.env.pop("PYTHONPATH", None)
        self.env.pop("VIRTUAL_ENV", None)
        self.env["ACCEPTRUN_CACHE_DIR"] = str(root / "cache")  # the packed wheel's cache
        self.env["PATH"] = f"{self.bin}:{self.env.get('PATH', '')}"

    def sh(self, line: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", line], cwd=cwd, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def acceptrun(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "acceptrun"), *args], cwd=cwd, env=self.env, capture_output=True,
            text=True, timeout=600, check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Env:
    root = tmp_path_factory.mktemp("user")
    env = Env(root)
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(root / "venv")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    # The user's own torch, there before acceptrun (the CPU build these machines hold).
    torch = env.sh("python -m pip install -q torch==2.13.0", cwd=root)
    assert torch.returncode == 0, torch.stdout + torch.stderr
    _clone(root / "acceptrun")
    for line in readme_install_lines():  # word for word
        done = env.sh(line, cwd=root)
        assert done.returncode == 0, f"README line {line!r} failed:\n{done.stdout}\n{done.stderr}"
        if line.startswith("acceptrun --version"):
            assert done.stdout.strip() == f"acceptrun {acceptrun.__version__}", done.stdout
    return env


def test_the_install_holds_torch_and_acceptrun_and_nothing_of_the_dev_extras(
    installed: Env,
) -> None:
    probe = installed.sh(
        "python -c 'import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is "
        'not None for m in ["acceptrun", "torch", "safetensors", "s3fs", "tensorboard"]}))\'',
        cwd=installed.root,
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {
        "acceptrun": True, "torch": True, "safetensors": False, "s3fs": False,
        "tensorboard": False,
    }  # fmt: skip
    where = installed.sh("python -c 'import acceptrun; print(acceptrun.__file__)'", installed.root)
    assert str(installed.root / "venv") in where.stdout  # the installed copy, not the checkout


CLIENT = """
import torch
import acceptrun

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
run = acceptrun.init()
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, 200):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.log(step, loss=loss.item(), samples=64)
    if step % 40 == 39:
        run.checkpoint(step, block=True)
run.metric("loss", loss.item())
"""


def _project(env: Env, name: str) -> Path:
    work = env.root / name
    work.mkdir()
    return work


def test_a_killed_client_script_resumes_from_its_checkpoint(installed: Env) -> None:
    work = _project(installed, "client")
    (work / "train.py").write_text(textwrap.dedent(CLIENT))
    (work / "spec.toml").write_text(
        'name = "installed"\ncommand = ["python", "train.py"]\n'
        '[acceptance]\nmetrics = { loss = "< 1.0" }\n'
    )
    done = installed.acceptrun("run", "--inject", "kill@step=100", "spec.toml", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ACCEPTED" in done.stdout and "Traceback" not in done.stderr, done.stdout
    (rd,) = (work / ".acceptrun" / "runs").iterdir()
    events = [json.loads(ln) for ln in (rd / "events.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["kind"] == "workload_start"]
    assert [e["resume_from"] for e in starts][:1] == [None] and len(starts) == 2
    # the checkpoint before the kill at step 100, restored without the safetensors package
    assert str(starts[1]["resume_from"]).endswith("/step-79"), starts[1]
    assert json.loads((rd / "verdict.json").read_text())["accepted"] is True


def _events(rd: Path) -> list[dict[str, Any]]:
    path = rd / "events.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line still being written
    return out


def test_a_black_box_script_resumes_from_its_own_watched_checkpoint(installed: Env) -> None:
    work = _project(installed, "blackbox")
    shutil.copy(WATCHED, work / "train.py")
    (work / "spec.toml").write_text(
        textwrap.dedent(
            """
            name = "installed-watched"
            command = ["python", "train.py", "--sleep", "0.03"]
            [checkpoint]
            watch = ["out/ckpt.pt"]
            resume_args = ["--init_from=resume"]
            [progress]
            pattern = 'iter (?P<step>\\d+): loss (?P<loss>[0-9.eE+-]+)'
            [limits]
            restart_backoff = "0s"
            """
        )
    )
    out = work / "run.out"
    with out.open("w") as f:
        proc = subprocess.Popen(
            [str(installed.bin / "acceptrun"), "run", "-q", "spec.toml"],
            cwd=work, env=installed.env, stdout=f, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        runs = work / ".acceptrun" / "runs"
        rd = wait_for(
            # not ".creating-<id>": a record being made, renamed into place a moment later
            lambda: next(iter(runs.glob("[!.]*")), None) if runs.is_dir() else None,
            what="the run's record", alive=proc, explain=out.read_text,
        )  # fmt: skip

        def first_capture() -> dict[str, Any] | None:
            found = [e for e in _events(rd) if e["kind"] == "checkpoint_commit"]
            return found[0] if found else None

        wait_for(first_capture, what="a watched checkpoint", alive=proc, explain=out.read_text)
        start = next(e for e in _events(rd) if e["kind"] == "attempt_start")
        os.kill(start["pid"], signal.SIGKILL)
        assert proc.wait(timeout=600) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    starts = [e for e in _events(rd) if e["kind"] == "attempt_start"]
    assert len(starts) == 2 and starts[1]["command"][-1] == "--init_from=resume"
    assert starts[1]["restored"] == str(work / "out" / "ckpt.pt")
    assert json.loads((rd / "verdict.json").read_text())["accepted"] is True


def test_a_mirror_whose_package_is_missing_is_refused_before_any_attempt(installed: Env) -> None:
    work = _project(installed, "mirror")
    (work / "train.py").write_text("print('never runs')\n")
    (work / "spec.toml").write_text(
        'name = "needs-s3"\ncommand = ["python", "train.py"]\n'
        '[checkpoint]\nmirror = "s3://bucket/ckpt"\n'
    )
    done = installed.acceptrun("run", "spec.toml", cwd=work)
    assert done.returncode != 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "needs s3fs" in said and "pip install 'acceptrun[s3]'" in said, said
    assert "Traceback" not in said
    (rd,) = (work / ".acceptrun" / "runs").iterdir()
    assert not any(e["kind"] == "attempt_start" for e in _events(rd))  # no compute spent
    pre = json.loads((rd / "preflight.json").read_text())
    (dep,) = [c for c in pre["checks"] if c["name"] == "dependencies"]
    assert not dep["ok"] and {c["where"] for c in dep["details"]["checked"]} >= {"acceptrun"}


def test_the_board_answers(installed: Env) -> None:
    work = _project(installed, "board")
    (work / ".acceptrun").mkdir()
    out = work / "ui.out"
    with out.open("w") as f:
        proc = subprocess.Popen(
            [str(installed.bin / "acceptrun"), "ui", "--port", "0"],
            cwd=work, env=installed.env, stdout=f, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        url = wait_for(
            lambda: (m := re.search(r"open (http://127\.0\.0\.1:\d+/\S*token=\S+)", out.read_text()))
            and m.group(1),
            what="the board's address", alive=proc, explain=out.read_text,
        )  # fmt: skip
        # the token's URL sets the board's cookie and redirects: a browser's cookie jar
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        with opener.open(url, timeout=60) as page:
            assert page.status == 200 and b"run(s)" in page.read()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _package_dir(env: Env) -> Path:
    """Where the environment's acceptrun package is installed."""
    where = env.sh(
        "python -c 'import acceptrun, os; print(os.path.dirname(acceptrun.__file__))'", env.root
    )
    assert where.returncode == 0, where.stderr
    return Path(where.stdout.strip())


def _package_files(env: Env) -> dict[str, bytes]:
    """The installed acceptrun package's files (no compiled caches), by relative path."""
    pkg = _package_dir(env)
    return {
        p.relative_to(pkg).as_posix(): p.read_bytes()
        for p in sorted(pkg.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_a_skypilot_task_ships_this_install_as_its_wheel(
    installed: Env, tmp_path_factory: pytest.TempPathFactory
) -> None:
    yaml = pytest.importorskip("yaml")
    work = _project(installed, "sky")
    (work / "train.py").write_text("print('training')\n")
    (work / "spec.toml").write_text(
        'name = "shipped"\ncommand = ["python", "train.py"]\n'
        '[checkpoint]\nmirror = "s3://acme-ckpt/shipped"\n'
    )
    done = installed.acceptrun("export", "skypilot", "spec.toml", "-o", "task.yaml", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    task = yaml.safe_load((work / "task.yaml").read_text())
    version = acceptrun.__version__
    mount = f"/opt/acceptrun-wheel/acceptrun-{version}-py3-none-any.whl"
    wheel = Path(task["file_mounts"][mount])  # uploaded from this machine at launch
    assert wheel.is_file() and wheel.is_relative_to(installed.root / "cache"), wheel
    (line,) = [ln for ln in task["setup"].splitlines() if "acceptrun-wheel" in ln]
    assert line == f"pip install '{mount}[s3]'", line
    assert "acceptrun==" not in task["setup"]  # nothing asked of a package index
    # The machine: a fresh environment, the wheel where the mount puts it, the line as written.
    remote = Env(tmp_path_factory.mktemp("remote"))
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(remote.root / "venv")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    local = remote.root / mount.lstrip("/")
    local.parent.mkdir(parents=True)
    shutil.copy(wheel, local)
    setup = remote.sh(
        line.replace(mount, str(local)).replace("pip ", "python -m pip ", 1), remote.root
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    version_line = remote.sh("acceptrun --version", remote.root)
    assert version_line.stdout.strip() == f"acceptrun {version}", version_line
    assert _package_files(remote) == _package_files(installed)
    # `acceptrun export wheel`: the same wheel, for an image's Dockerfile.
    out = installed.acceptrun("export", "wheel", "-o", str(work / "wheels"), cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (work / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert f"RUN python -m pip install /tmp/{wheel.name}" in out.stdout


def test_a_changed_install_is_refused_not_shipped(installed: Env) -> None:
    work = _project(installed, "changed")
    (work / "spec.toml").write_text('name = "changed"\ncommand = ["python", "-c", "pass"]\n')
    files = _package_files(installed)
    assert "cost/prices.toml" in files
    prices = _package_dir(installed) / "cost" / "prices.toml"
    original = prices.read_bytes()
    prices.write_bytes(original + b"\n# edited by hand\n")
    try:
        done = installed.acceptrun("export", "skypilot", "spec.toml", cwd=work)
    finally:
        prices.write_bytes(original)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{prices} changed since acceptrun {acceptrun.__version__} was installed" in done.stderr
    assert "reinstall acceptrun" in done.stderr and not done.stdout


TENSORBOARD = """
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter("tb")
for step in range(1, 31):
    w.add_scalar("train/loss", 1.0 / step, step)
    w.flush()
w.close()
"""


def test_each_extra_installed_alone_enables_its_feature(installed: Env, s3: dict[str, Any]) -> None:
    # After every other test of the module: these installs add the extras' packages.
    tb = installed.sh('python -m pip install -q "./acceptrun[tensorboard]"', cwd=installed.root)
    assert tb.returncode == 0, tb.stdout + tb.stderr
    work = _project(installed, "extra-tensorboard")
    (work / "train.py").write_text(TENSORBOARD)
    (work / "spec.toml").write_text(
        'name = "tb"\ncommand = ["python", "train.py"]\n'
        '[progress]\ntensorboard = "tb"\ntags = { loss = "train/loss" }\n'
    )
    done = installed.acceptrun("run", "-q", "spec.toml", cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    from acceptrun.record.steplog import StepLog

    (rd,) = (work / ".acceptrun" / "runs").iterdir()
    steps = StepLog(rd).events()
    assert [s["step"] for s in steps] == list(range(1, 31))
    assert {s["source"] for s in steps} == {"tensorboard"}

    s3fs = installed.sh('python -m pip install -q "./acceptrun[s3]"', cwd=installed.root)
    assert s3fs.returncode == 0, s3fs.stdout + s3fs.stderr
    work = _project(installed, "extra-s3")
    (work / "train.py").write_text(textwrap.dedent(CLIENT))
    mirror = f"s3://{s3['bucket']}/installed-{os.getpid()}"
    (work / "spec.toml").write_text(
        f'name = "s3"\ncommand = ["python", "train.py"]\n[checkpoint]\nmirror = "{mirror}"\n'
    )
    env = {
        **installed.env,
        "AWS_ENDPOINT_URL": s3["endpoint_url"],
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    env.update(
        {k: os.environ[k] for k in os.environ if k.startswith("AWS_") and k != "AWS_ENDPOINT_URL"}
    )
    done = subprocess.run(
        [str(installed.bin / "acceptrun"), "run", "-q", "spec.toml"], cwd=work, env=env,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (rd,) = (work / ".acceptrun" / "runs").iterdir()
    from acceptrun.checkpoint.mirror_remote import remote_steps

    mirrored = remote_steps(f"{mirror}/{rd.name}", storage_options=s3["storage_options"])
    assert mirrored and mirrored[-1] == 199, mirrored  # the last checkpoint, off the machine
