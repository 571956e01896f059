"""What `acceptrun tune` needs from a workload: the tune target interface.

A target builds a model, its optimizer, a batch maker and a loss function for one
:class:`TuneConfig`, and says how many FLOPs one sample costs. `acceptrun tune` owns the
precision (autocast, GradScaler, TF32), ``torch.compile`` and the attention backend; the
target owns what only it can do: the batch size of its batches, activation checkpointing
and the optimizer (through :meth:`TuneConfig.adamw`, which applies the fused / foreach
choice).

A TARGET on the command line is ``module:attr`` or ``path/to/file.py:attr``; ``attr`` is an
instance, or a class or function called without arguments to make one::

    class Tiny(TuneTarget):
        name = "tiny"
        def default_config(self) -> TuneConfig:
            return TuneConfig(batch_size=8)
        def build(self, config, device):
            model = Net().to(device)
            opt = config.adamw(model.parameters(), lr=1e-3)
            make_batch = lambda n: torch.randn(n, 64, device=device)
            loss_fn = lambda model, x: model(x).square().mean()
            return Built(model, opt, make_batch, loss_fn)
        def flops_per_sample(self, config):
            return 6 * 64 * 64

This module imports no torch: the command line loads it to describe targets.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from acceptrun.errors import UserError

__all__ = [
    "ATTENTION_BACKENDS",
    "COMPILE_MODES",
    "OPTIMIZER_IMPLS",
    "PRECISIONS",
    "Built",
    "TuneConfig",
    "TuneTarget",
    "load_target",
]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# torch.compile modes; None (written "none") is eager.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
# "default" leaves the choice to torch (foreach on CUDA, the for-loop on CPU).
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
# torch.nn.attention.SDPBackend members by their short names.
ATTENTION_BACKENDS = ("math", "flash", "efficient", "cudnn")


@dataclass(kw_only=True)
class TuneConfig:
    """One configuration of a training step: what a trial runs and what tune writes out."""

    batch_size: int
    """Samples per optimizer step."""
    precision: str = "fp32"
    """fp32, tf32 (CUDA matmuls in TF32), bf16 (autocast) or fp16 (autocast + GradScaler)."""
    compile: str | None = None
    """A torch.compile mode (default, max-autotune-no-cudagraphs, reduce-overhead), or None for eager."""
    optimizer: str = "default"
    """AdamW implementation: default (torch's choice), foreach or fused."""
    attention: str | None = None
    """SDPA backend forced with sdpa_kernel: math, flash, efficient, cudnn; None lets torch choose."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more compute."""
    loader_workers: int = 0
    """DataLoader worker processes (targets with a data loader)."""
    pin_memory: bool = False
    """Page-locked host batches for faster copies to the GPU."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (None: torch's default of 2 when workers > 0)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Target-specific settings (sequence length, model size, ...), passed through untouched."""

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            problems.append(f"batch_size is {self.batch_size!r}; use a positive integer")
        if self.precision not in PRECISIONS:
            problems.append(f"precision is {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.compile is not None and self.compile not in COMPILE_MODES:
            problems.append(
                f"compile is {self.compile!r}; use one of {', '.join(COMPILE_MODES)} or none"
            )
        if self.optimizer not in OPTIMIZER_IMPLS:
            problems.append(
                f"optimizer is {self.optimizer!r}; use one of {', '.join(OPTIMIZER_IMPLS)}"
            )
        if self.attention is not None and self.attention not in ATTENTION_BACKENDS:
            problems.append(
                f"attention is {self.attention!r}; use one of {', '.join(ATTENTION_BACKENDS)} or none"
            )
        if self.loader_workers < 0:
            problems.append(f"loader_workers is {self.loader_workers}; use 0 or more")
        if problems:
            raise UserError("tune config: " + "; ".join(problems))

    def replace(self, **changes: Any) -> TuneConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (None values kept, so a config round-trips exactly)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneConfig:
        """The inverse of :meth:`to_dict`; unknown keys are an error that names them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(
                f"tune config: unknown keys {unknown}; known keys are {', '.join(sorted(known))}"
            )
        return cls(**data)

    def label(self) -> str:
        """A short name for tables: ``bf16 b64 compile=default fused ckpt``."""
        parts = [self.precision, f"b{self.batch_size}"]
        if self.compile:
            parts.append(f"compile={self.compile}")
        if self.optimizer != "default":
            parts.append(self.optimizer)
        if self.attention:
            parts.append(f"sdpa={self.attention}")
        if self.activation_checkpointing:
            parts.append("ckpt")
        if self.loader_workers or self.pin_memory or self.prefetch_factor:
            loader = f"w{self.loader_workers}"
            if self.pin_memory:
                loader += "+pin"
            if self.prefetch_factor:
                loader += f"+pf{self.prefetch_factor}"
            parts.append(loader)
        return " ".join(parts)

    def adamw(self, params: Any, **kwargs: Any) -> Any:
        """``torch.optim.AdamW(params, **kwargs)`` with this config's fused / foreach choice.

        >>> opt = config.adamw(model.parameters(), lr=3e-5, weight_decay=0.01)
        """
        import torch

        if self.optimizer == "fused":
            kwargs.setdefault("fused", True)
        elif self.optimizer == "foreach":
            kwargs.setdefault("foreach", True)
        return torch.optim.AdamW(params, **kwargs)


class Built(NamedTuple):
    """What :meth:`TuneTarget.build` returns."""

    model: Any
    """The ``torch.nn.Module`` (on the device, fp32 weights: autocast handles precision)."""
    optimizer: Any
    """Its optimizer, ideally from :meth:`TuneConfig.adamw`."""
    make_batch: Callable[[int], Any]
    """``make_batch(batch_size)`` -> a batch on the device, ready for ``loss_fn``."""
    loss_fn: Callable[[Any, Any], Any]
    """``loss_fn(model, batch)`` -> a scalar loss tensor (the model may be compiled)."""


class TuneTarget(abc.ABC):
    """Base class of tune targets; subclass it, or give any object with these members.

    A subclass must define :meth:`default_config` and :meth:`build`; one that misses
    either cannot be instantiated (Python names the missing method).
    """

    name: str = "target"
    """Name of the workload, used in run ids and tables."""
    uses_sdpa: bool = False
    """True when the model's attention calls F.scaled_dot_product_attention (backend trials)."""
    supports_checkpointing: bool = False
    """True when build() honours ``config.activation_checkpointing``."""

    @abc.abstractmethod
    def default_config(self) -> TuneConfig:
        """The job's configuration as it runs today: the baseline every gain is measured from."""

    @abc.abstractmethod
    def build(self, config: TuneConfig, device: Any) -> Built:
        """Model, optimizer, batch maker and loss function for ``config`` on ``device``."""

    def flops_per_sample(self, config: TuneConfig) -> float | None:
        """Training FLOPs (forward and backward) of one sample; None when unknown (no MFU)."""
        return None

    def dataloader(self, config: TuneConfig, device: Any) -> Iterable[Any] | None:
        """An iterable of batches honouring the loader fields of ``config``, or None.

        Targets without a data loader keep this default; loader trials are then skipped.
        """
        return None


REQUIRED = ("default_config", "build")


def _import_attr(ref: str) -> Any:
    module_part, sep, attr = ref.rpartition(":")
    if not sep or not module_part or not attr:
        raise UserError(
            f"tune target {ref!r} is not MODULE:ATTR or FILE.py:ATTR; "
            "e.g. examples/tune_tiny/target.py:target or mypkg.tuning:Target"
        )
    if module_part.endswith(".py") or "/" in module_part:
        path = Path(module_part).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"tune target {ref!r}: {path} is not a file; check the path")
        name = f"_acceptrun_target_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UserError(f"tune target {ref!r}: {path} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        # The file's own directory first, so it can import its neighbours (a model.py).
        sys.path.insert(0, str(path.parent))
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise UserError(
                f"tune target {ref!r}: cannot import module {module_part!r} ({exc}); "
                "check PYTHONPATH or give a file path"
            ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserError(f"tune target {ref!r}: {module_part} has no attribute {attr!r}") from None


def load_target(ref: str) -> Any:
    """The target named by ``ref`` (``module:attr`` or ``file.py:attr``), checked.

    A class or a function is called without arguments to make the target.

    >>> load_target("examples/tune_tiny/target.py:target").name
    'tiny-encoder'
    """
    obj = _import_attr(ref)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "build")):
        obj = obj()
    missing = [m for m in REQUIRED if not callable(getattr(obj, m, None))]
    if missing:
        raise UserError(
            f"tune target {ref!r} has no {', '.join(m + '()' for m in missing)}; a target needs "
            "default_config() and build(config, device) (see docs/tune.md)"
        )
    default = obj.default_config()
    if not isinstance(default, TuneConfig):
        raise UserError(
            f"tune target {ref!r}: default_config() returned {type(default).__name__}, "
            "not a TuneConfig"
        )
    return obj


def target_name(target: Any) -> str:
    """The target's name, or its class name when it has none."""
    return str(getattr(target, "name", None) or type(target).__name__)
