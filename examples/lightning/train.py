"""Two moons with a small MLP in PyTorch Lightning; the two lines marked `# acceptrun`
make it an accepted run (docs/frameworks/lightning.md).

    acceptrun run spec.toml                          # supervised: restarts, verdict, report
    acceptrun run --inject kill@step=250 spec.toml   # killed mid-epoch, resumed exactly
    python train.py                                  # standalone: a local run in .acceptrun/

About 600 steps of 64 points; on two idle CPU cores the fit takes about 10 seconds and
reaches a validation accuracy near 0.99.
"""

from __future__ import annotations

import math
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acceptrun.integrations.lightning import AcceptrunCallback  # acceptrun


def moons(n: int, noise: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two interleaved half circles, labels 0 and 1, with Gaussian noise."""
    label = torch.randint(0, 2, (n,), generator=g)
    angle = torch.rand(n, generator=g) * math.pi
    x = torch.stack([torch.cos(angle), torch.sin(angle)], 1)
    x = torch.where(label[:, None] == 1, torch.stack([1 - x[:, 0], 0.5 - x[:, 1]], 1), x)
    return x + noise * torch.randn(n, 2, generator=g), label


class MoonNet(pl.LightningModule):
    def __init__(self, hidden: int = 32, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(2, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, hidden),
            nn.ReLU(), nn.Linear(hidden, 2),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def on_validation_epoch_end(self) -> None:
        m = self.trainer.callback_metrics
        print(
            f"step {self.global_step:4d}: val loss {m['val_loss']:.4f}, val acc {m['val_acc']:.4f}"
        )

    def configure_optimizers(self) -> dict[str, object]:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.max_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    pl.seed_everything(0, verbose=False)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # float sums in a fixed order: the same weights every run
    g = torch.Generator().manual_seed(0)
    train, val = TensorDataset(*moons(2048, 0.15, g)), TensorDataset(*moons(512, 0.15, g))
    trainer = pl.Trainer(
        max_steps=int(os.environ.get("STEPS", "600")),
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=100,  # every 100 steps, across epoch ends
        check_val_every_n_epoch=None,
        callbacks=[
            ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=100, save_last=True),
            AcceptrunCallback(),  # acceptrun
        ],
    )
    trainer.fit(
        MoonNet(),
        DataLoader(train, batch_size=64, shuffle=True),
        DataLoader(val, batch_size=256),
    )


if __name__ == "__main__":
    main()
