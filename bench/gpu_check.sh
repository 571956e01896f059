#!/usr/bin/env bash
# Every GPU check of the project in one run: `make gpu-check OUT=<dir>` or
#   bash bench/gpu_check.sh <dir>
# On a machine with an NVIDIA GPU and an image holding PyTorch (no venv needed: it runs
# from the source tree with PYTHONPATH=src). Writes JSON figures and logs into <dir>.
# Needs, beside torch: safetensors, xxhash, fsspec, packaging, psutil, nvidia-ml-py,
# tomli-w, rich, prometheus-client, and transformers for the BERT part (pip install them,
# or unpack wheels and put them on PYTHONPATH).
set -uo pipefail
out="${1:?usage: bench/gpu_check.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
status=0

step() { echo "== $1"; }

step "provenance and device smoke test"
"$py" - >"$out/provenance.json" 2>"$out/provenance.err" <<'PY' || status=1
import json
from acceptrun.capture import provenance
prov = provenance.capture()
smoke = provenance.device_smoke()
print(json.dumps({"gpus": prov["gpus"], "torch": prov["torch"], "smoke": smoke}, indent=2))
PY
cat "$out/provenance.json"

step "checkpoint state on CUDA (save on CUDA, restore on CPU and back)"
"$py" -m pytest -q -p no:cacheprovider --noconftest -m gpu tests/unit/test_checkpoint_state.py \
  tests/integration/test_resumable_loader.py 2>&1 | tail -n 5 | tee "$out/gpu_tests.txt" || status=1

step "checkpoint benchmark on CUDA (500 MB state)"
"$py" bench/checkpoint.py --device cuda --repeats 5 2>"$out/bench_checkpoint.err" \
  | tee "$out/bench_checkpoint.json" || status=1

step "a supervised run that needs one GPU"
tmp=$(mktemp -d)
cat >"$tmp/train.py" <<'PY'
import torch, acceptrun
run = acceptrun.init()
device = "cuda" if torch.cuda.is_available() else "cpu"  # the --cpu drill hides the GPU
model = torch.nn.Linear(1024, 1024).to(device)
opt = torch.optim.AdamW(model.parameters())
start = run.restore(model=model, optimizer=opt)
for step in run.steps(start, 200):
    loss = model(torch.randn(64, 1024, device=device)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(step, loss=loss.item())
    run.maybe_checkpoint(step)
run.metric("final/loss", loss.item())
PY
cat >"$tmp/spec.toml" <<TOML
name = "gpu-check"
command = ["$py", "train.py"]
[resources]
gpus = 1
[checkpoint]
every_steps = 50
[acceptance.metrics]
"final/loss" = "< 10"
TOML
(cd "$tmp" && "$py" -m acceptrun --workspace "$tmp/ws" run -q spec.toml) >"$out/gpu_run.txt" 2>&1 || status=1
(cd "$tmp" && "$py" -m acceptrun --workspace "$tmp/ws" ckpt drill --cpu) >>"$out/gpu_run.txt" 2>&1 || status=1
cat "$out/gpu_run.txt"

step "telemetry: NVML samples, GPU idle stop, Prometheus"
"$py" bench/gpu_check_telemetry.py "$out" | tee "$out/telemetry_check.txt" || status=1

# Needs transformers in the image (carry its wheel where it is missing).
step "BERT-large / SQuAD, tune, comm"
bash bench/gpu_check_bert.sh "$out/bert" || status=1

echo "gpu-check finished with status $status; figures in $out"
exit "$status"
