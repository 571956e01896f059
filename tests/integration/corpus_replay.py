"""A script that prints a corpus shape's recorded log and saves its own checkpoints.

Usage: ``corpus_replay.py SHAPE.toml --saves I,J,... [--stop-after L] [--resume]``

It prints the shape's log (tests/corpus/shapes/NAME.log) piece by piece, each ending as
recorded (a tqdm bar's ``\\r`` too), flushed. After each line index in ``--saves`` it
writes ``out/ckpt.json`` holding the true step of the last step line printed, atomically
(a temp file renamed over it, as ``torch.save`` to a temp name then ``os.replace`` does).
With ``--resume`` it reads that file and prints again from the shape's first resume line
after that step's line (``resume_lines``), as a script resuming from its epoch save.
With ``--stop-after L`` attempt 1 waits after printing line L, for the injected kill.

The pace is the test's: before a save it waits until acceptrun has read the line it
printed last (in the attempt's step log), and after it until the save is captured (one more watched ``checkpoint_commit``), so each capture's
true step and the kill's place between two saves are known exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import struct
import sys
import time
import tomllib
from pathlib import Path

_PIECE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_STRUCT = {"i8": "q", "f8": "d", "f4": "f", "us4": "I"}  # steplog.py's codecs
_GUARD_S = 60.0


def pieces(log: Path) -> list[bytes]:
    """The log's lines with their endings, indexed as the corpus's ``truth`` counts them."""
    return [p for p in _PIECE.findall(log.read_bytes()) if p.strip(b"\r\n")]


def _events() -> list[dict[str, object]]:
    path = Path(os.environ["ACCEPTRUN_RUN_DIR"]) / "events.jsonl"
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line still being written
            continue
    return out


def _wait(what: str, done: object) -> None:
    deadline = time.monotonic() + _GUARD_S
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            sys.exit(f"corpus_replay: gave up waiting for {what}")
        time.sleep(0.02)


def _commits() -> int:
    return sum(
        1
        for e in _events()
        if e.get("kind") == "checkpoint_commit" and e.get("source") == "watched"
    )


def _read(step: int, attempt: int) -> bool:
    """Whether acceptrun's step log holds ``step`` for this attempt yet.

    The step log's layout is documented in src/acceptrun/record/steplog.py (segments of
    ``ACSTEP1\\n``, a uint32 header length, a JSON header naming the columns, then
    fixed-width little-endian records); read here without importing acceptrun, so the
    script stays a black box to it.
    """
    folder = Path(os.environ["ACCEPTRUN_RUN_DIR"]) / "attempts" / str(attempt) / "steps"
    for seg in sorted(folder.glob("*.steps")) if folder.is_dir() else []:
        data = seg.read_bytes()
        if len(data) < 12 or not data.startswith(b"ACSTEP1\n"):
            continue
        (n,) = struct.unpack("<I", data[8:12])
        if len(data) < 12 + n:
            continue
        columns = json.loads(data[12 : 12 + n])["columns"]
        packer = struct.Struct("<" + "".join(_STRUCT[c] for _n, c in columns))
        at = [name for name, _c in columns].index("step")
        body = data[12 + n :]
        whole = len(body) // packer.size * packer.size
        if any(rec[at] == step for rec in packer.iter_unpack(body[:whole])):
            return True
    return False


def save(step: int, attempt: int) -> None:
    # At once after the line is read: acceptrun dates a capture by the lines its tee had
    # read before the file's mtime, however soon after them the save comes. (Waiting for
    # the read makes that order certain; a real script's save that beats the tee's read
    # of its own line, on a starved machine, is dated one line earlier, as an estimate.)
    _wait(f"step {step} to be read", lambda: _read(step, attempt))
    before = _commits()
    os.makedirs("out", exist_ok=True)
    Path("out/ckpt.tmp").write_text(json.dumps({"step": step}))
    os.replace("out/ckpt.tmp", "out/ckpt.json")
    _wait(f"the save at step {step} to be captured", lambda: _commits() > before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", type=Path)
    ap.add_argument("--saves", required=True)
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    meta = tomllib.loads(args.shape.read_text())
    lines = pieces(args.shape.with_suffix(".log"))
    step_of = {line: step for line, step, _loss in meta["truth"]}
    saves = {int(i) for i in args.saves.split(",") if i}
    attempt = int(os.environ.get("ACCEPTRUN_ATTEMPT", "1"))
    start = 0
    if args.resume:
        saved = json.loads(Path("out/ckpt.json").read_text())["step"]
        line = next(i for i, s in step_of.items() if s == saved)
        start = min(r for r in meta["resume_lines"] if r > line)
    last = None
    for i in range(start, len(lines)):
        sys.stdout.buffer.write(lines[i])
        sys.stdout.buffer.flush()
        last = step_of.get(i, last)
        if i in saves and last is not None:
            save(last, attempt)
        if i == args.stop_after and attempt == 1:
            signal.pause()  # the injected SIGKILL ends this attempt: no wait on the clock
            sys.exit("corpus_replay: attempt was woken, not killed")


if __name__ == "__main__":
    main()
