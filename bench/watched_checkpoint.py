"""Watched-checkpoint benchmark: capturing a script's own checkpoint file vs a raw copy.

    .venv/bin/python bench/watched_checkpoint.py [--mb 500] [--repeats 3] [--dir DIR]

Writes one --mb MB file of random bytes (what a torch.save of random tensors looks like
to a copy: incompressible), then, --repeats times each, in alternation:

- capture: ``acceptrun.checkpoint.files.capture`` into a fresh CheckpointStore: chunked
  copy, xxh3 hash of every byte while written, fsync of the file and directories,
  MANIFEST.json, rename, LATEST (what the supervisor's watcher does per checkpoint);
- raw copy: ``shutil.copyfile`` + fsync of the copy (the floor: same bytes, same disk);
- put back: ``put_back`` of the captured copy to the watched path (hash-checked copy,
  fsync, rename), what a restart pays before the command starts.

Prints min / median / max seconds and MB/s of each, the capture/raw ratio of the
medians, and the load average (1, 5, 15 min) before and after: on a shared machine
other work moves these figures. Both copies read the source from the page cache (it
was just written); neither drops caches.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from acceptrun.checkpoint.files import capture, put_back
from acceptrun.checkpoint.store import CheckpointStore


def raw_copy(src: Path, dst: Path) -> float:
    t0 = time.perf_counter()
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def write_source(path: Path, mb: float) -> int:
    size = int(mb * 1e6)
    chunk = 8 << 20
    with path.open("wb") as f:
        left = size
        while left > 0:
            f.write(os.urandom(min(chunk, left)))
            left -= chunk
        f.flush()
        os.fsync(f.fileno())
    return size


def line(name: str, seconds: list[float], size: int) -> str:
    lo, med, hi = min(seconds), statistics.median(seconds), max(seconds)
    mbps = [size / 1e6 / s for s in (hi, med, lo)]
    return (
        f"{name:<10} s min {lo:7.3f}  median {med:7.3f}  max {hi:7.3f}   "
        f"MB/s min {mbps[0]:7.1f}  median {mbps[1]:7.1f}  max {mbps[2]:7.1f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=500.0, help="checkpoint size in MB (1e6 bytes)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = p.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="acceptrun-bench-") as tmp:
        root = Path(tmp)
        src = root / "out" / "ckpt.pt"
        src.parent.mkdir()
        size = write_source(src, args.mb)
        cap_s, raw_s, back_s = [], [], []
        for i in range(args.repeats):
            store = CheckpointStore(root / f"store-{i}", keep_last=2)
            t0 = time.perf_counter()
            info, _ = capture(store, 100 + i, {"out/ckpt.pt": src})
            cap_s.append(time.perf_counter() - t0)
            dst = root / f"raw-{i}.bin"
            raw_s.append(raw_copy(src, dst))
            dst.unlink()
            t0 = time.perf_counter()
            put_back(info)
            back_s.append(time.perf_counter() - t0)
            shutil.rmtree(store.root)
    load_after = os.getloadavg()
    print(
        f"checkpoint file: {size / 1e6:.0f} MB, {args.repeats} repeats, in {args.dir or tempfile.gettempdir()}"
    )
    print(line("capture", cap_s, size))
    print(line("raw copy", raw_s, size))
    print(line("put back", back_s, size))
    ratio = statistics.median(cap_s) / statistics.median(raw_s)
    print(f"capture / raw copy (medians): {ratio:.2f}x the time")
    fmt = ", ".join
    print(
        f"load average before: {fmt(f'{x:.2f}' for x in load_before)}; "
        f"after: {fmt(f'{x:.2f}' for x in load_after)}; {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
