"""The one git runner, against real git: answers, failures, a missing git, a hang, a prompt."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from acceptrun._util.git import git, run_git
from acceptrun.errors import GitError, UserError

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(autouse=True)
def _no_user_git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No credential helper or alias from the machine's config may answer for git here.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GIT_ASKPASS", raising=False)
    monkeypatch.delenv("SSH_ASKPASS", raising=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    (root / "train.py").write_text("print('hi')\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "-C", str(root), "add", "train.py"], check=True)
    subprocess.run(["git", "-C", str(root), *env, "commit", "-q", "-m", "first"], check=True)
    return root


def test_answers_without_the_trailing_newline(repo: Path) -> None:
    assert git(repo, "rev-parse", "--show-toplevel") == str(repo.resolve())
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    assert git(repo, "status", "--porcelain") == ""
    (repo / "train.py").write_text("print('changed')\n")
    assert git(repo, "status", "--porcelain") == " M train.py"  # the leading space stays


def test_a_failing_command_names_itself_the_checkout_and_gits_reason(repo: Path) -> None:
    with pytest.raises(GitError) as info:
        git(repo, "cat-file", "-t", "0" * 40)
    message = str(info.value)
    assert message.startswith(f"`git cat-file -t {'0' * 40}` failed in {repo}: ")
    assert "fatal:" in message
    assert isinstance(info.value, UserError)  # the CLI exits 2 with the message
    assert git(repo, "cat-file", "-t", "0" * 40, check=False) == ""
    res = run_git(repo, "cat-file", "-t", "0" * 40)
    assert res.returncode != 0 and res.stdout == "" and "fatal:" in res.stderr


def test_outside_a_checkout_the_error_is_gits_own(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GitError, match="not a git repository"):
        git(plain, "rev-parse", "--show-toplevel")


def test_output_can_go_straight_to_a_file(repo: Path, tmp_path: Path) -> None:
    (repo / "train.py").write_text("print('changed')\n")
    out = tmp_path / "git.diff"
    with open(out, "wb") as f:
        assert git(repo, "diff", "--no-color", stdout=f) == ""
    assert "+print('changed')" in out.read_text()


def test_git_missing_from_path_says_so_and_how_to_fix(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(GitError, match=r"^git is not installed or not on PATH .*install git"):
        git(repo, "status")


def test_a_missing_checkout_names_the_directory(tmp_path: Path) -> None:
    gone = tmp_path / "moved-away"
    with pytest.raises(GitError, match=f"could not run git in {gone}"):
        git(gone, "status")


def test_a_hung_command_is_killed_with_what_it_started(repo: Path) -> None:
    # A shell alias stands for a stuck credential helper: git starts it and waits. The
    # sleep it starts holds git's stdout; only killing the whole group frees the caller.
    started = time.monotonic()
    with pytest.raises(GitError, match=r"^`git -c` timed out after 1 s in "):
        git(repo, "-c", "alias.stuck=!sleep 600", "stuck", timeout=1.0)
    assert time.monotonic() - started < 300  # far below the 600 s sleep


class _AskForPassword(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="private"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def password_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AskForPassword)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/private.git"
    finally:
        server.shutdown()
        server.server_close()


def test_a_remote_that_wants_a_password_fails_instead_of_prompting(
    repo: Path, password_server: str
) -> None:
    # Without GIT_TERMINAL_PROMPT=0 git would ask for a username on the terminal and
    # wait for ever; here it must give up at once with git's reason.
    with pytest.raises(GitError) as info:
        git(repo, "ls-remote", password_server, timeout=120.0)
    assert "timed out" not in str(info.value)
    assert "terminal prompts disabled" in str(info.value) or "Authentication" in str(info.value)
