"""A detached child's output into its log, line by line through the redactor.

A queued job's ``acceptrun run`` and a resume the board starts run in sessions of their
own and outlive whoever started them, so a thread of the starter cannot redact what they
print: it would die with the starter, and the child would then write into a closed pipe.
The pump is a small process of its own session instead: the child's stdout and stderr go
to the pump's stdin, the pump appends each line to the log through
:func:`acceptrun._util.egress.redact_lines` (a key block whole, each other line alone), and
ends at end of file, when the last writer (the child and its own children) is gone.

A line longer than :data:`LINE_MAX` is redacted in pieces of that size (a secret across the
cut is not seen whole there; a line that long is rarely a credential's context).

    pump = start(Path("queue/logs/job-3.log"))
    subprocess.Popen(argv, stdout=pump.stdin, stderr=subprocess.STDOUT, ...)
    pump.stdin.close()  # the child holds the pipe now
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from acceptrun._util.egress import redact_lines

__all__ = ["LINE_MAX", "main", "start"]

LINE_MAX = 64 * 1024  # bytes of one line redacted at once


def start(log: Path) -> subprocess.Popen[bytes]:
    """A pump appending to ``log``: give its ``stdin`` as the child's stdout, then close it."""
    return subprocess.Popen(
        [sys.executable, "-m", "acceptrun._util.logpump", str(log)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    """Append stdin to the file ``argv[0]``, each line redacted, until end of file."""
    if len(argv) != 1:
        print("usage: python -m acceptrun._util.logpump LOG", file=sys.stderr)
        return 2
    fd = os.open(argv[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    read = sys.stdin.buffer.readline
    lines = (line.decode("utf-8", errors="replace") for line in iter(lambda: read(LINE_MAX), b""))
    with os.fdopen(fd, "ab", buffering=0) as out:
        for text in redact_lines(lines):  # a key block is held to its END line, then redacted
            out.write(text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
