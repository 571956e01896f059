#!/usr/bin/env bash
# The embedded demo (`make demo`): an accepted run that survives a crash, bit for bit.
#
# 1. An uninterrupted reference: `python train.py` (a standalone run, recorded too).
# 2. The demo run: `acceptrun run --inject kill@step=600 spec.toml`: the first attempt
#    is SIGKILLed at step 600 (a real signal, sent by the client API); the supervisor
#    resumes from the newest verified checkpoint; the verdict must be ACCEPTED.
# 3. The two final models must be bitwise equal.
# 4. The run's report: one HTML file (verdict, the five tests, charts, cost, lineage),
#    written into the run record when the run closed; its path is printed last.
set -euo pipefail
cd "$(dirname "$0")"

echo "== 1/2: uninterrupted reference run (python train.py, about 40 s) =="
python train.py --out-dir out/uninterrupted | tail -n 1

echo
echo "== 2/2: the demo run, SIGKILLed at step 600 and resumed (acceptrun run --inject kill@step=600 spec.toml) =="
status=0
# The model of an earlier demo must not stand in for this run's: a run that never wrote
# one is compared as missing, not as equal.
rm -f out/model.safetensors
acceptrun run --inject kill@step=600 spec.toml || status=$?

echo
if [ ! -f out/model.safetensors ]; then
  echo "the demo run wrote no final model (out/model.safetensors): nothing to compare" >&2
  exit 1
fi
ours=$(sha256sum out/model.safetensors | cut -d' ' -f1)
reference=$(sha256sum out/uninterrupted/model.safetensors | cut -d' ' -f1)
if [ "$ours" = "$reference" ]; then
  echo "final model bitwise equal to the uninterrupted run (sha256 ${ours:0:16}...)"
else
  echo "final model DIFFERS from the uninterrupted run: $ours vs $reference" >&2
  status=1
fi

# The report was written when the run closed; `acceptrun report` writes it again (same file)
# and prints its path. Open it in a browser: it needs no network.
echo
echo "report: $(acceptrun report latest)"
exit "$status"
