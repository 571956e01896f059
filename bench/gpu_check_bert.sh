#!/usr/bin/env bash
# BERT-large / SQuAD on one GPU, the tune sweep and the communication benchmark, in about
# 8 minutes on one H200:  bash bench/gpu_check_bert.sh OUTDIR
# Needs an image with PyTorch and transformers (runs from the source tree, PYTHONPATH=src;
# acceptrun's own small dependencies as for bench/gpu_check.sh). Writes JSON into OUTDIR.
# CPU_SMOKE=1 runs the same steps on a CPU with the tiny model and gloo (a check of the
# script itself, not of any GPU figure).
set -uo pipefail
out="${1:?usage: bench/gpu_check_bert.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
status=0
step() { echo "== $1"; }

if [ "${CPU_SMOKE:-0}" = 1 ]; then
  bench_args=(--tiny --device cpu --precisions fp32 --batches 8 --compile none --optimizers default --steps 2 --warmup 1)
  target="examples/bert_squad/tune_target.py:tiny"
  tune_args=(--device cpu --budget 90s --steps 2 --warmup 1 --check-steps 2 --max-batch 16 --axes precision,batch --no-confirm)
  comm_args=(--backend gloo --procs 2 --sizes 4KiB,1MiB --buckets 1,25 --iters 3 --ddp-steps 2)
else
  # bf16 only (fp32 is not a contender on an H200); batches around the memory sweet spot;
  # compile on and off; fused AdamW (the fastest on CUDA).
  bench_args=(--precisions bf16 --batches 32,64,128 --compile none,default --optimizers fused --steps 10 --warmup 3)
  target="examples/bert_squad/tune_target.py:target"
  tune_args=(--budget 3m --steps 8 --warmup 3 --batch-multiple 8 --max-batch 256
             --axes precision,batch,optimizer,attention,compile)
  comm_args=(--backend nccl --procs 1 --sizes 1MiB,64MiB,256MiB,1GiB --buckets 5,25,100)
fi

step "BERT-large / SQuAD throughput (seq 384): JSON lines"
timeout 300 "$py" bench/bert_squad.py "${bench_args[@]}" 2>"$out/bert_bench.err" \
  | tee "$out/bert_bench.jsonl" || status=1

step "acceptrun tune (short budget)"
timeout 240 "$py" -m acceptrun --workspace "$out/ws" tune "$target" "${tune_args[@]}" \
  --out "$out/tune_best.json" --json >"$out/tune.json" 2>"$out/tune.err" || status=1
"$py" - "$out/tune.json" <<'PY' || status=1
import json, sys
t = json.load(open(sys.argv[1]))
best = t["trials"][t["best"]]
print(f"tune: {len(t['trials'])} trials, best {best['label']}: {best['samples_per_s']:.1f} seq/s, "
      f"gain {t['gain']:.2f}x over {t['trials'][t['baseline']]['label']}")
PY

step "communication (one GPU: no cross-device all-reduce; NCCL's fixed cost and DDP overhead)"
timeout 120 "$py" -m acceptrun bench comm "${comm_args[@]}" --out "$out/comm.json" \
  2>"$out/comm.err" | tee "$out/comm.txt" || status=1

echo "figures in $out (status $status)"
exit $status
