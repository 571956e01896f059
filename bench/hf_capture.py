"""What AcceptrunCallback's capture costs a Hugging Face Trainer: save vs capture time.

    .venv/bin/python bench/hf_capture.py [--hidden 256] [--layers 4] [--saves 3]

Trains a GPT-2 built from a config (vocabulary 1000, --hidden, --layers; AdamW, so a
checkpoint holds the weights and twice their size of optimizer state) for 2 x --saves
steps on random tokens, saving every 2 steps, as a standalone acceptrun run in a
temporary workspace. For each save it prints the checkpoint's size, the Trainer's own
save (``_save_checkpoint``: safetensors, optimizer, scheduler, RNG, trainer state,
rotation) and acceptrun's capture in ``on_save`` (copy into the store with an xxh3 hash
of every byte, fsync of each file and directory, manifest, LATEST, retention), both in
seconds, and their ratio. Both block the training loop. The load average is printed:
on a shared machine other work moves these figures.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the run's files (a temp dir)")
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hf-capture-"))
    if not opts.keep:  # registered first, so it runs last: after the run closes at exit
        atexit.register(shutil.rmtree, tmp, True)
    os.environ["ACCEPTRUN_WORKSPACE"] = str(tmp / "ws")
    os.chdir(tmp)

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from acceptrun.integrations.transformers import AcceptrunCallback

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            x = torch.randint(0, 1000, (32,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": x, "labels": x}

    config = GPT2Config(
        vocab_size=1000, n_positions=32, n_embd=opts.hidden, n_layer=opts.layers, n_head=4
    )
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        "out", max_steps=2 * opts.saves, save_steps=2, per_device_train_batch_size=4,
        report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1,
    )  # fmt: skip
    callback = AcceptrunCallback("hf-capture")
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback])
    saves: list[float] = []
    original = trainer._save_checkpoint

    def timed_save(*a: object, **k: object) -> None:
        t0 = time.perf_counter()
        original(*a, **k)
        saves.append(time.perf_counter() - t0)

    trainer._save_checkpoint = timed_save  # type: ignore[method-assign]
    load = os.getloadavg()
    trainer.train()
    params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2 {opts.layers} layers x {opts.hidden}: {params / 1e6:.2f} M parameters")
    print(f"{'save':>4} {'MB':>7} {'trainer s':>10} {'capture s':>10} {'MB/s':>7} {'ratio':>6}")
    for n, (save, cap) in enumerate(zip(saves, callback.fr.captures, strict=True), 1):
        mb = cap.bytes / 1e6
        print(
            f"{n:>4} {mb:>7.1f} {save:>10.3f} {cap.seconds:>10.3f} {cap.mb_per_s:>7.0f} "
            f"{cap.seconds / save:>6.2f}"
        )
    print(f"load average before {load}, after {os.getloadavg()}")
    if opts.keep:
        print(f"files kept under {tmp}")


if __name__ == "__main__":
    main()
