"""A cloud metadata service on loopback that speaks each provider's preemption notice.

The paths, headers and bodies are those the providers document (supervisor/notice.py
cites them): AWS IMDSv2 (a token from ``PUT /latest/api/token``, required on
``GET /latest/meta-data/spot/instance-action``: 404 until the notice, then its JSON),
Google Cloud (``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor:
Google``: ``FALSE``, then ``TRUE``) and Azure (``GET /metadata/scheduledevents`` with
``Metadata: true``: no events, then a ``Preempt``). A request without the provider's
header is refused as the real services refuse it. :meth:`MetadataServer.give_notice`
turns the notice on; ``looks`` counts the notice's reads.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "AQAEAloopbacktoken=="
NOTICE_S = 120.0  # AWS's two minutes; GCP and Azure give 30 s (the notice module's own)


class MetadataServer:
    """``with MetadataServer() as md: md.url ... md.give_notice()``."""

    def __init__(self) -> None:
        self.noticed_at: float | None = None
        self.looks = 0
        self.refused = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def give_notice(self) -> None:
        self.noticed_at = time.time()

    def __enter__(self) -> MetadataServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes = b"", kind: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                if self.path == "/latest/api/token" and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    self._send(200, TOKEN.encode())
                else:
                    server.refused += 1
                    self._send(400)

            def do_GET(self) -> None:
                at = server.noticed_at
                if self.path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                        server.refused += 1
                        return self._send(401)
                    server.looks += 1
                    if at is None:
                        return self._send(404)
                    when = datetime.fromtimestamp(at + NOTICE_S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    body = json.dumps({"action": "terminate", "time": when}).encode()
                    return self._send(200, body, "application/json")
                if self.path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        server.refused += 1
                        return self._send(403)
                    server.looks += 1
                    return self._send(200, b"FALSE" if at is None else b"TRUE")
                if self.path.startswith("/metadata/scheduledevents?api-version="):
                    if self.headers.get("Metadata") != "true":
                        server.refused += 1
                        return self._send(400)
                    server.looks += 1
                    events = [] if at is None else [{
                        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                        "EventType": "Preempt", "ResourceType": "VirtualMachine",
                        "Resources": ["vm-0"], "EventStatus": "Scheduled",
                        "NotBefore": formatdate(at + 30.0, usegmt=True),
                        "Description": "", "EventSource": "Platform", "DurationInSeconds": -1,
                    }]  # fmt: skip
                    body = json.dumps({"DocumentIncarnation": 1, "Events": events}).encode()
                    return self._send(200, body, "application/json")
                return self._send(404)

        return Handler
