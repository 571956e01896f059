"""SQuAD v1.1 preprocessing and the official F1/EM, on small files made here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "bert_squad"))

from squad import (
    WordPiece,
    basic_words,
    best_spans,
    evaluate,
    exact_match,
    f1_score,
    load_squad,
    make_features,
    normalize_answer,
    synthetic_squad,
)

CONTEXT = (
    "The Eiffel Tower stands on the Champ de Mars in Paris. It was built in 1889 by the "
    "company of Gustave Eiffel, for the World's Fair, and was the tallest structure in the "
    "world until 1930."
)
ANSWER = "1889"


@pytest.fixture
def squad_file(tmp_path: Path) -> Path:
    data = {
        "version": "1.1",
        "data": [{"title": "Eiffel_Tower", "paragraphs": [{"context": CONTEXT, "qas": [
            {"id": "q1", "question": "When was the tower built?",
             "answers": [{"text": ANSWER, "answer_start": CONTEXT.index(ANSWER)}]},
            {"id": "q2", "question": "Whose company built the Eiffel Tower in Paris for the fair?",
             "answers": [{"text": "Gustave Eiffel", "answer_start": CONTEXT.index("Gustave Eiffel")}]},
        ]}]}],
    }  # fmt: skip
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(data))
    return path


def _tok(examples: list) -> WordPiece:  # type: ignore[type-arg]
    texts = [e.context for e in examples] + [e.question for e in examples]
    # Small vocabulary: frequent words whole, the rest split into ## pieces.
    return WordPiece.generated(texts, size=120)


def test_basic_words_spans_point_into_the_original_text() -> None:
    text = "Café, 1889: the \u00c9cole's tower!"
    words = basic_words(text)
    assert [w for w, _, _ in words] == [
        "cafe",
        ",",
        "1889",
        ":",
        "the",
        "ecole",
        "'",
        "s",
        "tower",
        "!",
    ]
    for word, s, e in words:
        assert normalize_answer(text[s:e]).replace("é", "e") in (
            word,
            "",
        )  # punctuation normalises away


def test_features_offsets_windows_and_answer_positions(squad_file: Path) -> None:
    examples = load_squad(squad_file)
    tok = _tok(examples)
    id_to_tok = {i: t for t, i in tok.vocab.items()}
    seq, stride, max_query = 32, 8, 6
    feats = make_features(examples, tok, seq=seq, doc_stride=stride, max_query=max_query)
    ctx_tokens = tok.tokenize(CONTEXT)
    for f in feats:
        assert (
            len(f.input_ids)
            == len(f.token_type_ids)
            == len(f.attention_mask)
            == len(f.offsets)
            == seq
        )
        assert f.input_ids[0] == tok.cls_id
        # every context token maps back to its own characters in the context
        for tid, off in zip(f.input_ids, f.offsets, strict=True):
            if off is not None:
                piece = id_to_tok[tid].removeprefix("##")
                assert CONTEXT[off[0] : off[1]].lower() == piece
    q1 = [f for f in feats if f.example == 0]
    q2 = [f for f in feats if f.example == 1]
    # the question is cut to max_query tokens: [CLS] q(6) [SEP] then the context
    assert q2[0].input_ids[max_query + 1] == tok.sep_id
    assert q2[0].token_type_ids[: max_query + 2] == [0] * (max_query + 2)
    # window starts are `stride` context tokens apart and the last reaches the end
    room = seq - len(tok.tokenize("When was the tower built?")) - 3
    firsts = [next(o for o in f.offsets if o is not None) for f in q1]
    starts = [next(i for i, t in enumerate(ctx_tokens) if (t[1], t[2]) == o) for o in firsts]
    assert starts == list(range(0, len(ctx_tokens) - room + stride, stride))[: len(starts)]
    assert starts[-1] + room >= len(ctx_tokens)
    assert len(q1) >= 3
    # windows holding the whole answer point at it; the others point at [CLS]
    a0 = CONTEXT.index(ANSWER)
    holding = [f for f in q1 if any(o == (a0, a0 + len(ANSWER)) for o in f.offsets)]
    assert holding
    for f in q1:
        if f in holding:
            assert f.start_position == f.end_position > 0
            assert f.offsets[f.start_position] == (a0, a0 + len(ANSWER))
        else:
            assert (f.start_position, f.end_position) == (0, 0)
    # a multi-token answer spans from its first to its last token
    g0 = CONTEXT.index("Gustave Eiffel")
    answered = [f for f in q2 if f.start_position > 0]
    assert answered
    for f in answered:
        assert f.offsets[f.start_position][0] == g0
        assert f.offsets[f.end_position][1] == g0 + len("Gustave Eiffel")
        assert f.end_position > f.start_position


def test_default_seq_384_stride_128_windows_and_span_decoding() -> None:
    data = synthetic_squad(3, seed=1, words_per_context=420)
    assert data["synthetic"] is True
    from squad import examples_from_json

    examples = examples_from_json(data)
    tok = WordPiece.generated([e.context for e in examples] + [e.question for e in examples])
    feats = make_features(examples, tok)  # seq 384, stride 128, query 64
    per_example = [[f for f in feats if f.example == i] for i in range(len(examples))]
    assert all(len(fs) >= 2 for fs in per_example)
    for ex, fs in zip(examples, per_example, strict=True):
        assert ex.context[ex.answer_start : ex.answer_start + len(ex.answers[0])] == ex.answers[0]
        labelled = [f for f in fs if f.start_position > 0]
        assert labelled, "some window holds the answer"
    # logits that peak on the labelled span decode to the answer text
    start_logits, end_logits = [], []
    for f in feats:
        s = [0.0] * 384
        e = [0.0] * 384
        s[f.start_position] += 10.0 if f.start_position else 0.0
        e[f.end_position] += 10.0 if f.end_position else 0.0
        start_logits.append(s)
        end_logits.append(e)
    predictions = best_spans(feats, examples, start_logits, end_logits)
    assert evaluate(examples, predictions) == {"exact_match": 100.0, "f1": 100.0}


@pytest.mark.parametrize(
    ("prediction", "truth", "em", "f1"),
    [
        pytest.param("the Paris", "Paris", 1.0, 1.0, id="article"),
        pytest.param("Paris!", "paris", 1.0, 1.0, id="case-punctuation"),
        pytest.param("in Paris France", "Paris", 0.0, 0.5, id="p1/3-r1"),
        pytest.param("a cat sat", "the cat sat on mat", 0.0, 2 / 3, id="p1-r1/2"),
        pytest.param("London", "Paris", 0.0, 0.0, id="no-overlap"),
        pytest.param("", "Paris", 0.0, 0.0, id="empty"),
    ],
)
def test_f1_and_exact_match(prediction: str, truth: str, em: float, f1: float) -> None:
    assert exact_match(prediction, truth) == em
    assert f1_score(prediction, truth) == pytest.approx(f1)


def test_normalisation_and_max_over_ground_truths(squad_file: Path) -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple and a pear") == "apple and pear"
    examples = load_squad(squad_file)
    examples[0].answers = ["1889", "in 1889"]
    # q1 exact (one truth matches); q2: "company of Gustave Eiffel" vs "Gustave Eiffel":
    # precision 2/4 ("company" and "of" extra), recall 1 -> F1 2 * 0.5 / 1.5 = 2/3
    scores = evaluate(examples, {"q1": "in 1889", "q2": "company of Gustave Eiffel"})
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1.0 + 2 / 3) / 2)
