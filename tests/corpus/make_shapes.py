"""Write tests/corpus/shapes/: the printed progress of widely used training scripts.

Each shape is a small run (two or three short epochs) printed in the documented format
of its project, with a made-up loss. ``<name>.log`` holds the bytes the script prints
(progress bars redrawn with carriage returns, colour codes where the project uses them);
``<name>.toml`` holds where the format comes from, the ``[progress]`` keys that read it,
and the truth: for each step line (lines split on \\r and \\n, empty ones dropped, as the
progress reader splits them) its index, its true step and its loss, and the lines where a
resumed script would start printing again (an epoch's first line, or any step line of a
script that counts its steps globally).

The true step is the script's own counter as if it never started again: ``(epoch -
first_epoch) * batches + batch`` for a batch counter, the printed step for a global one.
The formats are written from each project's documentation and logs, not copied code.

Run ``python tests/corpus/make_shapes.py`` after changing a shape; the files are committed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).with_name("shapes")


def loss_at(step: int) -> float:
    """A made-up, falling loss, with 3 decimals (as fairseq prints it; the others print more)."""
    return round(2.5 * 0.985**step + 0.013 * (step % 7), 3)


@dataclass
class Shape:
    name: str
    source: str  # the project
    reference: str  # where its printed format is documented or shown
    progress: dict[str, object]  # the [progress] keys that read it
    epochs: int
    batches: int  # per epoch
    every: int  # a line every this many batches
    first_epoch: int  # the number of the script's first epoch
    first_batch: int  # 0: the index of the batch just run; 1: the count of batches done
    render: Callable[[int, int, int, float], str]  # (epoch, batch, batches, loss) -> text
    header: Callable[[int], str] | None = None  # an epoch's own line (Keras's "Epoch 3/10")
    glue: str = "\n"  # what follows each line ("\r" for a redrawn bar)
    global_counter: bool = False  # the script prints one count over the whole run
    notes: str = ""
    extra: list[str] = field(default_factory=list)  # lines that are no steps, before each epoch


def _bar(pct: float, width: int = 10) -> str:
    full = int(pct * width)
    return "█" * full + " " * (width - full)


SHAPES: list[Shape] = [
    Shape(
        "pytorch_imagenet",
        "pytorch/examples imagenet/main.py (ProgressMeter)",
        "https://github.com/pytorch/examples/blob/main/imagenet/main.py",
        {
            "pattern": r"Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<batch>\d+)/(?P<total>\d+)\].*\tLoss (?P<loss>[0-9.e+-]+)"
        },
        3,
        50,
        10,
        0,
        0,
        lambda e, b, n, x: (
            f"Epoch: [{e}][{b:>3}/{n}]\tTime  0.512 ( 0.530)\tData  0.002 ( 0.010)"
            f"\tLoss {x:.4e} ({x:.4e})\tAcc@1   0.39 (  0.39)\tAcc@5   1.95 (  1.95)"
        ),
    ),
    Shape(
        "pytorch_mnist",
        "pytorch/examples mnist/main.py",
        "https://github.com/pytorch/examples/blob/main/mnist/main.py",
        {
            "pattern": r"Train Epoch: (?P<epoch>\d+) \[(?P<batch>\d+)/(?P<total>\d+) .*Loss: (?P<loss>[0-9.]+)",
            "first_epoch": 1,
        },
        2,
        600,
        10,
        1,
        0,  # batch_idx * len(data): the counter is in samples (64 a batch)
        lambda e, b, n, x: (
            f"Train Epoch: {e} [{b * 64}/{n * 64} ({100.0 * b / n:.0f}%)]\tLoss: {x:.6f}"
        ),
        notes="the counter counts samples (batch_idx * 64): steps are samples",
    ),
    Shape(
        "keras3_fit",
        "Keras 3 model.fit(verbose=1) progress bar",
        "https://keras.io/api/models/model_training_apis/#fit-method",
        {
            "pattern": r"^Epoch (?P<epoch>\d+)/\d+$|^\s*(?P<batch>\d+)/(?P<total>\d+) ━.* - loss: (?P<loss>[0-9.]+)",
            "first_epoch": 1,
        },
        3,
        20,
        1,
        1,
        1,
        lambda e, b, n, x: (
            f"{b:>2}/{n} {'━' * (20 * b // n)}{'━' * (20 - 20 * b // n)} 0s 5ms/step - loss: {x:.4f}"
        ),
        header=lambda e: f"Epoch {e}/3",
        glue="\r",
    ),
    Shape(
        "keras2_fit",
        "tf.keras 2 model.fit(verbose=1) progress bar",
        "https://www.tensorflow.org/api_docs/python/tf/keras/Model#fit",
        {
            "pattern": r"^Epoch (?P<epoch>\d+)/\d+$|^\s*(?P<batch>\d+)/(?P<total>\d+) \[.* - loss: (?P<loss>[0-9.]+)",
            "first_epoch": 1,
        },
        2,
        25,
        1,
        1,
        1,
        lambda e, b, n, x: (
            f"{b:>2}/{n} [{'=' * (29 * b // n)}>{'.' * (29 - 29 * b // n)}] - ETA: 0s - loss: {x:.4f}"
        ),
        header=lambda e: f"Epoch {e}/2",
        glue="\r",
    ),
    Shape(
        "tqdm_epoch_bar",
        "tqdm over a DataLoader, a new bar each epoch (no epoch printed)",
        "https://tqdm.github.io/docs/tqdm/",
        {"pattern": r"train:.*\| *(?P<batch>\d+)/(?P<total>\d+) \[.*loss=(?P<loss>[0-9.]+)"},
        3,
        40,
        1,
        0,
        1,
        lambda e, b, n, x: (
            f"train: {100 * b // n:3d}%|{_bar(b / n)}| {b}/{n} [00:01<00:02, 19.87it/s, loss={x:.4f}]"
        ),
        glue="\r",
        notes="no epoch is printed: each time the bar starts again an epoch is counted",
    ),
    Shape(
        "timm_train",
        "timm train.py",
        "https://github.com/huggingface/pytorch-image-models/blob/main/train.py",
        {
            "pattern": r"Train: (?P<epoch>\d+) \[\s*(?P<batch>\d+)/(?P<total>\d+) .*Loss: (?P<loss>[0-9.]+)"
        },
        2,
        100,
        25,
        0,
        0,
        lambda e, b, n, x: (
            f"Train: {e} [{b:>4d}/{n} ({100.0 * b / n:>3.0f}%)]  Loss: {x:#.4f} ({x:#.3g})  "
            "Time: 0.215s, 1190.79/s  (0.233s, 1098.53/s)  LR: 1.000e-05  Data: 0.010 (0.013)"
        ),
    ),
    Shape(
        "mmengine",
        "mmengine's LoggerHook, epoch-based loop",
        "https://mmengine.readthedocs.io/en/latest/advanced_tutorials/logging.html",
        {
            "pattern": r"Epoch\(train\) +\[(?P<epoch>\d+)\]\[\s*(?P<batch>\d+)/(?P<total>\d+)\].*loss: (?P<loss>[0-9.]+)",
            "first_epoch": 1,
        },
        2,
        60,
        10,
        1,
        1,
        lambda e, b, n, x: (
            f"12/07 11:00:00 - mmengine - INFO - Epoch(train)  [{e}][{b:>2}/{n}]  "
            f"lr: 1.0000e-01  eta: 0:01:00  time: 0.0500  data_time: 0.0100  memory: 1000  loss: {x:.4f}"
        ),
    ),
    Shape(
        "fairseq",
        "fairseq-train, --log-format simple",
        "https://fairseq.readthedocs.io/en/latest/getting_started.html#training-a-new-model",
        {
            "pattern": r"epoch (?P<epoch>\d+):\s+(?P<batch>\d+) / (?P<total>\d+) loss=(?P<loss>[0-9.]+)",
            "first_epoch": 1,
        },
        2,
        250,
        50,
        1,
        1,
        lambda e, b, n, x: (
            f"epoch {e:03d}:    {b} / {n} loss={x:.3f}, nll_loss=3.1, ppl=8.6, wps=12000, "
            f"ups=3.1, wpb=3800, bsz=128, num_updates={(e - 1) * n + b}, lr=0.0005, gnorm=1.2, train_wall=16, wall=33"
        ),
    ),
    Shape(
        "hf_trainer_dict",
        "Hugging Face transformers Trainer, logging_steps = 5",
        "https://huggingface.co/docs/transformers/main_classes/trainer",
        {
            "pattern": r"\{'loss': (?P<loss>[0-9.]+),.*'epoch': (?P<epoch>[0-9.]+)\}",
            "epoch_length": 20,
        },
        3,
        20,
        5,
        0,
        1,
        lambda e, b, n, x: (
            f"{{'loss': {x}, 'grad_norm': 1.234, 'learning_rate': 4.9e-05, "
            f"'epoch': {round(e + b / n, 2)}}}"
        ),
        notes="the Trainer prints epochs done as a fraction: step = round(epoch * epoch_length)",
    ),
    Shape(
        "lightning_bar",
        "PyTorch Lightning's TQDMProgressBar",
        "https://lightning.ai/docs/pytorch/stable/common/progress_bar.html",
        {
            "pattern": r"Epoch (?P<epoch>\d+):.*\| *(?P<batch>\d+)/(?P<total>\d+) \[.*train_loss=(?P<loss>[0-9.]+)"
        },
        3,
        30,
        1,
        0,
        1,
        lambda e, b, n, x: (
            f"Epoch {e}: {100 * b // n:3d}%|{_bar(b / n)}| {b}/{n} "
            f"[00:01<00:02, 19.87it/s, v_num=0, train_loss={x:.4f}]"
        ),
        glue="\r",
    ),
    Shape(
        "nanogpt",
        "karpathy/nanoGPT train.py",
        "https://github.com/karpathy/nanoGPT/blob/master/train.py",
        {"pattern": r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+)"},
        1,
        200,
        10,
        0,
        0,
        lambda e, b, n, x: f"iter {b}: loss {x:.4f}, time 12.34ms, mfu 5.67%",
        global_counter=True,
    ),
    Shape(
        "deepspeed_pipe",
        "DeepSpeed pipeline engine's progress line",
        "https://www.deepspeed.ai/tutorials/pipeline/",
        {"pattern": r"steps: (?P<step>\d+) loss: (?P<loss>[0-9.]+)"},
        1,
        100,
        10,
        0,
        1,
        lambda e, b, n, x: f"steps: {b} loss: {x:.4f} iter time (s): 0.512 samples/sec: 250.000",
        global_counter=True,
    ),
    Shape(
        "torchtitan",
        "pytorch/torchtitan train.py (colour codes in the line)",
        "https://github.com/pytorch/torchtitan",
        {"pattern": r"step:\s*(?P<step>\d+)\s+\S*loss:\s*(?P<loss>[0-9.]+)"},
        1,
        100,
        10,
        0,
        1,
        lambda e, b, n, x: (
            f"[rank0]:[titan] 2026-12-07 11:00:00,000 - root - INFO - \x1b[31mstep: {b:2}  "
            f"\x1b[32mloss: {x:7.4f}  \x1b[33mmemory:  9.10GiB(11.5%)  \x1b[34mtps: 6,123  "
            "\x1b[36mtflops: 91.2  \x1b[35mmfu: 9.2%\x1b[39m"
        ),
        global_counter=True,
    ),
    Shape(
        "megatron",
        "NVIDIA Megatron-LM training_log",
        "https://github.com/NVIDIA/Megatron-LM",
        {
            "pattern": r"iteration\s+(?P<step>\d+)/\s*(?P<total_steps>\d+) \|.* lm loss: (?P<loss>[0-9.E+-]+)"
        },
        1,
        100,
        10,
        0,
        1,
        lambda e, b, n, x: (
            f" [2026-12-07 11:00:00] iteration {b:>8}/{n:>8} | consumed samples: "
            f"{b * 128:>12} | elapsed time per iteration (ms): 512.3 | learning rate: 1.000E-04 | "
            f"global batch size:   128 | lm loss: {x:.6E} | loss scale: 1.0 | grad norm: 1.234 | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |"
        ),
        global_counter=True,
    ),
    Shape(
        "detectron2",
        "detectron2 CommonMetricPrinter",
        "https://detectron2.readthedocs.io/en/latest/modules/utils.html#detectron2.utils.events.CommonMetricPrinter",
        {"pattern": r"iter: (?P<step>\d+)\s+total_loss: (?P<loss>[0-9.]+)"},
        1,
        200,
        20,
        0,
        0,
        lambda e, b, n, x: (
            f"[12/07 11:00:00 d2.utils.events]:  eta: 0:10:00  iter: {b + 19}  "
            f"total_loss: {x:.4f}  loss_cls: 0.6  loss_box_reg: 0.5  time: 0.5000  data_time: 0.0100  "
            "lr: 0.00019981  max_mem: 2000M"
        ),
        global_counter=True,
        notes="printed every 20 iterations, at iter 19, 39, ...",
    ),
    Shape(
        "ultralytics_yolo",
        "Ultralytics YOLO training bar",
        "https://docs.ultralytics.com/modes/train/",
        {
            "pattern": r"^\s*(?P<epoch>\d+)/\d+\s+\S+G\s+(?P<loss>[0-9.]+)\s.*\|\s*(?P<batch>\d+)/(?P<total>\d+) \[",
            "first_epoch": 1,
        },
        3,
        10,
        1,
        1,
        1,
        lambda e, b, n, x: (
            f"      {e}/3      2.1G      {x:.4f}      2.345      1.456         32        640: "
            f"{100 * b // n:3d}%|{_bar(b / n)}| {b}/{n} [00:02<00:03,  2.00it/s]"
        ),
        glue="\r",
        header=lambda e: (
            "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"
        ),
    ),
    Shape(
        "pytorch_tutorial_steps",
        "yunjey/pytorch-tutorial (Epoch [e/n], Step [i/n], widely copied)",
        "https://github.com/yunjey/pytorch-tutorial",
        {
            "pattern": r"Epoch \[(?P<epoch>\d+)/\d+\], Step \[(?P<batch>\d+)/(?P<total>\d+)\], Loss: (?P<loss>[0-9.]+)",
            "first_epoch": 1,
        },
        3,
        60,
        20,
        1,
        1,
        lambda e, b, n, x: f"Epoch [{e}/3], Step [{b}/{n}], Loss: {x:.4f}",
    ),
    Shape(
        "torchvision_reference",
        "torchvision references/classification (MetricLogger)",
        "https://github.com/pytorch/vision/tree/main/references/classification",
        {
            "pattern": r"Epoch: \[(?P<epoch>\d+)\]\s+\[\s*(?P<batch>\d+)/(?P<total>\d+)\].*loss: (?P<loss>[0-9.]+)"
        },
        2,
        80,
        20,
        0,
        0,
        lambda e, b, n, x: (
            f"Epoch: [{e}]  [{b:>2}/{n}]  eta: 0:00:10  lr: 0.1  img/s: 512.3  "
            f"loss: {x:.4f} ({x:.4f})  acc1: 0.0000 (0.0000)  time: 0.1000  data: 0.0100  max mem: 1000"
        ),
    ),
]


def batches_printed(shape: Shape) -> Iterator[int]:
    """The batch numbers a line is printed at, in the shape's own count."""
    if shape.first_batch == 0:
        yield from range(0, shape.batches, shape.every)
    else:
        yield from range(shape.every, shape.batches + 1, shape.every)


def write(shape: Shape) -> None:
    text, lines, starts = "", [], []
    index = 0
    for e in range(shape.first_epoch, shape.first_epoch + shape.epochs):
        epoch_start = index
        if shape.header is not None:
            text += shape.header(e) + "\n"
            index += 1
        for b in batches_printed(shape):
            step = b if shape.global_counter else (e - shape.first_epoch) * shape.batches + b
            if shape.name == "detectron2":
                step = b + 19
            if shape.name == "pytorch_mnist":
                step = ((e - shape.first_epoch) * shape.batches + b) * 64
            loss = loss_at(step)
            if shape.global_counter:
                starts.append(index)
            text += shape.render(e, b, shape.batches, loss) + shape.glue
            lines.append((index, step, loss))
            index += 1
        if not shape.global_counter:
            starts.append(epoch_start)
        if shape.glue == "\r":
            text += "\n"
    # Check the indices against how the reader splits lines.
    split = [p for p in re.split(r"\r\n|\r|\n", text) if p]
    assert len(split) == index, (shape.name, len(split), index)
    (OUT / f"{shape.name}.log").write_bytes(text.encode())
    keys = "\n".join(f"{k} = {_toml(v)}" for k, v in shape.progress.items())
    truth = ",\n".join(f"  [{i}, {s}, {x!r}]" for i, s, x in lines)
    notes = f"notes = {_toml(shape.notes)}\n" if shape.notes else ""
    (OUT / f"{shape.name}.toml").write_text(
        f"# The printed progress of {shape.source}; written by tests/corpus/make_shapes.py.\n"
        f"source = {_toml(shape.source)}\nreference = {_toml(shape.reference)}\n{notes}"
        f"# A resumed script starts printing again at these lines (0-based, split on \\r and \\n).\n"
        f"resume_lines = {starts}\n"
        f"# [line, true step, loss] of each step line.\ntruth = [\n{truth},\n]\n\n"
        f"[progress]\n{keys}\n"
    )


def _toml(value: object) -> str:
    if isinstance(value, str):
        return "'" + value + "'" if "'" not in value and "\n" not in value else repr(value)
    return str(value)


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for shape in SHAPES:
        write(shape)
    print(f"{len(SHAPES)} shapes in {OUT}")
