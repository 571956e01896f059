"""What a restart's re-verification costs (capture/reverify.py), against preflight's full hash.

Writes a data set of ``--files`` files of ``--file-kb`` KiB, snapshots it, then times:

- ``preflight``: the full verification preflight does before attempt 1 (every byte hashed);
- ``restart, unchanged``: a restart's check with the stat signatures preflight took
  (one ``stat`` per file, nothing read);
- ``restart, one changed``: the same after one file was rewritten (that file hashed again);
- ``packages``: the probe subprocess that lists the job interpreter's packages
  (``_probe.py --packages``, this venv's interpreter), median of ``--repeats``.

    python bench/reverify.py                      # 500 files of 2 MiB (1 GiB)
    python bench/reverify.py --files 20 --file-kb 64 --repeats 1   # a smoke run

The files are written just before they are timed, so the page cache holds them: the
preflight figure is the hash's speed, a lower bound of a cold disk's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from acceptrun.capture import data as datamod
from acceptrun.capture.reverify import list_packages


def _write(root: Path, files: int, size: int) -> None:
    block = os.urandom(size)
    for i in range(files):
        (root / f"shard-{i:05d}.bin").write_bytes(block[i % 256 :] + block[: i % 256])


def _timed(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500, help="data files (500)")
    parser.add_argument("--file-kb", type=int, default=2048, help="KiB per file (2048)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per figure, median (5)")
    parser.add_argument("--dir", type=Path, help="where the data goes (a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "data"
        root.mkdir()
        _write(root, args.files, args.file_kb * 1024)
        manifest = datamod.snapshot(root)
        # As a data set is in practice: written long before the run, so every signature
        # counts as settled (datamod.SETTLE_NS).
        later = time.time_ns() + datamod.SETTLE_NS + 10**9
        stats = datamod.stat_signatures(root, now_ns=later)
        assert stats is not None and len(stats) == args.files
        full = _timed(lambda: datamod.verify(root, manifest), args.repeats)
        same = _timed(lambda: datamod.verify(root, manifest, trust=stats), args.repeats)
        (root / "shard-00000.bin").write_bytes(b"\0" * args.file_kb * 1024)
        result = datamod.verify(root, manifest, trust=stats)
        assert not result.ok and result.hashed == 1
        one = _timed(lambda: datamod.verify(root, manifest, trust=stats), args.repeats)
    env = dict(os.environ)
    packages = len(list_packages(sys.executable, env))
    probe = _timed(lambda: list_packages(sys.executable, env), args.repeats)
    mib = args.files * args.file_kb / 1024
    print(f"data: {args.files} files, {mib:.0f} MiB; packages: {packages} in {sys.executable}")
    print(f"{'check':<24}{'seconds':>10}{'ms per file':>14}")
    for name, seconds in (
        ("preflight (full hash)", full),
        ("restart, unchanged", same),
        ("restart, one changed", one),
    ):
        print(f"{name:<24}{seconds:>10.4f}{1000 * seconds / args.files:>14.4f}")
    print(f"{'packages (probe)':<24}{probe:>10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
