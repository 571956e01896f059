"""The tune loop: time the job's default, then sweep one axis at a time, keeping the best.

::

    probe the device (child)
    warm-up: the default, run once and not compared                 the machine's cold start
    baseline: the target's default_config()                         the reference of gains
    precision      fp32, tf32 (CUDA), bf16, fp16 + GradScaler (CUDA)
    batch          OOM search (child under a memory cap), then time a few candidates
    optimizer      AdamW foreach, fused
    attention      SDPA backends, when the model uses SDPA
    checkpointing  at the chosen batch; with a memory bound, also at the larger batch it allows
    loader         workers, pin_memory, prefetch, when the target has a data loader
    compile        default, max-autotune-no-cudagraphs, reduce-overhead (CUDA)

Each trial is a fresh child process (:mod:`acceptrun.tune.trial`). A candidate replaces
the current best only when it is faster by more than ``min_gain`` (timing noise) and its
numerics agree: its loss after ``check_steps`` steps within ``tolerance`` (relative) of
the fp32 eager run of the same batch size, which is timed too when it is missing. A
trial that fails (an error, an OOM, a crash, a timeout) is recorded and skipped; the
parent never dies of it. Past the budget no new trial starts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptrun._util.console import get_logger
from acceptrun.telemetry.peaks import peak_tflops
from acceptrun.tune.search import batch_candidates
from acceptrun.tune.target import TuneConfig, target_name

__all__ = ["AXES", "WARM_UP", "TuneOptions", "TuneReport", "Tuner", "run_child"]

_log = get_logger(__name__)  # the sweep's progress: each trial as it starts

WARM_UP = "warm-up"
"""The axis of the untimed first run of the default, which takes the machine's cold start."""

AXES = ("precision", "batch", "optimizer", "attention", "checkpointing", "loader", "compile")


@dataclass(kw_only=True)
class TuneOptions:
    """How `acceptrun tune` runs."""

    target: str
    """The target reference, module:attr or file.py:attr."""
    device: str | None = None
    """cuda, cuda:1 or cpu; None: CUDA when present."""
    budget: float = 300.0
    """Seconds for the whole sweep; no trial starts after it."""
    warmup: int = 3
    """Untimed steps at the start of each trial (compilation happens here)."""
    steps: int = 10
    """Timed steps per trial; the median and the quartiles come from these."""
    check_steps: int = 3
    """The numerics check compares the loss after this many steps."""
    tolerance: float = 0.05
    """Allowed relative difference of that loss from the fp32 eager run of the same batch."""
    min_gain: float = 0.02
    """A candidate must be this much faster (relative) to replace the current best."""
    axes: tuple[str, ...] = AXES
    """Axes to sweep, in this order."""
    memory_limit: int | None = None
    """Bytes a CPU trial may use beyond torch itself (RLIMIT_AS); bounds the batch search."""
    headroom: float = 0.1
    """Share of GPU memory the batch search leaves free."""
    max_batch: int = 1024
    """The batch search stops here."""
    batch_multiple: int = 1
    """Batch sizes the search bisects to (8 on a GPU: tensor-core tiles)."""
    peak_tflops: float | None = None
    """Peak TFLOP/s for MFU; default: the table of known GPUs (none for CPUs)."""
    seed: int = 0
    """Seed of model initialisation and data in every trial."""
    threads: int | None = None
    """torch threads in each trial (CPU); None: torch's default."""
    trial_timeout: float = 600.0
    """Seconds one child may take at most."""
    confirm: bool = True
    """Time the default and the best again, back to back, for the reported gain."""


@dataclass
class TuneReport:
    """Everything a sweep found; ``to_dict()`` is tune.json."""

    target: str
    name: str
    device: dict[str, Any]
    options: dict[str, Any]
    trials: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warm_up: int | None = None
    """The trial run before the baseline so that it is timed warm; never compared."""
    baseline: int | None = None
    best: int | None = None
    confirm: tuple[int, int] | None = None
    """Trials of the default and the best timed back to back at the end: the gain's source."""
    started: float = field(default_factory=time.time)
    seconds: float = 0.0

    def trial(self, n: int | None) -> dict[str, Any] | None:
        return None if n is None else self.trials[n]

    @property
    def gain(self) -> float | None:
        """Best over default; from the back-to-back pair when there is one (same machine load)."""
        if self.best is not None and self.best == self.baseline:
            return 1.0
        if self.confirm is not None:
            again, chosen = self.trials[self.confirm[0]], self.trials[self.confirm[1]]
            if again["ok"] and chosen["ok"]:
                return float(chosen["samples_per_s"] / again["samples_per_s"])
        base, best = self.trial(self.baseline), self.trial(self.best)
        if base is None or best is None or not base["ok"]:
            return None
        return float(best["samples_per_s"] / base["samples_per_s"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "tune",
            "target": self.target,
            "name": self.name,
            "device": self.device,
            "options": self.options,
            "warm_up": self.warm_up,
            "baseline": self.baseline,
            "best": self.best,
            "gain": self.gain,
            "confirm": list(self.confirm) if self.confirm else None,
            "best_config": None if self.best is None else self.trials[self.best]["config"],
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "trials": self.trials,
        }


def run_child(job: dict[str, Any], *, timeout: float, workdir: Path) -> dict[str, Any]:
    """Run one job in a fresh ``python -m acceptrun.tune.trial``; never raises for its failure.

    Returns the child's result, or ``{"ok": False, "error": ...}`` naming how it died
    (a signal, an exit status, the timeout) with the last line of its stderr.
    """
    fd, name = tempfile.mkstemp(prefix="job-", suffix=".json", dir=workdir)
    with os.fdopen(fd, "w") as f:
        json.dump(job, f)
    result_path = Path(name).with_suffix(".result.json")
    log_path = Path(name).with_suffix(".log")
    # Fewer malloc arenas keep the address space close to what is really used, so a
    # memory cap measures the trial and not glibc's per-thread reservations.
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "acceptrun.tune.trial", name, str(result_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # compile workers are in the same group
            proc.wait()
            return {"ok": False, "error": f"timed out after {timeout:.0f} s", "timeout": True}
    if result_path.exists():
        with open(result_path, encoding="utf-8") as f:
            result: dict[str, Any] = json.load(f)
        return result
    tail = log_path.read_text(errors="replace").strip().splitlines()
    how = f"exit status {code}"
    if code < 0:
        how = f"killed by {signal.Signals(-code).name}"
    return {
        "ok": False,
        "error": f"the trial process died ({how}): {tail[-1] if tail else 'no output'}",
        "oom": code == -signal.SIGKILL,
    }


class Tuner:
    """Runs the sweep; ``on_trial`` sees each trial as it ends (record, progress line)."""

    def __init__(
        self,
        options: TuneOptions,
        target: Any,
        *,
        on_trial: Callable[[TuneReport, dict[str, Any]], None] | None = None,
    ) -> None:
        self.opt = options
        self.target = target
        self.on_trial = on_trial or (lambda report, trial: None)
        self.deadline = 0.0
        self.workdir = Path(tempfile.mkdtemp(prefix="acceptrun-tune-"))
        self.report = TuneReport(target=options.target, name=target_name(target), device={},
                                 options=_options_dict(options))  # fmt: skip
        self.references: dict[int, float] = {}  # batch size -> fp32 eager loss after check_steps
        self.search_capped: bool | None = None

    # ---- children ---------------------------------------------------------------------

    def _job(self, mode: str, config: TuneConfig | None = None, **extra: Any) -> dict[str, Any]:
        job: dict[str, Any] = {"mode": mode, "target": self.opt.target, "device": self.device,
                               "seed": self.opt.seed, "threads": self.opt.threads, **extra}  # fmt: skip
        if config is not None:
            job["config"] = config.to_dict()
        if self.opt.memory_limit and self.device.startswith("cpu"):
            job["memory_limit"] = self.opt.memory_limit
        return job

    def _remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _child(self, job: dict[str, Any], *, force: bool = False) -> dict[str, Any]:
        timeout = (
            self.opt.trial_timeout
            if force
            else min(self.opt.trial_timeout, max(10.0, self._remaining()))
        )
        return run_child(job, timeout=timeout, workdir=self.workdir)

    @property
    def device(self) -> str:
        return str(self.report.device.get("device") or self.opt.device or "cpu")

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    # ---- trials -------------------------------------------------------------------------

    def trial(self, axis: str, config: TuneConfig, *, force: bool = False) -> dict[str, Any]:
        """Time ``config`` in a child; record it with its gain, MFU and numerics verdict."""
        _log.info(f"trial {len(self.report.trials)}: {axis}: {config.label()}")
        started = time.monotonic()
        result = self._child(
            self._job("trial", config, warmup=self.opt.warmup, steps=self.opt.steps,
                      check_steps=self.opt.check_steps), force=force,
        )  # fmt: skip
        trial: dict[str, Any] = {
            "id": len(self.report.trials), "axis": axis, "label": config.label(),
            "config": config.to_dict(), "wall_s": round(time.monotonic() - started, 3), **result,
        }  # fmt: skip
        if trial["ok"]:
            self._score(trial, config)
        else:
            trial["numerics"] = "-"
        self.report.trials.append(trial)
        self.on_trial(self.report, trial)
        return trial

    def warm_up(self, config: TuneConfig) -> dict[str, Any]:
        """Run ``config`` once as a trial that is recorded but never compared (no gain)."""
        _log.info(f"trial {len(self.report.trials)}: warm-up: {config.label()} (not compared)")
        started = time.monotonic()
        result = self._child(
            self._job("trial", config, warmup=self.opt.warmup, steps=self.opt.steps,
                      check_steps=self.opt.check_steps), force=True,
        )  # fmt: skip
        trial: dict[str, Any] = {
            "id": len(self.report.trials), "axis": WARM_UP, "label": config.label(),
            "config": config.to_dict(), "wall_s": round(time.monotonic() - started, 3),
            **result, "gain": None, "numerics": "-",
        }  # fmt: skip
        if trial["ok"]:
            trial["spread"] = (trial["p75_s"] - trial["p25_s"]) / trial["median_s"]
        self.report.warm_up = trial["id"]
        self.report.trials.append(trial)
        self.on_trial(self.report, trial)
        return trial

    def _score(self, trial: dict[str, Any], config: TuneConfig) -> None:
        peak = self.opt.peak_tflops or peak_tflops(self.report.device.get("name"))
        flops = trial.get("flops_per_sample")
        trial["mfu"] = flops * trial["samples_per_s"] / (peak * 1e12) if flops and peak else None
        base = self.report.trial(self.report.baseline)
        trial["gain"] = (
            trial["samples_per_s"] / base["samples_per_s"] if base and base["ok"] else 1.0
        )
        trial["spread"] = (trial["p75_s"] - trial["p25_s"]) / trial["median_s"]
        loss = trial["check_loss"]
        if _is_reference(config, self.target.default_config()):
            self.references.setdefault(config.batch_size, loss)
        ref = self.references.get(config.batch_size)
        if not math.isfinite(loss):
            trial["numerics"] = "fail"
            trial["numerics_detail"] = f"loss {loss} after {self.opt.check_steps} steps"
        elif ref is None:
            trial["numerics"] = "finite"
            trial["numerics_detail"] = "no fp32 eager run of this batch size to compare with"
        else:
            rel = abs(loss - ref) / max(abs(ref), 1e-6)
            trial["numerics_delta"] = rel
            trial["numerics"] = "ok" if rel <= self.opt.tolerance else "fail"
            trial["numerics_detail"] = (
                f"loss {loss:.5g} vs fp32 {ref:.5g} after {self.opt.check_steps} steps"
            )
        if trial.get("overflow_steps"):
            trial["numerics_detail"] += f"; GradScaler skipped {trial['overflow_steps']} steps"

    def _better(self, trial: dict[str, Any], best: dict[str, Any]) -> bool:
        return bool(
            trial["ok"] and trial["numerics"] == "ok"
            and trial["samples_per_s"] > best["samples_per_s"] * (1.0 + self.opt.min_gain)
        )  # fmt: skip

    def _ensure_reference(self, batch_size: int) -> None:
        """Time the fp32 eager run of ``batch_size`` when no trial gave its loss yet."""
        if batch_size not in self.references:
            self.trial("reference", self.target.default_config().replace(batch_size=batch_size))

    def _out_of_budget(self, axis: str) -> bool:
        if self._remaining() > 0:
            return False
        self.report.notes.append(
            f"{axis}: skipped, the budget of {self.opt.budget:.0f} s was spent"
        )
        return True

    # ---- the sweep ---------------------------------------------------------------------

    def run(self) -> TuneReport:
        """Probe, baseline, then each axis in turn. Returns the report (also on errors).

        The trials' folder (their jobs, logs and results, read back as each ends) goes
        with the sweep: what a failed trial said is in the report.
        """
        try:
            return self._sweep()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _sweep(self) -> TuneReport:
        t0 = time.monotonic()
        self.deadline = t0 + self.opt.budget
        if self.opt.device == "cpu":  # nothing to ask a child: no CUDA memory, no GPU name
            import platform

            probe = {
                "ok": True,
                "device": "cpu",
                "name": platform.processor() or platform.machine(),
            }
        else:
            probe = self._child({"mode": "probe", "device": self.opt.device}, force=True)
        if not probe.get("ok"):
            raise RuntimeError(f"cannot start a trial process: {probe.get('error')}")
        self.report.device = probe
        default = self.target.default_config()
        # The first trial process pays the machine's cold start (torch's libraries read
        # from disk, CPU and GPU clocks still low, kernel caches empty): the tiny example's
        # default timed 813.8 samples/s first and 1,445.9 at the end. An untimed run of
        # the default goes first, so the baseline, like every other trial, follows one.
        self.warm_up(default)
        base = self.trial("baseline", default, force=True)
        self.report.baseline = base["id"]
        if not base["ok"]:
            self.report.seconds = time.monotonic() - t0
            return self.report
        best = base
        for axis in self.opt.axes:
            if self._out_of_budget(axis):
                continue
            best = getattr(self, f"_axis_{axis}")(best)
            self.report.best = best["id"]
        self.report.best = best["id"]
        if best is not base and self.opt.confirm:
            # Other work on the machine changes over a sweep: the gain that is reported
            # comes from the default and the best timed one right after the other.
            again = self.trial("confirm", default, force=True)
            chosen = self.trial("confirm", self._config(best), force=True)
            self.report.confirm = (again["id"], chosen["id"])
            if again["ok"] and chosen["ok"] and chosen["samples_per_s"] <= again["samples_per_s"]:
                # The sweep's winner did not beat the default side by side: its lead was
                # the machine's noise. The default stays, and the report says why.
                ratio = chosen["samples_per_s"] / again["samples_per_s"]
                self.report.notes.append(
                    f"best of the sweep, {best['label']}, ran {ratio:.2f}x the default when "
                    "timed back to back: the job's default stays the best configuration"
                )
                self.report.best = base["id"]
        self.report.seconds = time.monotonic() - t0
        return self.report

    def _pick(self, best: dict[str, Any], axis: str, configs: list[TuneConfig]) -> dict[str, Any]:
        for config in configs:
            if self._out_of_budget(f"{axis} {config.label()}"):
                break
            trial = self.trial(axis, config)
            if self._better(trial, best):
                best = trial
        return best

    def _config(self, trial: dict[str, Any]) -> TuneConfig:
        return TuneConfig.from_dict(trial["config"])

    def _axis_precision(self, best: dict[str, Any]) -> dict[str, Any]:
        cur = self._config(best)
        choices = ["fp32", "tf32", "bf16", "fp16"] if self.cuda else ["fp32", "bf16"]
        return self._pick(
            best, "precision", [cur.replace(precision=p) for p in choices if p != cur.precision]
        )

    def _search(self, config: TuneConfig) -> dict[str, Any]:
        _log.info(f"batch search: {config.label()} up to {self.opt.max_batch}")
        job = self._job("search", config, search={
            "start": config.batch_size, "limit": self.opt.max_batch,
            "multiple": self.opt.batch_multiple, "headroom": self.opt.headroom,
        })  # fmt: skip
        result = self._child(job)
        entry = {"config": config.to_dict(), **result}
        self.report.options.setdefault("searches", []).append(entry)
        return result

    def _axis_batch(self, best: dict[str, Any]) -> dict[str, Any]:
        cur = self._config(best)
        found = self._search(cur)
        if not found.get("ok"):
            self.report.notes.append(f"batch: the search failed: {found.get('error')}")
            return best
        top = int(found["max_batch"])
        self.search_capped = bool(found.get("capped"))
        bound = "capped by --max-batch" if found.get("capped") else "memory bound"
        self.report.notes.append(f"batch: the largest batch that fits is {top} ({bound})")
        candidates = batch_candidates(cur.batch_size, top, multiple=self.opt.batch_multiple)
        chosen = best
        for size in candidates:
            if self._out_of_budget(f"batch {size}"):
                break
            trial = self.trial("batch", cur.replace(batch_size=size))
            # Any finite candidate competes; its numerics are checked below, against the
            # fp32 eager run of the same batch size.
            if (
                trial["ok"]
                and trial["numerics"] != "fail"
                and trial["samples_per_s"] > chosen["samples_per_s"] * (1.0 + self.opt.min_gain)
            ):
                chosen = trial
        if chosen is best:
            return best
        size = chosen["config"]["batch_size"]
        if chosen["numerics"] != "ok":
            if self._out_of_budget("batch reference"):
                return best
            self._ensure_reference(size)
            self._score(chosen, self._config(chosen))
        return chosen if chosen["numerics"] == "ok" else best

    def _axis_optimizer(self, best: dict[str, Any]) -> dict[str, Any]:
        cur = self._config(best)
        return self._pick(
            best,
            "optimizer",
            [cur.replace(optimizer=o) for o in ("foreach", "fused") if o != cur.optimizer],
        )

    def _axis_attention(self, best: dict[str, Any]) -> dict[str, Any]:
        if not getattr(self.target, "uses_sdpa", False):
            self.report.notes.append("attention: skipped, the target does not use SDPA")
            return best
        cur = self._config(best)
        names = ["math", "flash", "efficient", "cudnn"] if self.cuda else ["math", "flash"]
        return self._pick(
            best, "attention", [cur.replace(attention=a) for a in names if a != cur.attention]
        )

    def _axis_checkpointing(self, best: dict[str, Any]) -> dict[str, Any]:
        if not getattr(self.target, "supports_checkpointing", False):
            self.report.notes.append("checkpointing: skipped, the target does not support it")
            return best
        cur = self._config(best)
        configs = [cur.replace(activation_checkpointing=not cur.activation_checkpointing)]
        if self.search_capped is False and not cur.activation_checkpointing:
            found = self._search(configs[0])
            if found.get("ok") and int(found["max_batch"]) > cur.batch_size:
                bigger = int(found["max_batch"])
                self.report.notes.append(f"checkpointing: the largest batch with it is {bigger}")
                configs.append(configs[0].replace(batch_size=bigger))
        chosen = self._pick(best, "checkpointing", configs[:1])
        if len(configs) > 1 and not self._out_of_budget("checkpointing batch"):
            trial = self.trial("checkpointing", configs[1])
            if (
                trial["ok"]
                and trial["numerics"] != "fail"
                and self._better({**trial, "numerics": "ok"}, chosen)
            ):
                self._ensure_reference(configs[1].batch_size)
                self._score(trial, configs[1])
                if trial["numerics"] == "ok":
                    chosen = trial
        return chosen

    def _axis_loader(self, best: dict[str, Any]) -> dict[str, Any]:
        if not best.get("uses_loader"):
            self.report.notes.append("loader: skipped, the target has no data loader")
            return best
        cur = self._config(best)
        workers = sorted({2, min(4, max(2, (os.cpu_count() or 2)))})
        configs = [
            cur.replace(loader_workers=w, prefetch_factor=4 if w > 2 else None) for w in workers
        ]
        if self.cuda:
            configs = [c.replace(pin_memory=True) for c in configs]
        return self._pick(best, "loader", [c for c in configs if c != cur])

    def _axis_compile(self, best: dict[str, Any]) -> dict[str, Any]:
        cur = self._config(best)
        modes = ["default", "max-autotune-no-cudagraphs"]
        if self.cuda:
            modes.append("reduce-overhead")
        eager_step = best["median_s"]
        chosen = best
        for mode in modes:
            if self._out_of_budget(f"compile {mode}"):
                break
            trial = self.trial("compile", cur.replace(compile=mode))
            if trial["ok"]:
                saved = eager_step - trial["median_s"]
                trial["break_even_steps"] = (
                    math.ceil(trial.get("compile_s", 0.0) / saved) if saved > 0 else None
                )
            if self._better(trial, chosen):
                chosen = trial
        return chosen


def _is_reference(config: TuneConfig, default: TuneConfig) -> bool:
    """True for the fp32 eager run of the job (any batch size): the numerics reference."""
    plain = default.replace(batch_size=config.batch_size, loader_workers=config.loader_workers,
                            pin_memory=config.pin_memory, prefetch_factor=config.prefetch_factor)  # fmt: skip
    return config == plain and config.precision == "fp32"


def _options_dict(options: TuneOptions) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(options)
    data["axes"] = list(options.axes)
    return data
