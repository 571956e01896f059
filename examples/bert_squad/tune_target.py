"""BERT-large / SQuAD as a tune target: ``acceptrun tune examples/bert_squad/tune_target.py:target``.

``target`` is bert-large at seq 384 (the GPU workload; the job's default: fp32, batch 32,
eager, torch's default AdamW); ``tiny`` is the 2-layer, hidden-64 model at the same
sequence length for CPUs (default batch 8). Batches are synthetic SQuAD features
(labelled synthetic), tokenized once when the trial starts and kept on the device, so a
trial times the training step and not Python tokenization.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model import bert_large_config, build_model, flops_per_sequence, tiny_config
from squad import WordPiece, examples_from_json, make_features, synthetic_squad

from acceptrun.tune.target import Built, TuneConfig, TuneTarget


def feature_tensors(n_questions: int, seq: int, device: Any, vocab_size: int) -> dict[str, Any]:
    """Synthetic SQuAD features as tensors: input_ids, token_type_ids, attention_mask, positions."""
    import torch

    data = synthetic_squad(n_questions, seed=0)
    examples = examples_from_json(data)
    tok = WordPiece.generated(
        [e.context for e in examples] + [e.question for e in examples], size=vocab_size
    )
    feats = make_features(examples, tok, seq=seq, doc_stride=128, max_query=64)
    cols = {
        "input_ids": [f.input_ids for f in feats],
        "token_type_ids": [f.token_type_ids for f in feats],
        "attention_mask": [f.attention_mask for f in feats],
        "start_positions": [f.start_position for f in feats],
        "end_positions": [f.end_position for f in feats],
    }
    return {k: torch.tensor(v, device=device) for k, v in cols.items()}


class BertSquadTarget(TuneTarget):
    uses_sdpa = True  # attn_implementation="sdpa": F.scaled_dot_product_attention
    supports_checkpointing = True

    def __init__(self, size: str = "large", batch_size: int = 32, seq: int = 384) -> None:
        self.size = size
        self.name = f"bert-{size}-squad"
        self.batch_size = batch_size
        self.seq = seq

    def _config(self) -> Any:
        return bert_large_config() if self.size == "large" else tiny_config()

    def default_config(self) -> TuneConfig:
        return TuneConfig(batch_size=self.batch_size, params={"seq": self.seq, "size": self.size})

    def build(self, config: TuneConfig, device: Any) -> Built:
        import torch

        model = build_model(self._config()).to(device)
        model.train()
        if config.activation_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        optimizer = config.adamw(model.parameters(), lr=3e-5, weight_decay=0.01)
        data = feature_tensors(256, config.params["seq"], device, model.config.vocab_size)
        rows = data["input_ids"].shape[0]
        gen = torch.Generator(device="cpu").manual_seed(0)

        def make_batch(n: int) -> dict[str, Any]:
            idx = torch.randint(rows, (n,), generator=gen).to(device)
            return {k: v[idx] for k, v in data.items()}

        def loss_fn(m: Any, batch: dict[str, Any]) -> Any:
            return m(**batch).loss

        return Built(model, optimizer, make_batch, loss_fn)

    def flops_per_sample(self, config: TuneConfig) -> float:
        return flops_per_sequence(self._config(), config.params["seq"])


target = BertSquadTarget("large", batch_size=32)
tiny = BertSquadTarget("tiny", batch_size=8)
