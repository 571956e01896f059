"""How long does a support bundle take, and how large is it, for a long run's record?

    python bench/bundle.py [--events 200000] [--samples 50000] [--log-mb 32] [--attempts 3]

Builds a run record of the given size in a scratch workspace (``--events`` events, a
telemetry of ``--samples`` host and GPU samples, ``--attempts`` attempts whose stdout and
stderr hold ``--log-mb`` MB each, with a planted token and a URL with credentials on
every 1000th line, and the token in the spec's ``[env]``), then times ``acceptrun
bundle`` on it without and with ``--include-logs``: seconds, the record's and the
archive's size, and the redactor's throughput over what it read (MB/s). Each archive is
opened again and searched for the planted secrets: a bundle that leaks one fails the
bench (exit 1).
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
import time
from pathlib import Path

from acceptrun._util.redact import forget_learned
from acceptrun.record.workspace import RunRecord, Workspace
from acceptrun.report.bundle import build_bundle

TOKEN = "hf_BenchPlantedToken8675309"
PASSWORD = "bench-planted-pw-5150"
SECRETS = (TOKEN, PASSWORD)
SPEC = f"""name = "bench-bundle"
command = ["python", "train.py"]
[env]
HF_TOKEN = "{TOKEN}"
[cost]
price_per_hour = 3.78
"""


def make_record(
    root: Path, *, events: int, samples: int, log_mb: float, attempts: int
) -> RunRecord:
    ws = Workspace.create(root / ".acceptrun")
    rec = ws.create_run("bench-bundle", spec_text=SPEC, state={"status": "finished"})
    t0 = 1_800_000_000.0
    with rec.events_path.open("w") as f:
        f.write(json.dumps({"t": t0, "kind": "run_start"}) + "\n")
        for i in range(events):
            f.write(json.dumps({"t": t0 + 1 + i * 0.01, "kind": "heartbeat", "attempt": 1 + i % attempts,
                                "phase": "step", "note": f"event {i}"}) + "\n")  # fmt: skip
        for a in range(1, attempts + 1):
            f.write(json.dumps({"t": t0 + 2 + a, "kind": "attempt_start", "attempt": a}) + "\n")
            f.write(json.dumps({"t": t0 + 3 + a, "kind": "attempt_exit", "attempt": a,
                                "outcome": "failed" if a < attempts else "success",
                                "class": "preempted" if a < attempts else "success",
                                "evidence": ["killed by SIGTERM"]}) + "\n")  # fmt: skip
    with rec.telemetry_path.open("w") as f:
        for i in range(samples):
            kind = "gpu" if i % 2 else "host"
            f.write(json.dumps({"t": t0 + i, "kind": kind, "attempt": 1, "index": 0,
                                "util_pct": 97.0, "mem_used": 70 << 30, "power_w": 650.0}) + "\n")  # fmt: skip
    line = "step 123 loss 2.345 lr 3e-4 tokens/s 51234 ok\n"
    leak = f"loading https://alice:{PASSWORD}@data.example.com with {TOKEN}\n"
    block = (line * 999 + leak).encode()
    for a in range(1, attempts + 1):
        d = rec.attempt_dir(a)
        d.mkdir(parents=True)
        (d / "exit.json").write_text(json.dumps({"attempt": a, "class": "preempted"}))
        for name in ("stdout.log", "stderr.log"):
            with (d / name).open("wb") as f:
                written = 0
                while written < log_mb * 1e6:
                    f.write(block)
                    written += len(block)
    return rec


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def leaks(path: Path) -> list[str]:
    found = []
    with tarfile.open(path, "r:gz") as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            data = f.read() if f else b""
            found += [f"{s} in {m.name}" for s in SECRETS if s.encode() in data]
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument(
        "--log-mb", type=float, default=32.0, help="MB of stdout and of stderr per attempt"
    )
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--root", type=Path, default=None, help="scratch folder (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        root = Path(tmp)
        rec = make_record(root, events=args.events, samples=args.samples,
                          log_mb=args.log_mb, attempts=args.attempts)  # fmt: skip
        record_mb = _size(rec.path) / 1e6
        logs_mb = sum(_size(rec.attempt_dir(a)) for a in range(1, args.attempts + 1)) / 1e6
        print(f"record: {record_mb:.1f} MB ({args.events} events, {args.samples} samples, "
              f"{args.attempts} attempts with {logs_mb:.1f} MB of logs)")  # fmt: skip
        bad = []
        for include_logs in (False, True):
            forget_learned()
            out = root / f"bundle-{int(include_logs)}.tar.gz"
            start = time.perf_counter()
            bundle = build_bundle(rec, out, include_logs=include_logs)
            seconds = time.perf_counter() - start
            read_mb = sum(f["bytes"] for f in bundle.files) / 1e6
            print(
                f"bundle{' --include-logs' if include_logs else '':<15} {seconds:7.2f} s  "
                f"{len(bundle.files):3d} files, {read_mb:7.1f} MB packed -> {bundle.bytes / 1e6:6.2f} MB "
                f"archive, {read_mb / seconds:6.1f} MB/s"
            )
            bad += leaks(out)
        if bad:
            print("LEAKED: " + "; ".join(bad))
            return 1
        print("no planted secret in either archive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
