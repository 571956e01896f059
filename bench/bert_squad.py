"""BERT-large / SQuAD training throughput per configuration, as JSON lines.

    python bench/bert_squad.py                       # GPU: bert-large, seq 384
    python bench/bert_squad.py --tiny --device cpu   # the 2-layer, hidden-64 model on a CPU

For each configuration (precision x batch x compile x AdamW implementation) a fresh
process times ``--steps`` training steps after ``--warmup`` (acceptrun.tune.trial) and
one line is printed: sequences/s, the median step and its quartiles, MFU against the
device's dense bf16 peak (989.4 TFLOP/s on H100/H200; --peak-tflops otherwise) at
739.3 GFLOP per sequence for bert-large, and peak memory. The data is synthetic
SQuAD-shaped features (labelled so); throughput does not depend on the token values.
Reference: Lambda's public benchmark (NVIDIA DeepLearningExamples, apex fp16) reports
321 sequences/s on one H100 SXM and 351 on one H200 at seq 384.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from acceptrun.telemetry.peaks import peak_tflops  # noqa: E402
from acceptrun.tune.sweep import run_child  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tiny model (CPU)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--precisions", help="comma-separated (default: bf16 on GPU; fp32,bf16 tiny)")
    p.add_argument("--batches", help="comma-separated batch sizes (default: 32,64,128; tiny 8,32)")
    p.add_argument(
        "--compile", default="none", help="comma-separated: none,default,max-autotune-no-cudagraphs"
    )
    p.add_argument(
        "--optimizers", default="default,fused", help="comma-separated: default,foreach,fused"
    )
    p.add_argument("--seq", type=int, default=384)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    args = p.parse_args()

    attr = "tiny" if args.tiny else "target"
    target = f"{ROOT / 'examples/bert_squad/tune_target.py'}:{attr}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-bert-"))
    probe = run_child({"mode": "probe", "device": args.device}, timeout=120, workdir=workdir)
    if not probe.get("ok"):
        print(json.dumps({"error": probe.get("error")}))
        return 1
    device = probe["device"]
    gpu = device.startswith("cuda")
    precisions = (args.precisions or ("bf16" if gpu else "fp32,bf16")).split(",")
    batches = [
        int(b) for b in (args.batches or ("32,64,128" if not args.tiny else "8,32")).split(",")
    ]
    compiles = args.compile.split(",")
    optimizers = args.optimizers.split(",")
    peak = args.peak_tflops or peak_tflops(probe.get("name"))
    size = "tiny" if args.tiny else "large"
    status = 0
    for precision, batch, comp, opt in itertools.product(precisions, batches, compiles, optimizers):
        config = {"batch_size": batch, "precision": precision, "compile": None if comp == "none" else comp,
                  "optimizer": opt, "params": {"seq": args.seq, "size": size}}  # fmt: skip
        job = {"mode": "trial", "target": target, "device": device, "config": config,
               "warmup": args.warmup, "steps": args.steps, "check_steps": 1, "seed": 0}  # fmt: skip
        r = run_child(job, timeout=args.timeout, workdir=workdir)
        line = {"model": f"bert-{size}", "data": "synthetic", "seq": args.seq, "device": device,
                "device_name": probe.get("name"), "precision": precision, "batch": batch,
                "compile": comp, "optimizer": opt, "ok": r["ok"]}  # fmt: skip
        if r["ok"]:
            line.update(
                seq_per_s=round(r["samples_per_s"], 2), median_step_s=round(r["median_s"], 5),
                p25_step_s=round(r["p25_s"], 5), p75_step_s=round(r["p75_s"], 5),
                mfu=round(r["flops_per_sample"] * r["samples_per_s"] / (peak * 1e12), 4) if peak else None,
                gflop_per_seq=round(r["flops_per_sample"] / 1e9, 2),
                peak_memory_bytes=r["peak_memory_bytes"], memory_kind=r["memory_kind"],
                compile_s=round(r["compile_s"], 2) if "compile_s" in r else None,
            )  # fmt: skip
        else:
            line["error"] = r.get("error")
            status = 1 if not r.get("oom") else status  # an OOM at a large batch is a finding
        print(json.dumps(line), flush=True)
    if status == 0:
        shutil.rmtree(workdir, ignore_errors=True)  # the trials' jobs and logs: all passed
    else:
        print(f"the trials' jobs and logs are kept under {workdir}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
