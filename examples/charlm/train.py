"""Train a small character-level language model on CPU: acceptrun's demo workload.

A two-layer GRU reads the bundled public-domain texts (data/corpus.txt) and learns to
predict the next character. With the defaults it trains for about 40 seconds on two
idle CPU cores and reaches a next-character accuracy of 0.64 on held-out text.

    python train.py                    # standalone: records a local run under .acceptrun/
    acceptrun run spec.toml            # supervised: preflight, data check, verdict
    CHARLM_STEPS=30 python train.py    # a few-second smoke run, for tests

The run is deterministic: the same machine, the same torch and the same settings give
the same losses, the same accuracy and a byte-identical out/model.safetensors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

import acceptrun


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="data/corpus.txt", help="training text, UTF-8")
    p.add_argument("--out-dir", default="out", help="where model.safetensors goes")
    # CHARLM_STEPS shortens the run for tests without editing the spec's command.
    p.add_argument("--steps", type=int, default=int(os.environ.get("CHARLM_STEPS", "1000")))
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    p.add_argument("--block-size", type=int, default=64, help="characters per training sequence")
    p.add_argument("--embed", type=int, default=64, help="character embedding width")
    p.add_argument("--hidden", type=int, default=128, help="GRU hidden size")
    p.add_argument("--layers", type=int, default=2, help="stacked GRU layers")
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm; 0 = off")
    p.add_argument("--eval-interval", type=int, default=200, help="steps between evaluations")
    p.add_argument("--seed", type=int, default=1337)
    return p.parse_args()


def make_deterministic(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    # A fixed thread count, because float sums split across threads in a different way
    # round differently; two also keeps the demo polite on a shared machine.
    torch.set_num_threads(min(2, os.cpu_count() or 1))


def split_text(data: torch.Tensor, pieces: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut the text into equal pieces and hold out every 10th one (10% for validation).

    Spread-out pieces make the validation set sample the whole corpus; a plain "last
    10%" would hold out only the end of the last text, unlike most of what is trained on.
    """
    chunks = torch.tensor_split(data, pieces)
    train = torch.cat([c for i, c in enumerate(chunks) if i % 10 != 9])
    val = [c for i, c in enumerate(chunks) if i % 10 == 9]
    return train, torch.stack([c[: min(len(v) for v in val)] for c in val])


class CharGRU(nn.Module):
    """Embedding, stacked GRU, linear head: next-character logits at every position."""

    def __init__(self, vocab_size: int, embed: int, hidden: int, layers: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.gru = nn.GRU(embed, hidden, layers, batch_first=True, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(idx))  # (batch, time, hidden); starts from a zero state
        return self.head(self.drop(out))  # (batch, time, vocab)


@torch.no_grad()
def evaluate(model: nn.Module, val: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy and next-character accuracy over the held-out pieces.

    The GRU reads each piece from its first character, so every prediction sees all the
    text before it in that piece (a few hundred characters, more than in training).
    """
    model.eval()
    x, y = val[:, :-1], val[:, 1:]
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    accuracy = (logits.argmax(-1) == y).float().mean().item()
    model.train()
    return loss, accuracy


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def main() -> None:
    args = parse_args()
    make_deterministic(args.seed)
    run = acceptrun.init()

    text = Path(args.data).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    train, val = split_text(data)
    print(
        f"{len(text):,} characters, vocabulary {len(chars)}, "
        f"train {len(train):,}, validation {val.numel():,}"
    )

    # Batches come from their own generator, so the batch order does not depend on how
    # many random numbers the model's initialisation or dropout have drawn.
    batch_rng = torch.Generator().manual_seed(args.seed)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(
            len(train) - args.block_size - 1, (args.batch_size,), generator=batch_rng
        )
        x = torch.stack([train[i : i + args.block_size] for i in ix])
        y = torch.stack([train[i + 1 : i + 1 + args.block_size] for i in ix])
        return x, y

    model = CharGRU(len(chars), args.embed, args.hidden, args.layers, args.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.layers}-layer GRU, hidden {args.hidden}, {n_params:,} parameters")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    # Everything a bit-exact resume needs: weights, optimizer moments, the batch
    # generator (the RNG states of Python, NumPy and torch are saved with them). On a
    # fresh start nothing is loaded and start is 0.
    start = run.restore(model=model, optimizer=optimizer, batch_rng=batch_rng)
    if start:
        print(f"resumed from the checkpoint of step {start - 1}")

    t0 = time.perf_counter()
    for step in run.steps(start, args.steps):
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr

        with run.data_wait():
            x, y = get_batch()
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()

        # loss.item() every step is fine here: on CPU it costs nothing. On a GPU it is a
        # sync point that stalls the queue; a large model would log every N steps.
        run.log(step, loss=loss.item(), lr=lr, samples=x.shape[0], tokens=x.numel())
        run.maybe_checkpoint(step)  # every checkpoint.every_steps of the spec; async
        if (step + 1) % args.eval_interval == 0 and step + 1 < args.steps:
            val_loss, val_acc = evaluate(model, val)
            run.log(step, val_loss=val_loss, val_accuracy=val_acc)
            print(
                f"step {step + 1:5d}: train loss {loss.item():.4f}, val loss {val_loss:.4f}, "
                f"val accuracy {val_acc:.4f} ({time.perf_counter() - t0:.1f} s)"
            )
    train_seconds = time.perf_counter() - t0

    val_loss, val_acc = evaluate(model, val)
    run.metric("eval/accuracy", val_acc)
    run.metric("eval/loss", val_loss)

    # The vocabulary and the config travel inside the weights file, so the model can be
    # loaded without this script's defaults. Same settings, same bytes, same hash in the
    # run record: hence one metadata key (safetensors writes several in random order)
    # and no output path in it.
    out_path = Path(args.out_dir) / "model.safetensors"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "out_dir"}
    metadata = {"charlm": json.dumps({"vocab": chars, "config": config}, sort_keys=True)}
    save_file(model.state_dict(), str(out_path), metadata=metadata)
    run.output("model", out_path)
    run.finish()

    print(
        f"charlm: {args.steps} steps in {train_seconds:.1f} s, val loss {val_loss:.4f}, "
        f"val accuracy {val_acc:.4f}, weights {out_path}"
    )


if __name__ == "__main__":
    main()
