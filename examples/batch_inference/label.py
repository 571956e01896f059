"""Label text snippets with the document they come from: acceptrun's batch inference example.

A small model is built here: character trigrams hashed into 1,024 buckets, one linear
layer to three classes (3,075 parameters), trained for 300 full-batch steps on every
fifth snippet's true label (seconds on CPU, deterministic). It then labels every
snippet of data/snippets.jsonl through the client API, one shard of 100 at a time:

    for shard in run.inference.shards():              # only shards not committed yet
        shard.commit(label(shard.values), tokens=...)  # atomic, hashed, exactly once

After a kill the supervisor restarts the script: the model is built again (the same
weights, bit for bit), committed shards are skipped and the rest are labelled, so the
output shards are byte-identical to an uninterrupted run's. At the end the labels are
scored against data/gold.jsonl on the snippets the model was not trained on
(eval/accuracy; always answering "constitution" scores 0.65).

    acceptrun run spec.toml                        # ACCEPTED; outputs in out/labels/
    acceptrun run --inject kill@step=12 spec.toml  # killed after shard 12, resumed
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch
from torch import nn

import acceptrun

LABELS = ["declaration", "constitution", "lincoln"]
BUCKETS = 1024  # hashed character trigrams
TRAIN_EVERY = 5  # the model learns from every fifth snippet's label; scored on the rest


def features(texts: list[str]) -> torch.Tensor:
    """Counts of hashed character trigrams (crc32: the same buckets in every process)."""
    x = torch.zeros(len(texts), BUCKETS)
    for row, text in enumerate(texts):
        padded = f"  {text.lower()} "
        for i in range(len(padded) - 2):
            x[row, zlib.crc32(padded[i : i + 3].encode()) % BUCKETS] += 1.0
    return x


def build_model(snippets: list[dict[str, str]], gold: dict[str, str]) -> nn.Module:
    torch.manual_seed(0)
    train = [s for i, s in enumerate(snippets) if i % TRAIN_EVERY == 0]
    x = features([s["text"] for s in train])
    y = torch.tensor([LABELS.index(gold[s["id"]]) for s in train])
    model = nn.Linear(BUCKETS, len(LABELS))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def main() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: float sums in one order, outputs byte-identical
    data = Path("data")
    snippets = [json.loads(line) for line in (data / "snippets.jsonl").open()]
    gold = {r["id"]: r["label"] for r in map(json.loads, (data / "gold.jsonl").open())}

    run = acceptrun.init()
    model = build_model(snippets, gold)
    with torch.no_grad():
        for shard in run.inference.shards():
            texts = [item["text"] for item in shard.values]
            probs = torch.softmax(model(features(texts)), dim=1)
            best = probs.argmax(dim=1)
            outputs = [
                {"label": LABELS[int(k)], "p": round(float(probs[i, k]), 4)}
                for i, k in enumerate(best)
            ]
            shard.commit(outputs, tokens=sum(len(t.split()) for t in texts))

    # Score every committed label (this attempt's and earlier ones') on held-out snippets.
    held_out = {s["id"] for i, s in enumerate(snippets) if i % TRAIN_EVERY != 0}
    right = total = 0
    for path in sorted(Path(run.inference.output_dir).glob("shard-*.jsonl")):
        for line in path.open():
            row = json.loads(line)
            if row["id"] in held_out:
                total += 1
                right += row["output"]["label"] == gold[row["id"]]
    if run.rank == 0:
        run.metric("eval/accuracy", right / max(total, 1))
        print(f"labelled {len(snippets)} snippets; held-out accuracy {right / max(total, 1):.4f}")


if __name__ == "__main__":
    main()
