"""A tiny GPT-2 learns the characters of a short text with the Hugging Face Trainer.

The model is built from a config and the vocabulary from the text itself: nothing is
downloaded. The two lines marked ``# acceptrun`` make it an accepted run: steps, loss,
evaluation and checkpoints recorded, a restart resumed from the newest verified
checkpoint, ``acceptrun stop`` honoured at the next step. Run it with
``acceptrun run spec.toml`` (README.md).
"""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

from acceptrun.integrations.transformers import AcceptrunCallback  # acceptrun

BLOCK = 64  # characters per training example
torch.set_num_threads(1)  # a model this small runs slower on several threads of a busy CPU
text = Path("data/corpus.txt").read_text()
chars = sorted(set(text))
ids = torch.tensor([chars.index(c) for c in text])
cut = int(len(ids) * 0.9)  # the last 10% of the text is held out for evaluation


class Blocks(torch.utils.data.Dataset):
    """Overlapping windows of BLOCK characters; the model predicts each next one."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return (len(self.ids) - BLOCK) // (BLOCK // 2)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.ids[i * (BLOCK // 2) : i * (BLOCK // 2) + BLOCK]
        return {"input_ids": window, "labels": window}


set_seed(0)
config = GPT2Config(
    vocab_size=len(chars), n_positions=BLOCK, n_embd=64, n_layer=2, n_head=4,
    bos_token_id=0, eos_token_id=0,  # GPT-2's default ids assume its 50257 tokens
)  # fmt: skip
model = GPT2LMHeadModel(config)
args = TrainingArguments(
    "out",
    max_steps=int(os.environ.get("HF_STEPS", "200")),
    per_device_train_batch_size=16,
    learning_rate=3e-3,
    warmup_steps=20,
    lr_scheduler_type="cosine",
    logging_steps=5,
    eval_strategy="steps",
    eval_steps=50,
    save_steps=50,
    save_total_limit=2,  # the Trainer's rotation; acceptrun keeps its own verified copies
    report_to=[],
    use_cpu=True,
    seed=0,
    disable_tqdm=True,
)
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=Blocks(ids[:cut]),
    eval_dataset=Blocks(ids[cut:]),
    callbacks=[AcceptrunCallback()],  # acceptrun
)
trainer.train()
trainer.save_model("out/model")  # registered as outputs model/<file>
