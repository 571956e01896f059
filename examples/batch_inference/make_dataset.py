"""Make the example's dataset from the demo's public-domain corpus (no downloads).

examples/charlm/data/corpus.txt holds four American texts. Each is cut into snippets of
eight words (a window moved two words at a time), and each snippet is labelled with its
document: "declaration", "constitution" or "lincoln" (the Gettysburg Address and the
Second Inaugural). The snippets, shuffled with a fixed seed, go to data/snippets.jsonl
({"id", "text"}: the items the batch run labels) and their true labels to
data/gold.jsonl ({"id", "label"}: what label.py scores the run against).

    python make_dataset.py      # rewrites both files, byte for byte the same
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "charlm" / "data" / "corpus.txt"
# First line of each document in corpus.txt, and the label of what follows it.
STARTS = {
    "THE DECLARATION OF INDEPENDENCE": "declaration",
    "THE CONSTITUTION OF THE UNITED STATES": "constitution",
    "THE GETTYSBURG ADDRESS": "lincoln",
}
WORDS, STRIDE = 8, 2


def documents() -> dict[str, list[str]]:
    words: dict[str, list[str]] = {}
    label = None
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        label = STARTS.get(line.strip(), label)
        if label is not None and line.strip() not in STARTS:
            words.setdefault(label, []).extend(line.split())
    return words


def main() -> None:
    rows = []
    for label, words in documents().items():
        for start in range(0, len(words) - WORDS + 1, STRIDE):
            rows.append((" ".join(words[start : start + WORDS]), label))
    random.Random(0).shuffle(rows)
    snippets = [{"id": f"s{i:05d}", "text": text} for i, (text, _) in enumerate(rows)]
    gold = [{"id": f"s{i:05d}", "label": label} for i, (_, label) in enumerate(rows)]
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    for name, records in (("snippets.jsonl", snippets), ("gold.jsonl", gold)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (data / name).write_text(text, encoding="utf-8")
    counts = {label: sum(1 for _, lb in rows if lb == label) for label in STARTS.values()}
    print(f"{len(rows)} snippets: {counts}")


if __name__ == "__main__":
    main()
