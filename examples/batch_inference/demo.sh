#!/usr/bin/env bash
# Batch inference through a crash: every snippet labelled exactly once, byte for byte.
#
# 1. An uninterrupted reference run: `acceptrun run spec.toml`; its shards are kept.
# 2. The same run SIGKILLed right after shard 12 is committed
#    (`acceptrun run --inject kill@step=12 spec.toml`): the supervisor restarts it,
#    committed shards are skipped, the rest labelled; the verdict must be ACCEPTED.
# 3. The output shards of both runs must be byte-identical.
set -euo pipefail
cd "$(dirname "$0")"

echo "== 1/2: uninterrupted reference run =="
acceptrun run spec.toml > /dev/null
rm -rf out/reference && cp -r out/labels out/reference

echo "== 2/2: SIGKILLed after shard 12 and resumed (acceptrun run --inject kill@step=12 spec.toml) =="
status=0
acceptrun run --inject kill@step=12 spec.toml || status=$?

echo
if cmp -s <(cat out/labels/shard-*.jsonl) <(cat out/reference/shard-*.jsonl); then
  echo "labels byte-identical to the uninterrupted run ($(ls out/labels/shard-*.jsonl | wc -l) shards, $(cat out/labels/shard-*.jsonl | wc -l) lines)"
else
  echo "labels DIFFER from the uninterrupted run" >&2
  status=1
fi
echo "report: $(acceptrun report latest)"
exit "$status"
