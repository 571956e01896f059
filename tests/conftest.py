"""Shared fixtures: a clean environment per test, a per-test workspace and project."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from acceptrun.record.workspace import RunRecord

if TYPE_CHECKING:
    from acceptrun.run.launch import LaunchResult

# Fuzz profiles: "ci" (default) keeps each fuzz test to a few seconds; HYPOTHESIS_PROFILE=deep
# tries thousands of cases (bench/fuzz_campaign.py); "smoke" (5 cases) only proves, in the
# campaign scripts' smoke tests, that they run: the suite fuzzes in the unit tier, with "ci".
# No deadline: a loaded machine is slow.
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("deep", max_examples=3000, deadline=None, print_blob=True)
settings.register_profile("smoke", max_examples=5, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PYTHON = sys.executable  # the venv's interpreter: specs never depend on PATH


# Where the suite's CPU goes: with ACCEPTRUN_TEST_CPU_LOG=FILE each test appends one JSON
# line, its CPU seconds in the pytest process and in every child it reaped (the workloads,
# `acceptrun` commands, servers; a killed child counts once reaped). `make suite-cpu` runs
# the integration tier so and prints tools/suite_cpu.py's table. A module-scoped fixture
# counts toward the first test that uses it.
_CPU_LOG = os.environ.get("ACCEPTRUN_TEST_CPU_LOG")


def _cpu_now() -> tuple[float, float]:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        own0, kids0 = _cpu_now()
        t0 = time.monotonic()
        yield
        own1, kids1 = _cpu_now()
        line = json.dumps({
            "test": item.nodeid, "own": round(own1 - own0, 3), "children": round(kids1 - kids0, 3),
            "wall": round(time.monotonic() - t0, 2),
        })  # fmt: skip
        fd = os.open(_CPU_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


# On an interpreter without torch (the unit tier on Python 3.12 and 3.13, `make
# test-pythons`: the CPU wheel of torch 2.13.0 is for 3.11 only) the test files that import
# torch at their top are left out, and the summary says how many and why: every other test
# runs. Which files they are is read from the files themselves, so a new one is covered.
_HAS_TORCH = importlib.util.find_spec("torch") is not None
_NEEDS_TORCH = re.compile(rb"^(?:import torch|from torch[ .])", re.M)


def _needs_torch(path: Path) -> bool:
    return (
        path.suffix == ".py"
        and path.name.startswith("test_")
        and bool(_NEEDS_TORCH.search(path.read_bytes()))
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if not _HAS_TORCH and _needs_torch(collection_path) else None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _HAS_TORCH:
        return
    config = terminalreporter.config
    roots = [Path(a.split("::")[0]) for a in config.args] or [Path(config.rootpath)]
    files = {p for r in roots for p in ([r] if r.is_file() else r.rglob("test_*.py"))}
    left = sorted(p.name for p in files if _needs_torch(p))
    if left:
        terminalreporter.write_line(
            f"torch is not installed for {sys.executable}: {len(left)} test files that "
            f"import it were left out ({', '.join(left)})"
        )


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> None:
    """Test modules import this file's helpers as ``from conftest import ...``.

    Under --import-mode=importlib pytest loads this file as ``tests.conftest`` and leaves
    ``conftest`` unbound (or bound to a tier's conftest.py); bind it to this module before
    each test module is imported, so that both names are the one module.
    """
    sys.modules["conftest"] = sys.modules[__name__]


@pytest.fixture(scope="session", autouse=True)
def user_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user's list of workspaces (acceptrun.record.registry) and acceptrun's cache go to
    the session's own directories.

    Set before any fixture, module-scoped ones included, through both variables: children
    started with the ACCEPTRUN_* ones filtered out still see XDG_CONFIG_HOME.
    """
    config = tmp_path_factory.mktemp("config")
    saved = {
        k: os.environ.get(k) for k in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "ACCEPTRUN_CONFIG_DIR")
    }
    os.environ["XDG_CONFIG_HOME"] = str(config)
    # the session's own cache (the provenance probe's answers), shared by its runs
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    os.environ["ACCEPTRUN_CONFIG_DIR"] = str(config / "acceptrun")
    yield config / "acceptrun"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def clean_environ(user_config: Path) -> Iterator[None]:
    """Each test starts without ACCEPTRUN_* variables (but the session's config directory)
    and leaves os.environ as it found it."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("ACCEPTRUN_")]:
        del os.environ[name]
    os.environ["ACCEPTRUN_CONFIG_DIR"] = str(user_config)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def toml_str(value: str) -> str:
    """A TOML basic string (JSON string syntax is valid TOML for these values)."""
    return json.dumps(value)


@dataclass
class Project:
    """A directory holding specs and workload scripts, with its own workspace."""

    root: Path
    workspace: Path

    @property
    def runs_dir(self) -> Path:
        return self.workspace / "runs"

    def spec(
        self,
        script: str | None = None,
        *,
        name: str = "t",
        command: list[str] | str | None = None,
        extra: str = "",
        file: str = "spec.toml",
    ) -> Path:
        """Write ``work.py`` (``<stem>.py`` for another ``file``) and a spec that runs it.

        ``extra`` is TOML appended after the top-level keys (sections, env, ...).
        """
        script_file = "work.py" if file == "spec.toml" else f"{Path(file).stem}.py"
        if script is not None:
            (self.root / script_file).write_text(textwrap.dedent(script))
        if command is None:
            command = [PYTHON, script_file]
        cmd = (
            toml_str(command)
            if isinstance(command, str)
            else "[" + ", ".join(toml_str(c) for c in command) + "]"
        )
        text = f"name = {toml_str(name)}\ncommand = {cmd}\n{textwrap.dedent(extra)}"
        path = self.root / file
        path.write_text(text)
        return path

    def run_ids(self) -> list[str]:
        if not self.runs_dir.is_dir():
            return []
        # A run directory appears whole under its final name; skip ".creating-*" ones.
        return sorted(
            p.name
            for p in self.runs_dir.iterdir()
            if not p.name.startswith(".") and (p / "run.json").exists()
        )

    def only_record(self) -> RunRecord:
        ids = self.run_ids()
        assert len(ids) == 1, ids
        return RunRecord(self.runs_dir / ids[0])

    def cli(
        self, *args: str, timeout: float = 300, check_rc: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``acceptrun --workspace WS ARGS`` as a real process, run in the project root."""
        proc = subprocess.run(
            [PYTHON, "-m", "acceptrun", "--workspace", str(self.workspace), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check_rc is not None:
            assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
        return proc


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A per-test workspace, also named by $ACCEPTRUN_WORKSPACE (cleared after the test)."""
    path = tmp_path / ".acceptrun"
    os.environ["ACCEPTRUN_WORKSPACE"] = str(path)
    return path


@pytest.fixture
def project(tmp_path: Path, workspace: Path) -> Project:
    root = tmp_path / "proj"
    root.mkdir()
    return Project(root=root, workspace=workspace)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 300.0,
    interval: float = 0.02,
    what: str = "",
    alive: subprocess.Popen[Any] | None = None,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    With ``alive``, a process that must be running for the condition ever to hold: its
    exit fails the wait at once (with its return code) instead of after the timeout.
    ``explain`` adds what the failure message should show (the process's stderr, the
    record's last events), so a wait that fails on a loaded machine says why.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        ended = alive.poll() if alive is not None else None
        if ended is not None:
            value = predicate()  # the condition may have held just before the exit
            if value:
                return value
            detail = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"the process exited ({ended}) before {what or predicate}{detail}")
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}{detail}")
        time.sleep(interval)


def launch_job(
    root: Path,
    workspace: Path,
    name: str,
    script: str,
    *,
    extra: str = "",
    inject: list[str] | None = None,
) -> LaunchResult:
    """``acceptrun run`` in this process of a job folder ``root/name``: ``script`` as work.py,
    one quick restart and a 2 s grace, then ``extra`` spec text; os.environ put back after."""
    from acceptrun.run.launch import launch

    job = root / name
    job.mkdir()
    (job / "work.py").write_text(script)
    (job / "spec.toml").write_text(
        f'name = {toml_str(name)}\ncommand = [{toml_str(PYTHON)}, "work.py"]\n'
        f'[limits]\nmax_restarts = 1\nrestart_backoff = 0\ngrace_period = "2s"\n{extra}'
    )
    saved = dict(os.environ)
    try:
        return launch(job / "spec.toml", workspace=workspace, echo=False, inject=inject or [])
    finally:
        os.environ.clear()
        os.environ.update(saved)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ACCEPTRUN_ variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEPTRUN_")}
    env.update(extra)
    return env


def job_folder(root: Path, script: str, spec: str) -> Path:
    """``root`` holding ``train.py`` and ``spec.toml``: a job as a user lays it out."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(script)
    (root / "spec.toml").write_text(spec)
    return root


def acceptrun_cmd(job: Path, *args: str) -> list[str]:
    """``acceptrun --workspace JOB/ws ARGS`` as a command line."""
    return [PYTHON, "-m", "acceptrun", "--workspace", str(job / "ws"), *args]


def acceptrun_in(
    job: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """That command as a real process in ``job``, with :func:`clean_env` and ``env``."""
    return subprocess.run(
        acceptrun_cmd(job, *args), cwd=job, env=clean_env(**(env or {})), capture_output=True,
        text=True, timeout=timeout, check=False,
    )  # fmt: skip


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``acceptrun ARGV`` in this process: the exit code, stdout and stderr."""
    from acceptrun.cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_no_run_left(project: Project) -> None:
    runs = project.runs_dir
    assert not runs.exists() or not any(runs.iterdir()), sorted(runs.iterdir())


def assert_one_message(err: str, error_type: str) -> str:
    """The CLI printed exactly one ``Type: message`` and no traceback; returns the message."""
    assert "Traceback" not in err
    assert err.startswith(f"{error_type}: "), err
    assert err.count("Error: ") == 1, err
    return err


Metrics = dict[str, list[tuple[dict[str, str], float]]]


def scrape_metrics(url: str) -> Metrics:
    """A Prometheus endpoint's samples by name, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def metric_value(metrics: Metrics, name: str) -> float:
    """The one sample of ``name``."""
    ((_, v),) = metrics[name]
    return v


def only_record_in(workspace: Path) -> RunRecord:
    """The one run record of a workspace (a test made exactly one run there)."""
    runs = (workspace / "runs").iterdir()  # not ".creating-*": a record still being made
    (path,) = [p for p in runs if not p.name.startswith(".") and (p / "run.json").exists()]
    return RunRecord(path)


def step_losses(record: RunRecord, attempt: int | None = None) -> dict[int, float]:
    """Each step's loss; without ``attempt``, from the last attempt that ran the step."""
    return {
        int(e["step"]): float(e["loss"])
        for e in record.events("step")
        if attempt is None or e.get("attempt") == attempt
    }


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def chromium_driver(
    profile: Path, *, window: str = "1200,900", performance_log: bool = False
) -> Any:
    """Headless Chromium through selenium, with no network of its own.

    Skips when Chromium or its driver is missing, but fails under CI, which installs them.
    """
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        message = f"{', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", f"--window-size={window}",
    ):  # fmt: skip
        options.add_argument(arg)
    logs = {"browser": "ALL", "performance": "ALL"} if performance_log else {"browser": "ALL"}
    options.set_capability("goog:loggingPrefs", logs)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def poll() -> Callable[..., Any]:
    return wait_for


def run_taking_commands(key: str = "run_refs") -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every command of the CLI that takes a run, as its words and its run arguments, read
    from the parser's own declaration (``add_run_argument``; ``key="run_refs_here"``: those
    looked up in the current workspace alone). A command added tomorrow is in the list."""
    import argparse

    from acceptrun.cli.main import build_parser

    def walk(
        parser: argparse.ArgumentParser, words: tuple[str, ...]
    ) -> Iterator[tuple[tuple[str, ...], tuple[str, ...]]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, (*words, name))
        refs = parser.get_default(key)
        if refs:
            yield words, tuple(refs)

    return list(walk(build_parser(), ()))
