"""A real S3-compatible server on loopback for tests: moto_server as a subprocess.

``s3`` (session) starts one server and one bucket for the whole run; ``s3_restartable``
(per test) owns a server that the test can stop and start again on the same port, to
play an outage. moto keeps its state in memory, so a restarted server comes back empty:
:meth:`S3Server.start` creates the bucket again, and an outage test may only rely on
what was written after the restart.

Every request the server handles is logged in order (moto's recorder), so a test can
check the order of writes as the server saw them: :meth:`S3Server.requests`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

MOTO_SERVER = Path(sys.executable).parent / "moto_server"
BUCKET = "acceptrun-test"
DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """One moto_server process on 127.0.0.1:``port``; stop() and start() keep the port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.recording = workdir / "requests.jsonl"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options, as a user would pass them for an S3-compatible endpoint."""
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    def start(self, timeout: float = 20.0) -> None:
        env = {**os.environ, **DUMMY_AWS}
        env.update(MOTO_ENABLE_RECORDING="true", MOTO_RECORDER_FILEPATH=str(self.recording))
        log = open(self.workdir / f"moto-{self.port}.log", "ab")  # noqa: SIM115 - child owns it
        with log:
            self.proc = subprocess.Popen(
                [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.workdir / f"moto-{self.port}.log").read_text(errors="replace")
                pytest.fail(f"moto_server on port {self.port} did not start:\n{log_text[-2000:]}")
            time.sleep(0.05)
        self.client().create_bucket(Bucket=BUCKET)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def requests(self) -> list[tuple[str, str]]:
        """``(method, key)`` of every request the server handled, in order."""
        out = []
        with open(self.recording) as f:
            for line in f:
                entry = json.loads(line)
                path = unquote(urlsplit(entry["url"]).path).lstrip("/")
                out.append((entry["method"], path))
        return out

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1):
                return True
        except (urllib.error.URLError, OSError):
            return False


@contextlib.contextmanager
def dummy_aws_env() -> Iterator[None]:
    """Dummy credentials, so nothing reaches for a developer's real AWS profile."""
    saved = dict(os.environ)
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(name, None)
    os.environ.update(DUMMY_AWS)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A moto S3 server for the session: ``{endpoint_url, storage_options, bucket, server}``."""
    with dummy_aws_env():
        server = S3Server(tmp_path_factory.mktemp("s3"))
        server.start()
        try:
            yield {
                "endpoint_url": server.endpoint_url,
                "storage_options": server.storage_options,
                "bucket": BUCKET,
                "server": server,
            }
        finally:
            server.stop()


@pytest.fixture
def s3_restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A server of this test's own, to stop and start again on the same port."""
    with dummy_aws_env():
        server = S3Server(tmp_path_factory.mktemp("s3-restartable"))
        server.start()
        try:
            yield server
        finally:
            server.stop()
