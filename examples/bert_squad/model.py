"""BERT-large for SQuAD (BertForQuestionAnswering), built in code: no hub downloads.

The configuration is bert-large-uncased's published one: 24 layers, hidden 1024, 16
heads, intermediate 4096, vocabulary 30522, 512 positions. Weights are random unless a
local directory or file is given (a Hugging Face model directory, or a .safetensors /
.bin state dict). ``tiny_config()`` (2 layers, hidden 64) runs on a CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def bert_large_config(**overrides: Any) -> Any:
    from transformers import BertConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, hidden_act="gelu", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
        initializer_range=0.02, layer_norm_eps=1e-12, attn_implementation="sdpa",
    )  # fmt: skip
    kwargs.update(overrides)
    return BertConfig(**kwargs)


def tiny_config(**overrides: Any) -> Any:
    """2 layers, hidden 64, 4 heads, intermediate 256: the CPU test size."""
    kwargs: dict[str, Any] = dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256
    )
    kwargs.update(overrides)
    return bert_large_config(**kwargs)


def build_model(config: Any, weights: str | None = None) -> Any:
    """BertForQuestionAnswering from ``config``; weights from a local path when given."""
    from transformers import BertForQuestionAnswering

    if not weights:
        return BertForQuestionAnswering(config)
    path = Path(weights)
    if path.is_dir():
        return BertForQuestionAnswering.from_pretrained(path, config=config, local_files_only=True)
    import torch

    model = BertForQuestionAnswering(config)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    print(f"weights {path}: {len(missing)} missing, {len(unexpected)} unexpected keys")
    return model


def flops_per_sequence(config: Any, seq: int) -> float:
    """Training FLOPs of one sequence, forward and backward.

    6 FLOPs per weight per token (2 forward, 4 backward) over the encoder's matmul
    weights (4h^2 attention + 2hi MLP per layer), plus the attention scores and the
    weighted values (2 matmuls of s x s x h per layer: 4 s^2 h forward, 12 s^2 h with
    backward). bert-large at seq 384: 739.3 GFLOP, as in the public BERT/SQuAD benchmarks.
    """
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    weights = layers * (4 * h * h + 2 * h * i)
    return float(6 * weights * seq + 12 * layers * seq * seq * h)
