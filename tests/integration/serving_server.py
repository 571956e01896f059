"""A small HTTP server for the serving tests and bench (standard library, loopback only).

    python serving_server.py PORT [--delay S] [--error-every N] [--never-ready]
                                  [--stall-every S --stall S] [--tokens N] [--exit-after N]
                                  [--kill-after N] [--count-file PATH]

- ``GET /health``: 200 (503 forever with --never-ready, after a line on stderr);
- ``POST /v1/completions``: JSON, or with ``"stream": true`` in the body server-sent
  events, one ``data:`` chunk per token and ``data: [DONE]``;
- ``--delay``: seconds each answer takes; ``--error-every N``: every Nth request is a 500;
  ``--stall-every S --stall D``: the whole server stops answering for D seconds every S
  seconds (requests that arrive meanwhile wait); ``--exit-after N``: the process exits
  with status 3 at the Nth request (a crash during the load); ``--kill-after N``: in the
  first attempt only (``ACCEPTRUN_ATTEMPT`` 1), the process sends itself SIGKILL at the Nth
  request, before answering it; a restarted server serves;
- ``--count-file PATH``: the truth the tests check the record against, ``{"ATTEMPT":
  {"received": N, "answered": M}}`` for every attempt, rewritten (atomically) as each
  request is received and answered; requests are then answered one at a time, so that no
  answer is on the wire uncounted when the server dies.

Each response goes out in one write: a header and a body in two small writes would
meet Nagle's algorithm and the client's delayed ACK (40 ms per request).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--error-every", type=int, default=0)
    ap.add_argument("--never-ready", action="store_true")
    ap.add_argument("--stall-every", type=float, default=0.0)
    ap.add_argument("--stall", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--exit-after", type=int, default=0)  # crash at the Nth request
    ap.add_argument("--kill-after", type=int, default=0)  # SIGKILL at the Nth, attempt 1
    ap.add_argument("--count-file", default="")
    args = ap.parse_args()
    count = [0]
    lock = threading.Lock()
    t0 = time.monotonic()
    attempt = os.environ.get("ACCEPTRUN_ATTEMPT", "1")
    truth = {"received": 0, "answered": 0}
    answering = threading.Lock()  # with --count-file: one request at a time

    def write_counts() -> None:
        if not args.count_file:
            return
        try:
            with open(args.count_file, encoding="utf-8") as f:
                every = json.load(f)
        except FileNotFoundError:
            every = {}
        every[attempt] = dict(truth)
        tmp = f"{args.count_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(every, f)
        os.replace(tmp, args.count_file)

    def stall_wait() -> None:
        if args.stall_every <= 0:
            return
        phase = (time.monotonic() - t0) % args.stall_every
        if phase >= args.stall_every - args.stall:  # in the stall window: wait it out
            time.sleep(args.stall_every - phase)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            head = (
                f"HTTP/1.1 {status} {'OK' if status < 400 else 'ERR'}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            self.wfile.write(head.encode() + body)

        def do_GET(self) -> None:
            if args.never_ready:
                self._send(503, b'{"status": "loading"}')
            else:
                self._send(200, b'{"status": "ok"}')

        def do_POST(self) -> None:
            if not args.count_file:
                self._post()
                return
            with answering:
                truth["received"] += 1
                write_counts()
                self._post()
                self.wfile.flush()
                truth["answered"] += 1
                write_counts()

        def _post(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                count[0] += 1
                n = count[0]
            if args.exit_after and n >= args.exit_after:
                print(f"fatal: worker crashed at request {n}", file=sys.stderr, flush=True)
                os._exit(3)
            if args.kill_after and n >= args.kill_after and attempt == "1":
                print(f"fatal: killed at request {n}", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            stall_wait()
            if args.delay:
                time.sleep(args.delay)
            if args.error_every and n % args.error_every == 0:
                self._send(500, b'{"error": "injected failure"}')
                return
            stream = b'"stream": true' in body or b'"stream":true' in body
            if not stream:
                self._send(200, json.dumps({"choices": [{"text": "x" * args.tokens}]}).encode())
                return
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            self.wfile.write(head)
            for i in range(args.tokens):
                data = f"data: {json.dumps({'choices': [{'text': str(i)}]})}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.002)
            done = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

    if args.count_file:
        # The supervisor's SIGTERM after the load can come while the last answer's count is
        # being written: leave only once no answer is between the wire and the file.
        def on_term(signum: int, frame: object) -> None:
            def leave() -> None:
                with answering:
                    os._exit(143)

            threading.Thread(target=leave, daemon=True).start()

        signal.signal(signal.SIGTERM, on_term)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    if args.never_ready:
        print(
            "loading weights: RuntimeError: weights file model.bin is truncated",
            file=sys.stderr,
            flush=True,
        )
    print(f"serving on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
