"""A tiny tune target for CPUs: a two-layer transformer encoder in plain PyTorch.

    acceptrun tune examples/tune_tiny/target.py:target --budget 2m

It shows every part of the tune target interface: a default configuration (the job as it
runs today), build() honouring activation checkpointing and the fused/foreach AdamW
choice, FLOPs per sample for MFU, attention through F.scaled_dot_product_attention (so
the attention-backend trials apply) and a data loader (so the loader trials apply).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from acceptrun.tune.target import Built, TuneConfig, TuneTarget


class Block(nn.Module):
    """Pre-norm transformer block: SDPA attention, then a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyEncoder(nn.Module):
    """Token embedding, blocks, a classifier over the mean of the sequence."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, classes)
        self.checkpointing = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x.mean(dim=1))


class Synthetic(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random token sequences whose label is the first token's parity: learnable, cheap."""

    def __init__(self, size: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(vocab, (size, seq), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.tokens[i]
        return t, t[0] % 2


class TinyTarget(TuneTarget):
    name = "tiny-encoder"
    uses_sdpa = True
    supports_checkpointing = True

    def default_config(self) -> TuneConfig:
        # The job as written: fp32, a small batch, eager, torch's default AdamW.
        return TuneConfig(
            batch_size=8, params={"seq": 64, "dim": 64, "heads": 4, "layers": 2, "vocab": 1000}
        )

    def build(self, config: TuneConfig, device: Any) -> Built:
        p = config.params
        model = TinyEncoder(p["vocab"], p["dim"], p["heads"], p["layers"], classes=2).to(device)
        model.checkpointing = config.activation_checkpointing
        optimizer = config.adamw(model.parameters(), lr=1e-3)

        def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = torch.randint(p["vocab"], (n, p["seq"]), device=device)
            return tokens, tokens[:, 0] % 2

        def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            tokens, labels = batch
            return F.cross_entropy(m(tokens).float(), labels)

        return Built(model, optimizer, make_batch, loss_fn)

    def flops_per_sample(self, config: TuneConfig) -> float:
        p = config.params
        d, t = p["dim"], p["seq"]
        # 6 x (non-embedding weights) per token, plus attention scores and values
        # (2 matmuls of t x t x d, forward and backward: 12 t^2 d per layer).
        per_layer = 12 * d * d
        return float(p["layers"] * (6 * per_layer * t + 12 * t * t * d))

    def dataloader(self, config: TuneConfig, device: Any) -> DataLoader[Any]:
        p = config.params
        kwargs: dict[str, Any] = {}
        if config.loader_workers and config.prefetch_factor:
            kwargs["prefetch_factor"] = config.prefetch_factor
        return DataLoader(
            Synthetic(64 * config.batch_size, p["seq"], p["vocab"]),
            batch_size=config.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=config.loader_workers,
            pin_memory=config.pin_memory,
            persistent_workers=config.loader_workers > 0,
            **kwargs,
        )


target = TinyTarget()
