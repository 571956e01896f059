"""Real receivers on loopback, and scripts that make conditions, for the notification tests
and bench/notify.py.

:class:`WebhookReceiver` is an HTTP server that records every body POSTed to it (and can
answer 500 to the first ``fail_first`` requests, so retries are exercised);
:class:`SmtpReceiver` is a real SMTP server (aiosmtpd) with STARTTLS required before a
login, a self-signed certificate made with openssl, and one user.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = [
    "CORRUPTS",
    "MIRROR_LAGS",
    "SmtpReceiver",
    "WebhookReceiver",
    "release",
    "watchdog_of",
]

# Scripts that make a condition, for the tests and the bench alike.

# A checkpoint whose files are damaged before the attempt dies: the restart sets it aside.
CORRUPTS = """
import os, signal, acceptrun

class Counter:
    def __init__(self): self.n = 0
    def state_dict(self): return {"n": self.n}
    def load_state_dict(self, state): self.n = state["n"]

counter = Counter()
run = acceptrun.init()
start = run.restore(counter=counter)
for step in run.steps(start, 8):
    counter.n += 1
    run.log(step, loss=1.0)
    if step in (2, 4):
        run.checkpoint(step, block=True)
    if step == 5 and run.attempt == 1:  # flip a byte of every file of step 4, then die
        where = os.path.join(os.environ["ACCEPTRUN_CHECKPOINT_DIR"], "step-4")
        for name in os.listdir(where):
            if name != "MANIFEST.json":
                path = os.path.join(where, name)
                data = bytearray(open(path, "rb").read()); data[-1] ^= 1
                open(path, "wb").write(bytes(data))
        os.kill(os.getpid(), signal.SIGKILL)
"""

# The mirror's folder becomes a file before the save of step 2, so its upload fails and
# is retried; the script goes on once whoever received the message of that condition has
# opened the FIFO $MIRROR_GO (see release), then gives the mirror back: the retry catches
# up. A rendezvous on the FIFO: no polling, no guess of how long a delivery takes.
MIRROR_LAGS = """
import os, pathlib, shutil
import acceptrun

class Counter:
    def state_dict(self): return {"n": 1}
    def load_state_dict(self, state): pass

run = acceptrun.init()
run.restore(counter=Counter())
root = pathlib.Path(os.environ["MIRROR"])
events = pathlib.Path(os.environ["ACCEPTRUN_RUN_DIR"]) / "events.jsonl"
shutil.rmtree(root, ignore_errors=True)
root.write_text("a file where the mirror's folder should be")
for step in run.steps(0, 6):
    run.log(step, loss=1.0)
    if step == 2:
        run.checkpoint(step, block=True)
        with open(os.environ["MIRROR_GO"]) as go:  # a FIFO: blocks until release() opens it
            go.read()
        root.unlink()
        root.mkdir()
"""


def watchdog_of(pid: int) -> bool:
    """Whether the supervisor ``pid`` has started its attempt's watchdog (which ends the
    workload when the supervisor dies): the moment a SIGKILL leaves no orphan."""
    import psutil

    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if "_watchdog.py" in " ".join(child.cmdline()):
                return True
    return False


def release(fifo: Path) -> None:
    """Let a script blocked reading ``fifo`` go on, from a thread of its own: opening a
    FIFO for writing waits for its reader, and the caller (a receiver answering a POST)
    must not."""

    def open_it() -> None:
        with open(fifo, "w"):
            pass

    threading.Thread(target=open_it, name="release-fifo", daemon=True).start()


class WebhookReceiver:
    """A loopback HTTP server that keeps each POST: (arrival time, path, parsed JSON body)."""

    def __init__(
        self,
        *,
        fail_first: int = 0,
        hold: bool = False,
        on_post: Callable[[Any], None] | None = None,
    ) -> None:
        self.received: list[tuple[float, str, Any]] = []
        self.raw: list[bytes] = []  # each body as it arrived, before parsing
        self.failed = 0
        self.fail_first = fail_first
        # hold: keep each body, then answer nothing until the receiver is closed (a
        # receiver that hangs); each request is served in its own thread.
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.secret_path = f"/hooks/{secrets.token_hex(12)}"  # the URL's secret part
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with lock:
                    outer.raw.append(body)
                    if outer.failed < outer.fail_first:
                        outer.failed += 1
                        self.send_response(500)
                        self.end_headers()
                        return
                    outer.received.append((time.time(), self.path, json.loads(body)))
                if on_post is not None:
                    on_post(outer.received[-1][2])
                outer.release.wait()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.secret_path}"

    def bodies(self, event: str | None = None) -> list[Any]:
        return [
            b for _, _, b in self.received
            if event is None or b.get("event") == event or event in str(b.get("text"))
        ]  # fmt: skip

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver:
    """aiosmtpd on loopback: STARTTLS required, then a login as ``user`` / ``password``."""

    def __init__(self, cert_dir: Path, *, user: str = "runner", password: str = "") -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        self.user = user
        self.password = password or secrets.token_hex(10)
        self.cert = cert_dir / "cert.pem"
        key = cert_dir / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(self.cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, key)
        self.messages: list[tuple[float, Any]] = []
        self.raw: list[bytes] = []  # each message as it arrived, MIME-encoded
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                import email
                import email.policy

                outer.raw.append(envelope.content)
                parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
                outer.messages.append((time.time(), parsed))
                return "250 OK"

        def authenticate(server: Any, session: Any, envelope: Any, mechanism: str,
                         auth_data: Any) -> AuthResult:  # fmt: skip
            ok = (
                isinstance(auth_data, LoginPassword)
                and auth_data.login.decode() == outer.user
                and auth_data.password.decode() == outer.password
            )
            return AuthResult(success=ok)

        with socket.socket() as probe:  # a free port: the Controller checks it by connecting
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.controller = Controller(
            Handler(), hostname="127.0.0.1", port=self.port, tls_context=context, require_starttls=True,
            authenticator=authenticate, auth_required=True, auth_require_tls=True,
        )  # fmt: skip

    def __enter__(self) -> SmtpReceiver:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()
