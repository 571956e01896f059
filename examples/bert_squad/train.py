"""Fine-tune BERT-large (or the tiny CPU model) on SQuAD v1.1, with acceptrun's client API.

    acceptrun run spec.toml          # real weights and data: F1 >= 90 to be accepted (GPU)
    acceptrun run spec_tiny.toml     # tiny model, synthetic data, CPU: a smoke run

Without --train-file the data is synthetic (synthetic_squad); without --vocab the
tokenizer is the built-in basic-wordpiece over a generated vocabulary; without
--weights the model is randomly initialised. Each of these is said in the output, in the
metrics (data/synthetic) and in predictions.json. A tune result (``acceptrun tune ...
--out best.toml``) is applied with --tune best.toml: batch size, precision, compile,
AdamW implementation, attention backend and activation checkpointing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model import bert_large_config, build_model, tiny_config
from squad import (
    WordPiece,
    best_spans,
    evaluate,
    examples_from_json,
    load_squad,
    make_features,
    synthetic_squad,
)

import acceptrun
from acceptrun.tune import TuneConfig, read_best


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--train-file", help="SQuAD v1.1 train JSON (default: synthetic data)")
    p.add_argument("--predict-file", help="SQuAD v1.1 dev JSON (default: synthetic data)")
    p.add_argument("--vocab", help="BERT vocab.txt (default: a generated vocabulary)")
    p.add_argument("--weights", help="local model directory or state dict (default: random init)")
    p.add_argument("--tiny", action="store_true", help="2 layers, hidden 64: for CPUs")
    p.add_argument(
        "--synthetic-questions", type=int, default=512, help="size of synthetic train data"
    )
    p.add_argument("--epochs", type=float, default=2.0, help="passes over the training features")
    p.add_argument("--steps", type=int, help="optimizer steps (overrides --epochs)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16"), default="fp32")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--warmup", type=float, default=0.1, help="share of steps with linear warm-up")
    p.add_argument("--seq", type=int, default=384)
    p.add_argument("--doc-stride", type=int, default=128)
    p.add_argument("--max-query", type=int, default=64)
    p.add_argument("--eval-questions", type=int, help="evaluate on the first N dev questions")
    p.add_argument(
        "--tune", metavar="FILE", help="apply a configuration from `acceptrun tune --out`"
    )
    p.add_argument("--out-dir", default="out")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = TuneConfig(batch_size=args.batch_size, precision=args.precision)
    if args.tune:
        cfg = read_best(args.tune)
        print(f"tune configuration from {args.tune}: {cfg.label()}")
    run = acceptrun.init()

    synthetic = not args.train_file
    if synthetic:
        train_ex = examples_from_json(synthetic_squad(args.synthetic_questions, seed=args.seed))
        dev_ex = examples_from_json(
            synthetic_squad(max(args.synthetic_questions // 8, 16), seed=args.seed + 1)
        )
    else:
        train_ex = load_squad(args.train_file)
        dev_ex = load_squad(args.predict_file) if args.predict_file else train_ex[:1000]
    if args.eval_questions:
        dev_ex = dev_ex[: args.eval_questions]
    if args.vocab:
        tok = WordPiece.from_file(args.vocab)
    else:
        tok = WordPiece.generated(
            [e.context for e in train_ex + dev_ex] + [e.question for e in train_ex + dev_ex]
        )
    data_label = "synthetic" if synthetic else "squad-v1.1"
    print(
        f"data: {data_label}, {len(train_ex)} train / {len(dev_ex)} dev questions; tokenizer: {tok.kind}"
    )

    train_f = make_features(
        train_ex, tok, seq=args.seq, doc_stride=args.doc_stride, max_query=args.max_query
    )
    dev_f = make_features(
        dev_ex, tok, seq=args.seq, doc_stride=args.doc_stride, max_query=args.max_query
    )
    cols = ("input_ids", "token_type_ids", "attention_mask")
    train_t = {c: torch.tensor([getattr(f, c) for f in train_f]) for c in cols}
    train_t["start_positions"] = torch.tensor([f.start_position for f in train_f])
    train_t["end_positions"] = torch.tensor([f.end_position for f in train_f])

    config = (tiny_config if args.tiny else bert_large_config)(vocab_size=max(len(tok), 30522))
    model = build_model(config, args.weights).to(device)
    print(f"model: BertForQuestionAnswering, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{'weights ' + args.weights if args.weights else 'random init'}")  # fmt: skip
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = cfg.adamw(model.parameters(), lr=args.lr, weight_decay=0.01)
    batch = cfg.batch_size
    steps = args.steps or max(1, math.ceil(args.epochs * len(train_f) / batch))
    warm = max(1, int(args.warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm)))
    )
    order = torch.Generator().manual_seed(args.seed)
    start = run.restore(model=model, optimizer=optimizer, scheduler=sched, order=order)
    step_model = torch.compile(model, mode=cfg.compile) if cfg.compile else model
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.precision == "tf32"

    model.train()
    for step in run.steps(start, steps):
        with run.data_wait():
            idx = torch.randint(len(train_f), (batch,), generator=order)
            b = {k: v[idx].to(device, non_blocking=True) for k, v in train_t.items()}
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            loss = step_model(**b).loss
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sched.step()
        run.log(
            step,
            loss=loss.item(),
            lr=sched.get_last_lr()[0],
            samples=batch,
            tokens=batch * args.seq,
        )
        run.maybe_checkpoint(step)

    scores, predictions = predict(model, dev_ex, dev_f, device, dtype)
    run.metric("f1", scores["f1"])
    run.metric("em", scores["exact_match"])
    run.metric("data/synthetic", 1.0 if synthetic else 0.0)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "predictions.json"
    meta = {"data": data_label, "tokenizer": tok.kind, "weights": args.weights or "random init"}
    path.write_text(json.dumps({**meta, **scores, "predictions": predictions}, indent=1))
    run.output("predictions", path)
    run.finish()
    print(
        f"bert-squad ({data_label}): {steps} steps, F1 {scores['f1']:.2f}, EM {scores['exact_match']:.2f}"
    )


@torch.no_grad()
def predict(
    model: Any, examples: list[Any], features: list[Any], device: Any, dtype: Any
) -> tuple[dict[str, float], dict[str, str]]:
    model.eval()
    starts: list[list[float]] = []
    ends: list[list[float]] = []
    for i in range(0, len(features), 64):
        chunk = features[i : i + 64]
        b = {c: torch.tensor([getattr(f, c) for f in chunk], device=device)
             for c in ("input_ids", "token_type_ids", "attention_mask")}  # fmt: skip
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            out = model(**b)
        starts += out.start_logits.float().cpu().tolist()
        ends += out.end_logits.float().cpu().tolist()
    model.train()
    predictions = best_spans(features, examples, starts, ends)
    return evaluate(examples, predictions), predictions


if __name__ == "__main__":
    main()
