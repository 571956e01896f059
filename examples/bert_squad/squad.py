"""SQuAD v1.1 for BERT: tokenizer, features (seq 384, stride 128, query 64), spans, F1/EM.

No network and no hub: the tokenizer is BERT's uncased WordPiece over a local
``vocab.txt`` when one is given, else the same algorithm over a vocabulary generated from
the texts themselves (labelled "basic-wordpiece (generated vocabulary)": fine for random
initialisation and benchmarks, useless with pretrained weights). Without SQuAD files,
:func:`synthetic_squad` makes SQuAD-shaped data, labelled "synthetic" wherever it shows.

Windows follow the original BERT recipe: a context longer than the room left by the
question is cut into windows whose starts are ``doc_stride`` tokens apart; a window that
does not hold the whole answer is labelled with the [CLS] position (0) as start and end.
"""

from __future__ import annotations

import collections
import json
import random
import re
import string
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# ---- tokenizer -------------------------------------------------------------------------


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _normalize(text: str) -> tuple[str, list[int]]:
    """Lower-case, strip accents; returns the text and, per character, its source index."""
    out, index = [], []
    for i, ch in enumerate(text):
        for c in unicodedata.normalize("NFD", ch.lower()):
            if unicodedata.category(c) == "Mn":
                continue  # an accent
            out.append(c)
            index.append(i)
    return "".join(out), index


def basic_words(text: str) -> list[tuple[str, int, int]]:
    """BERT's basic tokenization with character spans into ``text``: (word, start, end)."""
    norm, index = _normalize(text)
    words: list[tuple[str, int, int]] = []
    start = None
    for k, ch in enumerate(norm):
        if ch.isspace() or _is_punct(ch) or unicodedata.category(ch) == "Cc":
            if start is not None:
                words.append((norm[start:k], index[start], index[k - 1] + 1))
                start = None
            if _is_punct(ch):
                words.append((ch, index[k], index[k] + 1))
        elif start is None:
            start = k
    if start is not None:
        words.append((norm[start:], index[start], index[len(norm) - 1] + 1))
    return words


class WordPiece:
    """Greedy longest-match-first WordPiece, BERT's uncased tokenizer, with offsets."""

    def __init__(self, vocab: Sequence[str], *, kind: str) -> None:
        self.vocab = {tok: i for i, tok in enumerate(vocab)}
        self.kind = kind
        """How the vocabulary was made: "vocab.txt" or "basic-wordpiece (generated vocabulary)"."""
        for tok in SPECIAL:
            if tok not in self.vocab:
                raise ValueError(f"vocabulary has no {tok} token")
        self.cls_id, self.sep_id = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.pad_id, self.unk_id = self.vocab["[PAD]"], self.vocab["[UNK]"]

    def __len__(self) -> int:
        return len(self.vocab)

    @classmethod
    def from_file(cls, path: str | Path) -> WordPiece:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return cls([line.rstrip("\n") for line in lines], kind=f"vocab.txt ({path})")

    @classmethod
    def generated(cls, texts: Iterable[str], size: int = 30522) -> WordPiece:
        """A vocabulary from ``texts``: specials, every character (alone and as ##x), then
        the most frequent words. Deterministic: ties broken alphabetically."""
        counts: collections.Counter[str] = collections.Counter()
        chars: set[str] = set()
        for text in texts:
            for word, _, _ in basic_words(text):
                counts[word] += 1
                chars.update(word)
        vocab = list(SPECIAL)
        for c in sorted(chars):
            vocab += [c, "##" + c]
        seen = set(vocab)
        for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if len(vocab) >= size:
                break
            if word not in seen:
                vocab.append(word)
                seen.add(word)
        return cls(vocab, kind="basic-wordpiece (generated vocabulary)")

    def tokenize(self, text: str, max_chars: int = 100) -> list[tuple[int, int, int]]:
        """Token ids with character spans into ``text``: (id, start, end)."""
        out: list[tuple[int, int, int]] = []
        for word, start, end in basic_words(text):
            pieces = self._pieces(word) if len(word) <= max_chars else None
            if pieces is None:
                out.append((self.unk_id, start, end))
                continue
            # A character that normalises to several ("ﬁ" -> "fi") breaks the one-to-one
            # map: such a word's pieces all carry the whole word's span.
            exact = len(word) == end - start
            out += [(p, start + a, start + b) if exact else (p, start, end) for p, a, b in pieces]
        return out

    def _pieces(self, word: str) -> list[tuple[int, int, int]] | None:
        pieces = []
        i = 0
        while i < len(word):
            j = len(word)
            while j > i:
                sub = word[i:j] if i == 0 else "##" + word[i:j]
                if sub in self.vocab:
                    pieces.append((self.vocab[sub], i, j))
                    break
                j -= 1
            if j == i:
                return None
            i = j
        return pieces


# ---- data --------------------------------------------------------------------------------


@dataclass
class Example:
    qid: str
    question: str
    context: str
    answers: list[str]
    answer_start: int | None = None
    """Character offset of the first answer in the context (training)."""


@dataclass
class Feature:
    """One window of one example, padded to ``seq`` tokens."""

    example: int
    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    start_position: int
    end_position: int
    offsets: list[tuple[int, int] | None] = field(default_factory=list)
    """Per token: its character span in the context, None outside the context."""


def load_squad(path: str | Path) -> list[Example]:
    """Examples of a SQuAD v1.1 JSON file (``{"data": [{"paragraphs": [...]}]}``)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return examples_from_json(data)


def examples_from_json(data: dict[str, Any]) -> list[Example]:
    out = []
    for article in data["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                answers = qa.get("answers", [])
                out.append(Example(
                    qid=qa["id"], question=qa["question"], context=para["context"],
                    answers=[a["text"] for a in answers],
                    answer_start=answers[0]["answer_start"] if answers else None,
                ))  # fmt: skip
    return out


def make_features(
    examples: Sequence[Example],
    tok: WordPiece,
    *,
    seq: int = 384,
    doc_stride: int = 128,
    max_query: int = 64,
) -> list[Feature]:
    """Windows of ``seq`` tokens: [CLS] question [SEP] context window [SEP] [PAD]...

    The question is cut to ``max_query`` tokens. Window starts are ``doc_stride``
    context tokens apart (the last window reaches the end of the context). Start and end
    are token positions of the first answer when the window holds all of it, else 0
    ([CLS]): the "no answer here" label.
    """
    features = []
    for ei, ex in enumerate(examples):
        q = [t for t, _, _ in tok.tokenize(ex.question)][:max_query]
        ctx = tok.tokenize(ex.context)
        room = seq - len(q) - 3
        if room <= 0:
            raise ValueError(
                f"seq {seq} leaves no room for context after a {len(q)}-token question"
            )
        ans_tok: tuple[int, int] | None = None
        if ex.answer_start is not None and ex.answers:
            a0, a1 = ex.answer_start, ex.answer_start + len(ex.answers[0])
            inside = [i for i, (_, s, e) in enumerate(ctx) if s < a1 and e > a0]
            if inside:
                ans_tok = (inside[0], inside[-1])
        start = 0
        while True:
            length = min(room, len(ctx) - start)
            window = ctx[start : start + length]
            ids = [tok.cls_id, *q, tok.sep_id, *(t for t, _, _ in window), tok.sep_id]
            types = [0] * (len(q) + 2) + [1] * (len(window) + 1)
            offsets: list[tuple[int, int] | None] = [None] * (len(q) + 2)
            offsets += [(s, e) for _, s, e in window] + [None]
            sp = ep = 0
            if ans_tok is not None and ans_tok[0] >= start and ans_tok[1] < start + length:
                shift = len(q) + 2 - start
                sp, ep = ans_tok[0] + shift, ans_tok[1] + shift
            pad = seq - len(ids)
            features.append(Feature(
                example=ei, input_ids=ids + [tok.pad_id] * pad, token_type_ids=types + [0] * pad,
                attention_mask=[1] * len(ids) + [0] * pad, start_position=sp, end_position=ep,
                offsets=offsets + [None] * pad,
            ))  # fmt: skip
            if start + length >= len(ctx):
                break
            start += min(length, doc_stride)
    return features


def best_spans(
    features: Sequence[Feature],
    examples: Sequence[Example],
    start_logits: Sequence[Sequence[float]],
    end_logits: Sequence[Sequence[float]],
    *,
    n_best: int = 20,
    max_answer_tokens: int = 30,
) -> dict[str, str]:
    """The predicted answer text per question id: the best-scoring valid span over its windows."""
    best: dict[int, tuple[float, str]] = {}
    for f, sl, el in zip(features, start_logits, end_logits, strict=True):
        starts = sorted(range(len(sl)), key=lambda i: -sl[i])[:n_best]
        ends = sorted(range(len(el)), key=lambda i: -el[i])[:n_best]
        for s in starts:
            for e in ends:
                if (
                    f.offsets[s] is None
                    or f.offsets[e] is None
                    or e < s
                    or e - s + 1 > max_answer_tokens
                ):
                    continue
                score = sl[s] + el[e]
                if f.example not in best or score > best[f.example][0]:
                    ctx = examples[f.example].context
                    best[f.example] = (score, ctx[f.offsets[s][0] : f.offsets[e][1]])  # type: ignore[index]
    return {ex.qid: best[i][1] if i in best else "" for i, ex in enumerate(examples)}


# ---- the official SQuAD v1.1 metrics ---------------------------------------------------


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def evaluate(examples: Sequence[Example], predictions: dict[str, str]) -> dict[str, float]:
    """``{"exact_match": ..., "f1": ...}`` in percent, each the max over the ground truths."""
    em = f1 = 0.0
    for ex in examples:
        pred = predictions.get(ex.qid, "")
        em += max((exact_match(pred, t) for t in ex.answers), default=0.0)
        f1 += max((f1_score(pred, t) for t in ex.answers), default=0.0)
    n = max(len(examples), 1)
    return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}


# ---- synthetic SQuAD-shaped data -------------------------------------------------------


def synthetic_squad(
    n_questions: int, *, seed: int = 0, words_per_context: int = 160
) -> dict[str, Any]:
    """SQuAD v1.1-shaped JSON with made-up words. Labelled ``"synthetic": true``.

    Each question repeats the four context words before its answer ("what follows
    w1 w2 w3 w4?"), so a model can learn to find answers; contexts of 160 words make
    windows of 384 tokens hold most of them.
    """
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "den", "pra", "gul", "ost"]
    lexicon = sorted(
        {"".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(400)}
    )
    paragraphs = []
    made = 0
    while made < n_questions:
        words = [rng.choice(lexicon) for _ in range(words_per_context)]
        context = " ".join(words)
        qas = []
        for _ in range(min(3, n_questions - made)):
            i = rng.randrange(4, words_per_context - 3)
            span = words[i : i + rng.randint(1, 3)]
            answer = " ".join(span)
            start = len(" ".join(words[:i])) + 1
            qas.append({"id": f"syn-{made}", "question": "what follows " + " ".join(words[i - 4 : i]) + "?",
                        "answers": [{"text": answer, "answer_start": start}]})  # fmt: skip
            made += 1
        paragraphs.append({"context": context, "qas": qas})
    return {
        "version": "1.1",
        "synthetic": True,
        "data": [{"title": "synthetic", "paragraphs": paragraphs}],
    }
