"""The run spec: everything a user fixes before launch, in one TOML file.

``load_spec(path)`` reads and validates a spec and returns a :class:`RunSpec` whose paths
are resolved against the spec's directory. Validation reports every problem at once, each
naming the field path, the bad value and what is accepted (with "did you mean" for
unknown keys, and line:column for TOML syntax errors). The dataclasses below are the
single declaration of the format: the validator, the JSON Schema (``acceptrun spec
schema``) and the docs table are all derived from them.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import math
import operator
import re
import shlex
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import tomli_w
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from acceptrun._util.hashing import hash_bytes
from acceptrun._util.units import format_duration  # re-exported: callers import it from here
from acceptrun.errors import SpecError

__all__ = [
    "AcceptanceSpec",
    "CheckpointSpec",
    "CleanupSpec",
    "Condition",
    "CostSpec",
    "DataSpec",
    "ExpectSpec",
    "InferenceSpec",
    "LimitsSpec",
    "ProgressSpec",
    "ResourcesSpec",
    "RunSpec",
    "ServingSpec",
    "SkypilotSpec",
    "SlurmSpec",
    "TelemetrySpec",
    "format_duration",
    "load_spec",
    "match_pattern",
    "parse_condition",
    "parse_duration",
    "parse_spec",
]

KNOWN_DRILLS = ("restore", "kill", "preempt")


class Duration(float):
    """Seconds, written in a spec as ``90``, ``"90s"``, ``"10m"``, ``"2h"`` or ``"1h30m"``."""


def doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with a one-line docstring (shown in errors, schema and docs)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


# ---- sections -----------------------------------------------------------------------------


@dataclass(kw_only=True)
class ResourcesSpec:
    """What the run needs from the machine."""

    gpus: int = doc("GPUs on one machine; 0 runs on CPU.", 0)
    gpu_types: list[str] = doc(
        'Acceptable GPU models, matched against the GPU name, e.g. ["H100", "H200"]; empty: any.',
        factory=list,
    )
    min_gpu_memory_gb: float = doc("Minimum memory per GPU in GiB; 0: no minimum.", 0.0)
    cpus: int | None = doc("CPU cores the run needs (used by batch backends).", None)
    memory_gb: float | None = doc(
        "Host memory the run needs in GiB (used by batch backends).", None
    )
    processes: int = doc(
        "Processes on each machine: one per GPU, or CPU processes (gloo); more than 1 "
        "launches the command through torchrun.",
        1,
    )
    nodes: int = doc("Machines the run spans (batch backends: Slurm, SkyPilot).", 1)

    def __post_init__(self) -> None:
        _require(self.gpus >= 0, "resources.gpus", self.gpus, "a count of 0 or more")
        _require(self.processes >= 1, "resources.processes", self.processes, "1 or more")
        _require(self.nodes >= 1, "resources.nodes", self.nodes, "1 or more")
        _require(
            self.min_gpu_memory_gb >= 0,
            "resources.min_gpu_memory_gb",
            self.min_gpu_memory_gb,
            "0 or more GiB",
        )


@dataclass(kw_only=True)
class ExpectSpec:
    """Environment expectations checked before launch; a mismatch stops the run."""

    python: str | None = doc('Python version pattern, e.g. ">=3.11" or "3.11.*".', None)
    packages: dict[str, str] = doc(
        'Package version patterns, e.g. { torch = ">=2.1,<3" }.', factory=dict
    )
    cuda: str | None = doc('CUDA runtime of torch, e.g. "12.*"; "none" requires a CPU build.', None)
    driver: str | None = doc('NVIDIA driver version pattern, e.g. ">=550".', None)
    gpu: str | None = doc(
        'GPU model pattern every visible GPU must match, e.g. "H100" or "*A100*80GB*".', None
    )

    def __post_init__(self) -> None:
        for name in ("python", "cuda", "driver"):
            value = getattr(self, name)
            if value is not None and not (name == "cuda" and value == "none"):
                _require(_valid_version_pattern(value), f"expect.{name}", value, _PATTERN_HELP)
        for pkg, pattern in self.packages.items():
            _require(
                _valid_version_pattern(pattern), f"expect.packages.{pkg}", pattern, _PATTERN_HELP
            )


@dataclass(kw_only=True)
class DataSpec:
    """The data snapshot, verified against its manifest before the first step."""

    path: str | None = doc("Data directory, file or fsspec URL (s3://..., gs://...).", None)
    manifest: str | None = doc(
        "Manifest from `acceptrun data snapshot` (it records its own excludes); the data must match it.",
        None,
    )

    def __post_init__(self) -> None:
        _require(
            self.manifest is None or self.path is not None,
            "data.manifest", self.manifest, "a manifest together with data.path",
        )  # fmt: skip


@dataclass(kw_only=True)
class CheckpointSpec:
    """Where and how often checkpoints are written (used by the checkpoint store)."""

    dir: str | None = doc("Checkpoint directory; default: checkpoints/ in the run record.", None)
    every_steps: int | None = doc("Checkpoint every N steps.", None)
    every: Duration | None = doc('Checkpoint at least this often, e.g. "30m".', None)
    keep_last: int = doc("Keep the newest N checkpoints (2 or more).", 2)
    keep_every: int | None = doc("Also keep every checkpoint whose step is a multiple of N.", None)
    keep_best: str | None = doc('Also keep the best by a metric, e.g. "eval/loss:min".', None)
    mirror: str | None = doc("Copy committed checkpoints to this path or fsspec URL.", None)
    watch: list[str] = doc(
        "The script's own checkpoints: files, directories or globs (relative to the workdir), "
        'e.g. ["out/ckpt.pt"] or ["output/checkpoint-*"]; each complete one is captured.',
        factory=list,
    )
    resume_args: list[str] = doc(
        "Arguments added to the command when it resumes from a watched checkpoint; "
        '"{checkpoint}" is the restored path, e.g. ["--resume_from_checkpoint", "{checkpoint}"].',
        factory=list,
    )
    settle: Duration = doc(
        "A watched checkpoint is complete once its size and mtime held this long and no "
        "process of the attempt has it open for writing.",
        Duration(2.0),
    )

    def __post_init__(self) -> None:
        _require(self.settle >= 0, "checkpoint.settle", self.settle, 'a duration such as "2s"')
        _require(
            not self.resume_args or bool(self.watch),
            "checkpoint.resume_args", self.resume_args,
            "resume arguments together with checkpoint.watch (the files they resume from)",
        )  # fmt: skip
        _require(
            self.every_steps is None or self.every_steps > 0,
            "checkpoint.every_steps",
            self.every_steps,
            "a positive step count",
        )
        _require(
            self.every is None or self.every > 0,
            "checkpoint.every",
            self.every,
            'a positive duration such as "30m"',
        )
        _require(
            self.keep_last >= 2, "checkpoint.keep_last", self.keep_last,
            "2 or more: the newest checkpoint may still be saving or may fail verification, "
            "and the one before it is what a restart falls back to",
        )  # fmt: skip
        _require(
            self.keep_every is None or self.keep_every > 0,
            "checkpoint.keep_every",
            self.keep_every,
            "a positive step count",
        )
        if self.keep_best is not None:
            _require(
                re.fullmatch(r"[^:]+:(min|max)", self.keep_best) is not None,
                "checkpoint.keep_best", self.keep_best, '"<metric>:min" or "<metric>:max"',
            )  # fmt: skip


@dataclass(kw_only=True)
class ProgressSpec:
    """Step, loss and metrics read from what an unmodified script prints or writes."""

    pattern: str | None = doc(
        "Regular expression over output lines with named groups: step (required), loss and "
        r'any metric, e.g. "iter (?P<step>\\d+): loss (?P<loss>[0-9.eE+-]+)".',
        None,
    )
    stream: str = doc('Which output the pattern reads: "stdout", "stderr" or "both".', "both")
    tensorboard: str | None = doc(
        "Directory (relative to the workdir) where the script writes TensorBoard event files.",
        None,
    )
    tags: dict[str, str] = doc(
        'TensorBoard tag of each value, e.g. { loss = "train/loss" }; default: every scalar.',
        factory=dict,
    )

    def __post_init__(self) -> None:
        _require(
            self.stream in ("stdout", "stderr", "both"), "progress.stream", self.stream,
            '"stdout", "stderr" or "both"',
        )  # fmt: skip
        if self.pattern is not None:
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as exc:
                raise _Problem(
                    "progress.pattern", self.pattern, f"a Python regular expression ({exc})"
                ) from None
            _require(
                "step" in groups, "progress.pattern", self.pattern,
                "a pattern with a named group (?P<step>\\d+)",
            )  # fmt: skip


@dataclass(kw_only=True)
class LimitsSpec:
    """Limits the supervisor enforces."""

    wall_time: Duration | None = doc(
        'Stop the run after this long, all attempts together, e.g. "12h".', None
    )
    expected_runtime: list[Duration] = doc(
        'Acceptable runtime range [min, max], e.g. ["20m", "2h"].', factory=list
    )
    max_restarts: int = doc("Restarts after a failure before the run is given up.", 3)
    restart_backoff: Duration = doc(
        "Wait before the first restart; doubles each time (max 5 min).", Duration(5.0)
    )
    grace_period: Duration = doc(
        "After asking the workload to stop, wait this long before killing it.", Duration(30.0)
    )
    budget_usd: float | None = doc("Stop before the run costs more than this, in USD.", None)
    idle_window: Duration | None = doc(
        'Stop after the GPU (or process) is idle this long, e.g. "15m".', None
    )
    hang_window: Duration | None = doc(
        'Treat the run as hung after no step for this long, e.g. "20m".', None
    )
    max_loss: float | None = doc(
        "A logged loss above this (or NaN/inf, always) means the run diverged.", None
    )
    on_divergence: str = doc(
        '"stop" the run, or "rollback" to the checkpoint before the newest one.', "stop"
    )

    def __post_init__(self) -> None:
        for name in ("wall_time", "idle_window", "hang_window"):
            value = getattr(self, name)
            _require(
                value is None or value > 0,
                f"limits.{name}",
                value,
                'a positive duration such as "10m"',
            )
        _require(self.max_restarts >= 0, "limits.max_restarts", self.max_restarts, "0 or more")
        _require(
            self.on_divergence in ("stop", "rollback"),
            "limits.on_divergence", self.on_divergence, '"stop" or "rollback"',
        )  # fmt: skip
        _require(
            self.restart_backoff >= 0,
            "limits.restart_backoff",
            self.restart_backoff,
            "0 or more seconds",
        )
        _require(
            self.grace_period >= 0, "limits.grace_period", self.grace_period, "0 or more seconds"
        )
        _require(
            self.budget_usd is None or self.budget_usd > 0,
            "limits.budget_usd",
            self.budget_usd,
            "a positive amount in USD",
        )
        if self.expected_runtime:
            rng = self.expected_runtime
            _require(
                len(rng) == 2 and 0 <= rng[0] <= rng[1], "limits.expected_runtime",
                [format_duration(x) for x in rng], 'two durations [min, max] with min <= max, e.g. ["20m", "2h"]',
            )  # fmt: skip


THROUGHPUT_UNITS = ("samples/s", "tokens/s", "steps/s")
IDLE_ACTIONS = ("stop", "event")


@dataclass(kw_only=True)
class TelemetrySpec:
    """Host and GPU sampling, idle detection, MFU and live exports."""

    interval: Duration = doc(
        "Seconds between host and GPU samples taken by the supervisor.", Duration(2.0)
    )
    gpu: bool = doc("Sample GPUs through NVML when the machine has them.", True)
    idle_threshold: float = doc(
        "Activity below which the run counts as idle: GPU utilization in %, or without a "
        "GPU the CPU use of the workload's processes in % of one core.",
        5.0,
    )
    idle_action: str = doc(
        'What limits.idle_window triggers: "stop" (graceful, checkpoint first) or "event".',
        "stop",
    )
    prometheus_port: int | None = doc(
        "Serve Prometheus metrics on 127.0.0.1 at this port during the run; 0 picks a free port.",
        None,
    )
    flops_per_sample: float | None = doc(
        "Training FLOPs per sample (forward and backward), for MFU.", None
    )
    flops_per_token: float | None = doc("Training FLOPs per token, for MFU.", None)
    peak_tflops: float | None = doc(
        "Peak dense TFLOP/s of one device for MFU; default: the table of known GPUs.", None
    )

    def __post_init__(self) -> None:
        _require(self.interval > 0, "telemetry.interval", self.interval, "a positive duration")
        _require(
            0 <= self.idle_threshold <= 100 * 1024,
            "telemetry.idle_threshold", self.idle_threshold, "a percentage, 0 or more",
        )  # fmt: skip
        _require(
            self.idle_action in IDLE_ACTIONS,
            "telemetry.idle_action", self.idle_action, '"stop" or "event"',
        )  # fmt: skip
        _require(
            self.prometheus_port is None or 0 <= self.prometheus_port <= 65535,
            "telemetry.prometheus_port", self.prometheus_port, "a TCP port, 0 to 65535",
        )  # fmt: skip
        for name in ("flops_per_sample", "flops_per_token", "peak_tflops"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"telemetry.{name}", value, "a positive number")


@dataclass(kw_only=True)
class SlurmSpec:
    """Options of the Slurm backend (`acceptrun submit --backend slurm`)."""

    partition: str | None = doc("Partition (sbatch --partition).", None)
    account: str | None = doc("Account (sbatch --account).", None)
    qos: str | None = doc("Quality of service (sbatch --qos).", None)
    signal_grace: Duration = doc(
        "Slurm sends USR1 this long before the time limit: checkpoint, exit, requeue.",
        Duration(120.0),
    )
    extra_args: list[str] = doc('More sbatch options, e.g. ["--constraint=h100"].', factory=list)

    def __post_init__(self) -> None:
        _require(
            self.signal_grace > 0, "slurm.signal_grace", self.signal_grace, "a positive duration"
        )


@dataclass(kw_only=True)
class SkypilotSpec:
    """Options of the SkyPilot export (`acceptrun export skypilot`)."""

    cloud: str | None = doc('Cloud to launch on, e.g. "lambda", "aws"; default: any.', None)
    region: str | None = doc("Region, e.g. us-east-1; default: any.", None)
    accelerators: str | None = doc(
        'SkyPilot accelerators, e.g. "H100:8"; default: from resources.gpu_types and gpus.', None
    )
    use_spot: bool = doc(
        "Use spot (preemptible) capacity; recovery resumes from the mirror.", False
    )
    image_id: str | None = doc(
        "Machine or Docker image, e.g. docker:nvcr.io/nvidia/pytorch:24.05-py3.", None
    )
    disk_size: int | None = doc("Disk size in GB.", None)


@dataclass(kw_only=True)
class CostSpec:
    """What the machine costs, for the ledger and the budget."""

    provider: str | None = doc('Provider in the price catalog, e.g. "lambda".', None)
    instance: str | None = doc('Instance type in the price catalog, e.g. "gpu_1x_h100_sxm5".', None)
    price_per_hour: float | None = doc(
        "Price of the machine in USD per hour (overrides the catalog).", None
    )
    billing_increment: Duration | None = doc(
        'Billing increment of a price_per_hour without provider/instance, e.g. "1s" or "1h"; '
        "default: per minute. A catalog instance keeps its provider's rules.",
        None,
    )
    mirror_per_gib_month: float | None = doc(
        "Price of the checkpoint mirror's storage in USD per GiB-month, e.g. 0.023 (S3 "
        "Standard); unset: mirrored bytes are counted in GiB-hours at 0 USD.",
        None,
    )

    def __post_init__(self) -> None:
        _require(
            self.price_per_hour is None or self.price_per_hour >= 0,
            "cost.price_per_hour", self.price_per_hour, "0 or more USD per hour",
        )  # fmt: skip
        _require(
            self.billing_increment is None or self.billing_increment > 0,
            "cost.billing_increment", self.billing_increment, 'a duration above 0, e.g. "1s"',
        )  # fmt: skip
        _require(
            self.billing_increment is None
            or (self.price_per_hour is not None and self.provider is None and self.instance is None),
            "cost.billing_increment", self.billing_increment,
            "only with cost.price_per_hour and no provider/instance (a catalog instance bills "
            "by its provider's rules; `acceptrun prices` shows them)",
        )  # fmt: skip
        _require(
            self.mirror_per_gib_month is None or self.mirror_per_gib_month >= 0,
            "cost.mirror_per_gib_month", self.mirror_per_gib_month, "0 or more USD per GiB-month",
        )  # fmt: skip


@dataclass(kw_only=True)
class AcceptanceSpec:
    """What the run must show to be accepted."""

    metrics: dict[str, str] = doc(
        'Thresholds on final metrics, e.g. { "eval/accuracy" = ">= 0.9" }.', factory=dict
    )
    outputs: list[str] = doc('Outputs the run must register, e.g. ["model"].', factory=list)
    drills: list[str] = doc(f"Drills that must pass: {', '.join(KNOWN_DRILLS)}.", factory=list)
    throughput: list[float] = doc(
        "Acceptable median throughput [min, max] in throughput_unit, e.g. [900, 1200].",
        factory=list,
    )
    throughput_unit: str = doc(
        f"Unit of the throughput range: {', '.join(THROUGHPUT_UNITS)}.", "samples/s"
    )
    max_data_wait: float | None = doc(
        "Largest share of step time spent waiting for data, 0 to 1.", 0.25
    )
    max_idle: float | None = doc(
        "Largest share of the attempts' time the GPU (or process) was idle, 0 to 1.", 0.25
    )
    max_first_step: Duration | None = doc(
        'Longest acceptable time from launch to the first step, e.g. "10m".', None
    )
    tolerances: dict[str, float] = doc(
        'Absolute tolerance per metric (and "loss" for the loss curve) when `acceptrun diff` '
        "compares two runs; unnamed ones must match exactly.",
        factory=dict,
    )

    def __post_init__(self) -> None:
        if self.throughput:
            rng = self.throughput
            _require(
                len(rng) == 2 and 0 <= rng[0] <= rng[1], "acceptance.throughput", rng,
                "two numbers [min, max] with min <= max",
            )  # fmt: skip
        _require(
            self.throughput_unit in THROUGHPUT_UNITS,
            "acceptance.throughput_unit", self.throughput_unit, " or ".join(THROUGHPUT_UNITS),
        )  # fmt: skip
        for name in ("max_data_wait", "max_idle"):
            value = getattr(self, name)
            _require(
                value is None or 0 <= value <= 1, f"acceptance.{name}", value, "a share from 0 to 1"
            )
        _require(
            self.max_first_step is None or self.max_first_step > 0,
            "acceptance.max_first_step", self.max_first_step, "a positive duration",
        )  # fmt: skip
        for name, tol in self.tolerances.items():
            _require(tol >= 0, f"acceptance.tolerances.{_key(name)}", tol, "0 or more")
        for name, text in self.metrics.items():
            try:
                parse_condition(text)
            except ValueError as exc:
                _require(False, f"acceptance.metrics.{_key(name)}", text, str(exc))
        for drill in self.drills:
            _require(
                drill in KNOWN_DRILLS,
                "acceptance.drills",
                drill,
                f"one of {', '.join(KNOWN_DRILLS)}",
            )


INFERENCE_FORMATS = ("auto", "jsonl", "text")


@dataclass(kw_only=True)
class InferenceSpec:
    """A batch inference run: its input items, its committed outputs and what it must show."""

    input: str | None = doc(
        "Input items: a JSONL file (one record a line), a text file (one item a line), a "
        "directory of such files (sorted by name) or an fsspec URL; setting it makes the "
        "run a batch inference run (docs/inference.md).",
        None,
    )
    output: str = doc(
        "Directory of the committed output shards (shard-00000.jsonl, ...), relative to the "
        "spec file.",
        "inference-out",
    )
    shard_size: int = doc(
        "Items per shard: the unit of work handed out, committed at once and redone after a kill.",
        100,
    )
    format: str = doc(
        '"auto" (.jsonl/.json files are JSONL, anything else text lines), "jsonl" or "text".',
        "auto",
    )
    id_field: str | None = doc(
        "JSONL field holding each item's stable, unique id; default: the item's index (0, 1, ...).",
        None,
    )
    min_coverage: float = doc(
        "Share of input items that must have exactly one output or be listed as failed, 0 to 1.",
        1.0,
    )
    max_error_rate: float | None = doc(
        "Largest share of input items listed as failed, 0 to 1; unset: shown, not checked.", None
    )
    min_items_per_s: float | None = doc(
        "Lowest acceptable throughput in items per second over the attempts' wall time.", None
    )
    max_usd_per_1k_items: float | None = doc(
        "Highest acceptable cost per 1,000 items with an output, in USD (needs a price in [cost]).",
        None,
    )
    max_usd_per_million_tokens: float | None = doc(
        "Highest acceptable cost per million tokens reported by shard.commit(tokens=...), in USD.",
        None,
    )

    @property
    def enabled(self) -> bool:
        """True when the spec describes a batch inference run."""
        return self.input is not None

    def __post_init__(self) -> None:
        changed = [
            f.name
            for f in dataclasses.fields(self)
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default
        ]
        _require(
            self.enabled or not changed,
            "inference.input", self.input,
            'the input items of an [inference] section, e.g. input = "data/prompts.jsonl"',
        )  # fmt: skip
        _require(self.shard_size >= 1, "inference.shard_size", self.shard_size, "1 or more items")
        _require(
            self.format in INFERENCE_FORMATS,
            "inference.format", self.format, '"auto", "jsonl" or "text"',
        )  # fmt: skip
        _require(
            self.id_field is None or self.format != "text",
            "inference.id_field", self.id_field, 'no id_field with format = "text" (ids are indexes)',
        )  # fmt: skip
        for name in ("min_coverage", "max_error_rate"):
            value = getattr(self, name)
            _require(
                value is None or 0 <= value <= 1, f"inference.{name}", value, "a share from 0 to 1"
            )
        for name in ("min_items_per_s", "max_usd_per_1k_items", "max_usd_per_million_tokens"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"inference.{name}", value, "a positive number")


SERVING_ARRIVALS = ("poisson", "uniform")
SERVING_METHODS = ("GET", "POST", "PUT")


@dataclass(kw_only=True)
class ServingSpec:
    """A serving run: the command is a server; acceptrun waits for it, loads it, judges it."""

    url: str | None = doc(
        'URL the load is sent to, e.g. "http://127.0.0.1:8000/v1/completions"; setting it '
        "makes the run a serving run whose command is the server (docs/inference.md).",
        None,
    )
    method: str = doc('HTTP method of every request: "POST", "GET" or "PUT".', "POST")
    payload: str | None = doc(
        "JSONL file of request bodies, one JSON value a line, sent in turn (cycled); relative "
        "to the spec file; unset: an empty body.",
        None,
    )
    headers: dict[str, str] = doc(
        'Extra request headers, e.g. { Authorization = "Bearer test" }.', factory=dict
    )
    ready_url: str | None = doc(
        "Health URL polled until it answers 2xx: the server is then ready, e.g. "
        '"http://127.0.0.1:8000/health".',
        None,
    )
    ready_log: str | None = doc(
        "Regular expression searched in the server's stdout and stderr: the server is ready "
        'at the first matching line, e.g. "Uvicorn running on".',
        None,
    )
    ready_timeout: Duration = doc(
        "Longest wait from launch to ready; past it the readiness check fails.", Duration(120.0)
    )
    rate: float | None = doc(
        "Open loop: requests per second sent on a schedule fixed in advance (Poisson arrivals "
        "as MLPerf's Server scenario), whether or not earlier ones have answered.",
        None,
    )
    arrivals: str = doc(
        'Open-loop arrival process: "poisson" (exponential gaps) or "uniform" (even gaps).',
        "poisson",
    )
    concurrency: int | None = doc(
        "Closed loop: this many clients, each sending its next request when the last answered.",
        None,
    )
    duration: Duration | None = doc('Send requests for this long (from ready), e.g. "60s".', None)
    requests: int | None = doc(
        "Send this many requests; with duration too, whichever comes first.", None
    )
    stream: bool = doc(
        "Responses are server-sent events (OpenAI-style stream = true): time to first token "
        "and inter-token latency are measured, one token per data event.",
        False,
    )
    request_timeout: Duration = doc(
        "A request with no complete answer after this long is an error.", Duration(30.0)
    )
    seed: int = doc("Seed of the arrival schedule (the same seed, the same schedule).", 0)
    slo_latency: Duration | None = doc(
        'Per-request SLO on end-to-end latency, for goodput, e.g. "500ms".', None
    )
    slo_ttft: Duration | None = doc("Per-request SLO on time to first token, for goodput.", None)
    slo_itl: Duration | None = doc(
        "Per-request SLO on the mean time per output token after the first, for goodput.", None
    )
    max_latency_p50: Duration | None = doc("Highest acceptable median latency.", None)
    max_latency_p90: Duration | None = doc("Highest acceptable 90th percentile latency.", None)
    max_latency_p99: Duration | None = doc("Highest acceptable 99th percentile latency.", None)
    max_ttft_p99: Duration | None = doc(
        "Highest acceptable 99th percentile time to first token (stream = true).", None
    )
    max_error_rate: float | None = doc(
        "Largest share of requests that failed (status >= 400, broken or timed out), 0 to 1.",
        None,
    )
    min_goodput: float | None = doc(
        "Lowest acceptable goodput: successful requests per second that met every slo_*.", None
    )
    min_requests_per_s: float | None = doc(
        "Lowest acceptable rate of completed requests per second over the load.", None
    )
    max_cold_start: Duration | None = doc(
        "Longest acceptable time from launch to the first successful response.", None
    )
    max_usd_per_1k_requests: float | None = doc(
        "Highest acceptable cost per 1,000 successful requests, in USD (needs a price in [cost]).",
        None,
    )

    @property
    def enabled(self) -> bool:
        """True when the spec describes a serving run."""
        return self.url is not None

    def __post_init__(self) -> None:
        changed = [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name)
            != (f.default if f.default is not dataclasses.MISSING else {})  # headers: a dict
        ]
        _require(
            self.enabled or not changed,
            "serving.url", self.url,
            'the URL the load goes to, e.g. url = "http://127.0.0.1:8000/v1/completions"',
        )  # fmt: skip
        if not self.enabled:
            return
        assert self.url is not None
        for name in ("url", "ready_url"):
            value = getattr(self, name)
            _require(
                value is None or re.fullmatch(r"https?://[^/\s]+(/\S*)?", value) is not None,
                f"serving.{name}", value, 'an http:// or https:// URL, e.g. "http://127.0.0.1:8000/health"',
            )  # fmt: skip
        _require(
            self.ready_url is not None or self.ready_log is not None,
            "serving.ready_url", self.ready_url,
            'a health URL (ready_url = "http://127.0.0.1:8000/health") or a log pattern '
            '(ready_log = "Uvicorn running on") that says when the server is ready',
        )  # fmt: skip
        if self.ready_log is not None:
            try:
                re.compile(self.ready_log)
            except re.error as exc:
                _require(
                    False, "serving.ready_log", self.ready_log, f"a regular expression ({exc})"
                )
        _require(
            self.method.upper() in SERVING_METHODS,
            "serving.method", self.method, '"POST", "GET" or "PUT"',
        )  # fmt: skip
        _require(
            (self.rate is None) != (self.concurrency is None),
            "serving.rate", self.rate,
            "exactly one of rate (open loop, requests/s) and concurrency (closed loop, clients)",
        )  # fmt: skip
        _require(self.rate is None or self.rate > 0, "serving.rate", self.rate, "a positive rate")
        _require(
            self.concurrency is None or self.concurrency >= 1,
            "serving.concurrency", self.concurrency, "1 or more clients",
        )  # fmt: skip
        _require(
            self.arrivals in SERVING_ARRIVALS,
            "serving.arrivals", self.arrivals, '"poisson" or "uniform"',
        )  # fmt: skip
        _require(
            self.duration is not None or self.requests is not None,
            "serving.duration", self.duration,
            'a length of load (duration = "60s") or a count (requests = 1000), or both',
        )  # fmt: skip
        _require(
            self.requests is None or self.requests >= 1,
            "serving.requests", self.requests, "1 or more requests",
        )  # fmt: skip
        for name in ("duration", "ready_timeout", "request_timeout", "slo_latency", "slo_ttft",
                     "slo_itl", "max_latency_p50", "max_latency_p90", "max_latency_p99",
                     "max_ttft_p99", "max_cold_start"):  # fmt: skip
            value = getattr(self, name)
            _require(value is None or value > 0, f"serving.{name}", value, "a positive duration")
        _require(
            self.max_error_rate is None or 0 <= self.max_error_rate <= 1,
            "serving.max_error_rate", self.max_error_rate, "a share from 0 to 1",
        )  # fmt: skip
        for name in ("min_goodput", "min_requests_per_s", "max_usd_per_1k_requests"):
            value = getattr(self, name)
            _require(value is None or value > 0, f"serving.{name}", value, "a positive number")
        _require(
            self.stream or (self.slo_ttft is None and self.slo_itl is None and self.max_ttft_p99 is None),
            "serving.stream", self.stream,
            "stream = true for slo_ttft, slo_itl or max_ttft_p99 (tokens come from a stream)",
        )  # fmt: skip


@dataclass(kw_only=True)
class CleanupSpec:
    """What to clean up when the run ends."""

    commands: list[str] = doc(
        "Shell commands run in the workdir after the last attempt.", factory=list
    )
    remove: list[str] = doc(
        "Paths or globs (relative to the workdir) removed after the run.", factory=list
    )


@dataclass(kw_only=True)
class RunSpec:
    """A run spec: the job and everything fixed about it before launch."""

    name: str = doc("Name of the job; part of each run id.")
    command: list[str] = doc(
        'The job: a list (run as is) or a string (run by /bin/sh -c), e.g. ["python", "train.py"].'
    )
    workdir: str = doc("Working directory of the job, relative to the spec file.", ".")
    env: dict[str, str] = doc("Extra environment variables for the job.", factory=dict)
    description: str | None = doc("A sentence on what this run is for.", None)
    resources: ResourcesSpec = doc("What the run needs from the machine.", factory=ResourcesSpec)
    expect: ExpectSpec = doc("Environment expectations checked before launch.", factory=ExpectSpec)
    data: DataSpec = doc("Data verified before the first step.", factory=DataSpec)
    checkpoint: CheckpointSpec = doc(
        "Checkpoint location, interval and retention.", factory=CheckpointSpec
    )
    limits: LimitsSpec = doc("Limits the supervisor enforces.", factory=LimitsSpec)
    cost: CostSpec = doc("Machine price for the ledger and budget.", factory=CostSpec)
    acceptance: AcceptanceSpec = doc(
        "What the run must show to be accepted.", factory=AcceptanceSpec
    )
    cleanup: CleanupSpec = doc("Clean-up after the run.", factory=CleanupSpec)
    inference: InferenceSpec = doc(
        "Batch inference: input items, output shards, coverage and cost per item.",
        factory=InferenceSpec,
    )
    serving: ServingSpec = doc(
        "Serving: the command is a server; readiness, load, latency SLOs, cost per request.",
        factory=ServingSpec,
    )
    outputs: dict[str, str] = doc(
        "Outputs the script writes, by name: a path or glob relative to the workdir, e.g. "
        '{ model = "out/model.pt" }; each is checked and hashed at the end of every attempt.',
        factory=dict,
    )
    progress: ProgressSpec = doc(
        "Progress of a script without the client API: its log lines or TensorBoard files.",
        factory=ProgressSpec,
    )
    telemetry: TelemetrySpec = doc(
        "Host and GPU sampling, idle detection, MFU, Prometheus.", factory=TelemetrySpec
    )
    slurm: SlurmSpec = doc("Options of the Slurm backend.", factory=SlurmSpec)
    skypilot: SkypilotSpec = doc("Options of the SkyPilot export.", factory=SkypilotSpec)

    # Set by load_spec, not by the user: where the spec came from.
    source: str = field(default="<memory>", metadata={"internal": True}, compare=False)
    base_dir: str = field(default=".", metadata={"internal": True}, compare=False)

    def __post_init__(self) -> None:
        _require(
            bool(self.name.strip()), "name", self.name, 'a non-empty name such as "bert-squad"'
        )
        # The name is shown in terminals, reports and run ids: no escape sequences in it.
        _require(
            not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in self.name),
            "name", self.name, "a name without control characters (tab, newline, ESC, NUL)",
        )  # fmt: skip
        _require(
            len(self.command) > 0 and bool(self.command[0]),
            "command",
            self.command,
            'a command such as ["python", "train.py"]',
        )
        _require(
            not (self.serving.enabled and self.inference.enabled),
            "serving.url", self.serving.url,
            "no [serving] url in a batch inference run ([inference] input): one kind of run a spec",
        )  # fmt: skip

    # ---- derived values --------------------------------------------------------------

    @property
    def workdir_path(self) -> Path:
        """The job's working directory, absolute."""
        return (Path(self.base_dir) / self.workdir).resolve()

    def resolve_path(self, value: str) -> str:
        """A path from the spec made absolute against the spec's directory; URLs untouched."""
        if "://" in value:
            return value
        return str((Path(self.base_dir) / Path(value).expanduser()).resolve())

    @property
    def shell(self) -> bool:
        """True when the command was written as a string and runs through /bin/sh."""
        return len(self.command) == 3 and self.command[:2] == ["/bin/sh", "-c"]

    def to_dict(self) -> dict[str, Any]:
        """The resolved spec as plain data (durations in seconds), ready for TOML."""
        plain: dict[str, Any] = _to_plain(self)
        return plain

    def to_toml(self) -> str:
        """The frozen, resolved spec: loadable again by :func:`load_spec`."""
        data = self.to_dict()
        data["workdir"] = str(self.workdir_path)
        if self.data.path:
            data["data"]["path"] = self.resolve_path(self.data.path)
        if self.data.manifest:
            data["data"]["manifest"] = self.resolve_path(self.data.manifest)
        if self.checkpoint.dir:
            data["checkpoint"]["dir"] = self.resolve_path(self.checkpoint.dir)
        if self.checkpoint.mirror:
            data["checkpoint"]["mirror"] = self.resolve_path(self.checkpoint.mirror)
        if self.inference.input:
            data["inference"]["input"] = self.resolve_path(self.inference.input)
            data["inference"]["output"] = self.resolve_path(self.inference.output)
        if self.serving.payload:
            data["serving"]["payload"] = self.resolve_path(self.serving.payload)
        header = (
            f"# Frozen by acceptrun from {self.source}; paths resolved, durations in seconds.\n"
        )
        return header + tomli_w.dumps(data)

    @property
    def hash(self) -> str:
        """Content hash of the resolved spec (same spec, same hash)."""
        return hash_bytes(tomli_w.dumps(self.to_dict()).encode())


# ---- loading and validation ------------------------------------------------------------------


class _Problem(Exception):
    """One validation problem; collected, then raised together as a SpecError."""

    def __init__(self, path: str, value: Any, accepted: str) -> None:
        super().__init__(f"{path}: {_show(value)} is not valid; expected {accepted}")


_PATTERN_HELP = 'a version pattern such as ">=2.1", "2.13.*", "==12.4" or "12"'


def _require(ok: bool, path: str, value: Any, accepted: str) -> None:
    if not ok:
        raise _Problem(path, value, accepted)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


def load_spec(path: str | Path) -> RunSpec:
    """Read, parse and validate a spec file; raises :class:`SpecError` with every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), ["file not found; create one with `acceptrun init`"]) from None
    except IsADirectoryError:
        raise SpecError(str(path), ["is a directory; give the path of a .toml spec file"]) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            str(path), [f"is not UTF-8 text ({exc.reason} at byte {exc.start})"]
        ) from None
    return parse_spec(text, source=str(path), base_dir=path.resolve().parent)


def parse_spec(text: str, *, source: str = "<spec>", base_dir: str | Path = ".") -> RunSpec:
    """Parse spec text; paths in it are relative to ``base_dir``."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(source, [_toml_error(exc)]) from None
    problems: list[str] = []
    spec: RunSpec | None = _build(RunSpec, raw, "", problems)
    if problems or spec is None:
        raise SpecError(source, problems)
    spec.source = source
    spec.base_dir = str(Path(base_dir).resolve())
    return spec


def _toml_error(exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    match = re.search(r"\(at line (\d+), column (\d+)\)", message)
    if match:
        where = f"line {match[1]}, column {match[2]}"
        what = message[: match.start()].strip()
        return f"TOML syntax error at {where}: {what}"
    if "end of document" in message:
        what = message.split("(")[0].strip()
        return f"TOML syntax error at the end of the file: {what}"
    return f"TOML syntax error: {message}"


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    """Convert a TOML table into dataclass ``cls``, appending problems instead of raising."""
    where = prefix.rstrip(".") or "the spec"
    if not isinstance(raw, dict):
        problems.append(f"{where}: {_show(raw)} is not valid; expected a table ([{where}])")
        return None
    fields = _fields(cls)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            )
            # Reported, but not blocking: the section's own checks still run.
            problems.append(f"{prefix}{_key(key)}: unknown key{hint}")
            before += 1
            continue
        try:
            kwargs[key] = _convert(hints[key], value, f"{prefix}{key}", problems)
        except _Problem as exc:
            problems.append(str(exc))
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in raw:
            problems.append(f"{prefix}{name}: missing; {f.metadata['doc']}")
    if len(problems) > before:
        # Sibling sections are still validated, so one pass reports everything.
        return None
    try:
        return cls(**kwargs)
    except _Problem as exc:
        problems.append(str(exc))
        return None


def _convert(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return _convert(options[0], value, path, problems)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path + ".", problems)  # type: ignore[arg-type]
    if tp is Duration:
        return Duration(parse_duration(value, path))
    if origin is list:
        (item,) = get_args(tp)
        if path == "command" and isinstance(value, str):
            return _command_from_string(value, path)
        _require(isinstance(value, list), path, value, f"a list, e.g. {_example(tp, path)}")
        return [_convert(item, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        _, item = get_args(tp)
        _require(isinstance(value, dict), path, value, f"a table, e.g. {_example(tp, path)}")
        return {k: _convert(item, v, f"{path}.{_key(k)}", problems) for k, v in value.items()}
    if tp is bool:
        _require(isinstance(value, bool), path, value, "true or false")
        return value
    if tp is int:
        _require(
            isinstance(value, int) and not isinstance(value, bool), path, value, "a whole number"
        )
        return value
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        _require(ok, path, value, "a number")
        return float(value)
    if tp is str:
        _require(isinstance(value, str), path, value, "a string")
        return value
    raise TypeError(f"spec field {path} has unsupported type {tp!r}")  # internal invariant


def _example(tp: Any, path: str) -> str:
    if path == "command":
        return '["python", "train.py"]'
    return '["a", "b"]' if get_origin(tp) is list else '{ name = "value" }'


def _command_from_string(value: str, path: str) -> list[str]:
    _require(bool(value.strip()), path, value, 'a command such as "python train.py"')
    try:
        shlex.split(value)
    except ValueError as exc:
        raise _Problem(path, value, f"a command with balanced quotes ({exc})") from None
    return ["/bin/sh", "-c", value]


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any, path: str = "duration") -> float:
    """``90`` / ``"90s"`` / ``"10m"`` / ``"1h30m"`` / ``"2d"`` -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        _require(math.isfinite(value), path, value, "a finite number of seconds")
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        parts = _DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNITS[u] for n, u in parts)
    raise _Problem(path, value, 'a duration: seconds as a number, or "90s", "10m", "2h", "1h30m"')


# ---- conditions and patterns -----------------------------------------------------------------

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


@dataclass(frozen=True, slots=True)
class Condition:
    """A metric threshold such as ``>= 0.9``."""

    op: str
    value: float

    def check(self, found: float) -> bool:
        return _OPS[self.op](found, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


def parse_condition(text: str) -> Condition:
    """``">= 0.9"`` -> ``Condition(">=", 0.9)``; raises ValueError naming the forms accepted."""
    match = re.fullmatch(
        r"\s*(>=|<=|==|!=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*", text
    )
    if not match:
        raise ValueError(
            'a threshold such as ">= 0.9", "< 1.5" or "== 1" (operators >= > <= < == !=)'
        )
    return Condition(match[1], float(match[2]))


def _valid_version_pattern(pattern: str) -> bool:
    if any(c in pattern for c in "<>=!~"):
        try:
            SpecifierSet(pattern)
        except InvalidSpecifier:
            return False
        return True
    return bool(re.fullmatch(r"[0-9][0-9A-Za-z.+*-]*", pattern.strip()))


def match_pattern(pattern: str, found: str | None, *, kind: str = "version") -> bool:
    """Does ``found`` satisfy a spec pattern?

    Versions: a PEP 440 specifier (``">=2.1,<3"``), a wildcard (``"12.*"``) or a bare
    prefix (``"12"`` matches 12.4; ``"2.13"`` matches 2.13.0+cpu). Names (``kind="name"``,
    GPU models): a case-insensitive glob, or a substring when it has no glob characters.
    """
    if found is None:
        return False
    if kind == "name":
        p, f = pattern.lower(), found.lower()
        return fnmatch.fnmatchcase(f, p) if any(c in p for c in "*?[") else p in f
    if any(c in pattern for c in "<>=!~"):
        try:
            return SpecifierSet(pattern).contains(found, prereleases=True)
        except (InvalidSpecifier, InvalidVersion):
            return False
    if "*" in pattern:
        return fnmatch.fnmatchcase(found, pattern)
    return found == pattern or re.match(re.escape(pattern) + r"(?:[.+]|$)", found) is not None


def version_or_none(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


# ---- plain data -------------------------------------------------------------------------------


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if f.metadata.get("internal"):
                continue
            value = _to_plain(getattr(obj, f.name))
            if value is not None:  # TOML has no null: absent means default
                out[f.name] = value
        return out
    if isinstance(obj, list):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, Duration):
        return float(obj)
    return obj
