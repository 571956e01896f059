"""The run spec: everything a user fixes before launch, in one TOML file.

The dataclasses below are the single declaration of the format. Each field is made by
:func:`doc` with its docstring and its constraints (bounds, allowed
values, formats, units); the loader (:mod:`acceptrun.spec.load`), the JSON Schema and the
docs table (:mod:`acceptrun.spec.schema`) all read them. ``__post_init__`` checks the
declared constraints again (a section built in code obeys them too) and, by hand, the
rules that involve several fields.

The names callers use are importable from here: ``load_spec``, ``parse_spec`` (from
``load``), ``parse_condition``, ``match_pattern`` (from ``conditions``), ``Duration``,
``parse_duration``, ``format_duration`` (from ``units``).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from acceptrun._util.hashing import hash_bytes
from acceptrun._util.redact import declare_secret_env_fields, declare_secret_fields
from acceptrun._util.userregex import compile_user_pattern
from acceptrun.spec.conditions import (
    Condition,
    match_pattern,
    parse_condition,
    version_or_none,
)
from acceptrun.spec.fields import Rules, check_fields, fields_of, to_plain
from acceptrun.spec.load import load_spec, parse_spec
from acceptrun.spec.problem import Problem, key, require
from acceptrun.spec.units import DURATION_RE, Duration, format_duration, parse_duration

__all__ = [
    "IDLE_ACTIONS",
    "INFERENCE_FORMATS",
    "KNOWN_DRILLS",
    "NOTIFY_EVENTS",
    "SECRET_ENV_FIELDS",
    "SECRET_FIELDS",
    "SERVING_ARRIVALS",
    "SERVING_METHODS",
    "SKYPILOT_TEARDOWNS",
    "THROUGHPUT_UNITS",
    "AcceptanceSpec",
    "CheckpointSpec",
    "CleanupSpec",
    "Condition",
    "CostSpec",
    "DataSpec",
    "Duration",
    "ExpectSpec",
    "InferenceSpec",
    "LimitsSpec",
    "NotifySpec",
    "ProgressSpec",
    "ResourcesSpec",
    "Rules",
    "RunSpec",
    "ServingSpec",
    "SkypilotSpec",
    "SlurmSpec",
    "TelemetrySpec",
    "doc",
    "format_duration",
    "load_spec",
    "match_pattern",
    "parse_condition",
    "parse_duration",
    "parse_spec",
    "version_or_none",
]

# Older names, kept for the modules and tests that import them from here.
_Problem = Problem
_DURATION_RE = DURATION_RE
_fields = fields_of
_to_plain = to_plain


def doc(
    text: str,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    *,
    from_string: Callable[[str, str], Any] | None = None,
    example: str | None = None,
    **rules: Any,
) -> Any:
    """A dataclass field with a one-line docstring and its :class:`Rules`.

    ``from_string(value, path)`` converts a string written where a list is declared
    (``command = "python train.py"``); ``example`` is shown when the type is wrong.
    """
    metadata: dict[str, Any] = {"doc": text, "rules": Rules(**rules)}
    if from_string is not None:
        metadata["from_string"] = from_string
    if example is not None:
        metadata["example"] = example
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


KNOWN_DRILLS = ("restore", "kill", "preempt", "campaign")
NOTICE_PROVIDERS = ("none", "aws", "gcp", "azure")  # limits.preemption_notice
THROUGHPUT_UNITS = ("samples/s", "tokens/s", "steps/s")
IDLE_ACTIONS = ("stop", "event")
SKYPILOT_TEARDOWNS = ("down", "managed", "keep")  # skypilot.teardown
INFERENCE_FORMATS = ("auto", "jsonl", "text")
SERVING_ARRIVALS = ("poisson", "uniform")
SERVING_METHODS = ("GET", "POST", "PUT")

# Words of the errors that deserve a reason or an example.
_POSITIVE_STEPS = "a positive step count"
_SHARE = "a share from 0 to 1"
_HTTP_URL = r"^https?://[^/\s]+(/\S*)?$"
_HTTP_ACCEPTS = 'an http:// or https:// URL, e.g. "http://127.0.0.1:8000/health"'
_POSITIVE_DURATION = "a positive duration"
# The reach of a path field that acceptrun only reads (spec/fields.py Rules.reach).
_READ_ONLY = "read, never written"
_ENV_NAME_BAD = re.compile(r"[\x00-\x1f\x7f]")  # with "=": what an environment name cannot hold


# ---- sections -----------------------------------------------------------------------------


@dataclass(kw_only=True)
class ResourcesSpec:
    """What the run needs from the machine."""

    SECTION: ClassVar[str] = "resources"

    gpus: int = doc("GPUs on one machine; 0 runs on CPU.", 0, ge=0, accepts="a count of 0 or more")
    gpu_types: list[str] = doc(
        'Acceptable GPU models, matched against the GPU name, e.g. ["H100", "H200"]; empty: any.',
        factory=list,
    )
    min_gpu_memory_gb: float = doc(
        "Minimum memory per GPU in GiB; 0: no minimum.", 0.0, ge=0, unit="GiB"
    )
    cpus: int | None = doc("CPU cores the run needs (used by batch backends).", None)
    memory_gb: float | None = doc(
        "Host memory the run needs in GiB (used by batch backends).", None, unit="GiB"
    )
    processes: int = doc(
        "Processes on each machine: one per GPU, or CPU processes (gloo); more than 1 "
        "launches the command through torchrun.",
        1,
        ge=1,
    )
    nodes: int = doc("Machines the run spans (batch backends: Slurm, SkyPilot).", 1, ge=1)

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


@dataclass(kw_only=True)
class ExpectSpec:
    """Environment expectations checked before launch; a mismatch stops the run."""

    SECTION: ClassVar[str] = "expect"

    python: str | None = doc(
        'Python version pattern, e.g. ">=3.11" or "3.11.*".', None, format="version-pattern"
    )
    packages: dict[str, str] = doc(
        'Package version patterns, e.g. { torch = ">=2.1,<3" }.',
        factory=dict,
        format="version-pattern",
    )
    cuda: str | None = doc(
        'CUDA runtime of torch, e.g. "12.*"; "none" requires a CPU build.',
        None,
        format="cuda-pattern",
    )
    driver: str | None = doc(
        'NVIDIA driver version pattern, e.g. ">=550".', None, format="version-pattern"
    )
    gpu: str | None = doc(
        'GPU model pattern every visible GPU must match, e.g. "H100" or "*A100*80GB*".',
        None,
        format="name",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


@dataclass(kw_only=True)
class DataSpec:
    """The data snapshot, verified against its manifest before the first step."""

    SECTION: ClassVar[str] = "data"

    path: str | None = doc(
        "Data directory, file or fsspec URL (s3://..., gs://...).",
        None,
        format="path",
        reach=_READ_ONLY,
    )
    manifest: str | None = doc(
        "Manifest from `acceptrun data snapshot` (it records its own excludes); the data must match it.",
        None,
        format="path",
        reach=_READ_ONLY,
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        require(
            self.manifest is None or self.path is not None,
            "data.manifest", self.manifest, "a manifest together with data.path",
        )  # fmt: skip


@dataclass(kw_only=True)
class CheckpointSpec:
    """Where and how often checkpoints are written (used by the checkpoint store)."""

    SECTION: ClassVar[str] = "checkpoint"

    dir: str | None = doc(
        "Parent directory of this spec's checkpoint stores: each run keeps its own in "
        "<dir>/<run id>/ (OWNER.json names the run), so specs and repeated runs that share "
        "it never mix; default: checkpoints/ in the run record.",
        None,
        format="path",
        reach="a checkpoint store acceptrun owns per run: a run writes, verifies, lists and "
        "prunes only the steps of <dir>/<run id>/",
    )
    every_steps: int | None = doc(
        "Checkpoint every N steps.", None, gt=0, unit="steps", accepts=_POSITIVE_STEPS
    )
    every: Duration | None = doc('Checkpoint at least this often, e.g. "30m".', None, gt=0)
    memory_every: int | None = doc(
        "Also save the state to host shared memory every N steps (the memory tier, "
        "docs/checkpoints.md): a copy the supervisor keeps across the workload's death, "
        "restored before the durable checkpoints when newer; never counted as durable. "
        "Costs the loop one host copy of the state per save (overlapped like a durable "
        "save's) and twice the state in host memory. Off by default; run.maybe_checkpoint "
        "saves it, in runs of one process.",
        None,
        gt=0,
        unit="steps",
        accepts=_POSITIVE_STEPS,
    )
    keep_last: int = doc(
        "Keep the newest N checkpoints (2 or more).",
        2,
        ge=2,
        accepts="2 or more: the newest checkpoint may still be saving or may fail "
        "verification, and the one before it is what a restart falls back to",
    )
    keep_every: int | None = doc(
        "Also keep every checkpoint whose step is a multiple of N.",
        None,
        gt=0,
        unit="steps",
        accepts=_POSITIVE_STEPS,
    )
    keep_best: str | None = doc(
        'Also keep the best by a metric, e.g. "eval/loss:min".',
        None,
        pattern=r"^[^:]+:(min|max)$",
        accepts='"<metric>:min" or "<metric>:max"',
    )
    mirror: str | None = doc(
        "Copy committed checkpoints to this path or fsspec URL.",
        None,
        format="path",
        reach="a mirror (a path or fsspec URL) that receives copies of committed checkpoints",
    )
    watch: list[str] = doc(
        "The script's own checkpoints: files, directories or globs relative to the workdir "
        '(inside it: a restart writes them back there), e.g. ["out/ckpt.pt"] or '
        '["output/checkpoint-*"]; each complete one is captured.',
        factory=list,
        format="workdir-glob",
    )
    resume_args: list[str] = doc(
        "Arguments added to the command when it resumes from a watched checkpoint; "
        '"{checkpoint}" is the restored path, e.g. ["--resume_from_checkpoint", "{checkpoint}"].',
        factory=list,
        format="arg",
    )
    settle: Duration = doc(
        "A watched checkpoint is complete once its size and mtime held this long and no "
        "process of the attempt has it open for writing.",
        Duration(2.0),
        ge=0,
        accepts='a duration such as "2s"',
    )
    existing: str = doc(
        "What a fresh run does with a file checkpoint.watch matches before its first "
        'attempt (left by an earlier run): "refuse" (preflight fails, naming it), "move" '
        '(renamed into the record\'s leftovers/ before the first attempt) or "start" (kept '
        "and declared the run's starting point; provenance and the verdict name it).",
        "refuse",
        choices=("refuse", "move", "start"),
    )
    staging: str = doc(
        'How a save copies the state into host memory: "overlap" (the parameters and '
        "optimizer state in host memory are copied beside the next forward and backward; "
        "the next torch.optim optimizer step waits for the copy, so the checkpoint still "
        'holds its step\'s state bit for bit) or "block" (all of it inside the save call). '
        "A save whose state changed in place outside an optimizer step before it was "
        'copied fails naming the tensor: use "block" for such a script.',
        "overlap",
        choices=("overlap", "block"),
    )
    mtbf: Duration | None = doc(
        "Mean time between interruptions of the whole job (for a job of N GPUs, one GPU's "
        'mean time to failure / N), e.g. "6h": what the checkpoint-interval advice uses '
        "when the run saw too few interruptions to measure it (docs/checkpoint-interval.md).",
        None,
        gt=0,
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        require(
            not self.resume_args or bool(self.watch),
            "checkpoint.resume_args", self.resume_args,
            "resume arguments together with checkpoint.watch (the files they resume from)",
        )  # fmt: skip


@dataclass(kw_only=True)
class ProgressSpec:
    """Step, loss and metrics read from what an unmodified script prints or writes."""

    SECTION: ClassVar[str] = "progress"

    pattern: str | None = doc(
        "Regular expression over output lines with named groups: step, or epoch and batch "
        "(with total, the batches of an epoch), then loss and any metric, e.g. "
        r'"iter (?P<step>\\d+): loss (?P<loss>[0-9.eE+-]+)" (docs/own-script.md).',
        None,
        format="regex",
        pattern=r"\(\?P<(step|batch|iter|epoch)>",
        accepts="a pattern with a named group (?P<step>\\d+), or (?P<epoch>\\d+) and "
        "(?P<batch>\\d+)",
    )
    epoch_length: int | None = doc(
        "Steps (batches) in one epoch, when progress.pattern names the epoch and batch but "
        "no (?P<total>...) group, or its counter starts again each epoch.",
        None,
        gt=0,
    )
    first_epoch: int = doc(
        "The number the script gives its first epoch: 0 (the ImageNet example, timm, "
        "Lightning) or 1 (Keras, fairseq, mmengine).",
        0,
        ge=0,
        le=1,
    )
    stream: str = doc(
        'Which output the pattern reads: "stdout", "stderr" or "both".',
        "both",
        choices=("stdout", "stderr", "both"),
    )
    tensorboard: str | None = doc(
        "Directory (relative to the workdir) where the script writes TensorBoard event files.",
        None,
        format="path",
        reach=_READ_ONLY,
    )
    tags: dict[str, str] = doc(
        'TensorBoard tag of each value, e.g. { loss = "train/loss" }; default: every scalar.',
        factory=dict,
        format="name",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        if self.pattern is None:
            return
        groups = set(compile_user_pattern(self.pattern, where="progress.pattern").groupindex)
        counted = bool(groups & {"batch", "iter"}) or "step" not in groups
        require(
            not counted or "total" in groups or self.epoch_length is not None,
            "progress.pattern", self.pattern,
            "the epoch's length with a pattern that counts batches or epochs: add a "
            "(?P<total>\\d+) group on the i/len form, or set progress.epoch_length",
        )  # fmt: skip


@dataclass(kw_only=True)
class LimitsSpec:
    """Limits the supervisor enforces."""

    SECTION: ClassVar[str] = "limits"

    wall_time: Duration | None = doc(
        'Stop the run after this long, all attempts together, e.g. "12h".', None, gt=0
    )
    expected_runtime: list[Duration] = doc(
        'Acceptable runtime range [min, max], e.g. ["20m", "2h"].',
        factory=list,
        ge=0,
        min_items=2,
        max_items=2,
        empty_ok=True,
        accepts='two durations [min, max] with min <= max, e.g. ["20m", "2h"]',
    )
    max_restarts: int = doc("Restarts after a failure before the run is given up.", 3, ge=0)
    restart_backoff: Duration = doc(
        "Wait before the first restart; doubles each time (max 5 min). Not after a "
        "preemption or a hang: nothing to wait for.",
        Duration(5.0),
        ge=0,
        accepts="0 or more seconds",
    )
    warm_restart: bool = doc(
        "Keep the next attempt waiting in run.restore() while one runs (a standby: the "
        "interpreter started, the imports and what the script builds before restore() "
        "done), so that a restart skips them; where memory allows, a client script of one "
        "process only. Off by default: the standby runs the script's code before restore() "
        "beside the active attempt and holds its memory.",
        False,
    )
    grace_period: Duration = doc(
        "After asking the workload to stop, wait this long before killing it.",
        Duration(30.0),
        ge=0,
        accepts="0 or more seconds",
    )
    budget_usd: float | None = doc(
        "Stop before the run costs more than this, in USD.",
        None,
        gt=0,
        unit="USD",
        accepts="a positive amount in USD",
    )
    idle_window: Duration | None = doc(
        'Stop after the GPU (or process) is idle this long, e.g. "15m".', None, gt=0
    )
    hang_window: Duration | None = doc(
        'Treat the run as hung after no step for this long, e.g. "20m".', None, gt=0
    )
    max_loss: float | None = doc(
        "A logged loss above this (or NaN/inf, always) means the run diverged.", None
    )
    on_divergence: str = doc(
        '"stop" the run, or "rollback" to the checkpoint before the newest one.',
        "stop",
        choices=("stop", "rollback"),
    )
    preemption_notice: str = doc(
        "Poll this cloud's preemption notice (a spot or preemptible machine's) and, once it "
        "comes, ask the workload to checkpoint and stop at once, inside the notice: "
        '"aws" (IMDSv2 spot/instance-action), "gcp" (instance/preempted), "azure" '
        '(Scheduled Events, Preempt), or "none".',
        "none",
        choices=NOTICE_PROVIDERS,
    )
    preemption_notice_url: str | None = doc(
        "The metadata service's address for preemption_notice (default: the provider's own, "
        'e.g. "http://169.254.169.254"); a proxy or a test server.',
        None,
        pattern=_HTTP_URL,
        accepts=_HTTP_ACCEPTS,
    )
    preemption_notice_poll: Duration = doc(
        "Seconds between two looks at the preemption notice (AWS advises every 5 s).",
        Duration(5.0),
        gt=0,
        le=60,
        accepts="a duration above 0 and at most 60s",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        if self.expected_runtime:
            rng = self.expected_runtime
            require(
                rng[0] <= rng[1], "limits.expected_runtime",
                [format_duration(x) for x in rng], 'two durations [min, max] with min <= max, e.g. ["20m", "2h"]',
            )  # fmt: skip


@dataclass(kw_only=True)
class TelemetrySpec:
    """Host and GPU sampling, idle detection, MFU and live exports."""

    SECTION: ClassVar[str] = "telemetry"

    interval: Duration = doc(
        "Seconds between host and GPU samples taken by the supervisor.",
        Duration(2.0),
        gt=0,
        accepts="a positive duration",
    )
    gpu: bool = doc("Sample GPUs through NVML when the machine has them.", True)
    idle_threshold: float = doc(
        "Activity below which the run counts as idle: GPU utilization in %, or without a "
        "GPU the CPU use of the workload's processes in % of one core.",
        5.0,
        ge=0,
        le=100 * 1024,  # 1024 cores busy: a bound that catches a misplaced unit
        unit="%",
        accepts="a percentage, 0 or more",
    )
    idle_action: str = doc(
        'What limits.idle_window triggers: "stop" (graceful, checkpoint first) or "event".',
        "stop",
        choices=IDLE_ACTIONS,
    )
    prometheus_port: int | None = doc(
        "Serve Prometheus metrics on 127.0.0.1 at this port during the run; 0 picks a free port.",
        None,
        ge=0,
        le=65535,
        accepts="a TCP port, 0 to 65535",
    )
    flops_per_sample: float | None = doc(
        "Training FLOPs per sample (forward and backward), for MFU.", None, gt=0, unit="FLOPs"
    )
    flops_per_token: float | None = doc(
        "Training FLOPs per token, for MFU.", None, gt=0, unit="FLOPs"
    )
    peak_tflops: float | None = doc(
        "Peak dense TFLOP/s of one device for MFU; default: the table of known GPUs.",
        None,
        gt=0,
        unit="TFLOP/s",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


@dataclass(kw_only=True)
class SlurmSpec:
    """Options of the Slurm backend (`acceptrun submit --backend slurm`)."""

    SECTION: ClassVar[str] = "slurm"

    partition: str | None = doc("Partition (sbatch --partition).", None, format="line")
    account: str | None = doc("Account (sbatch --account).", None, format="line")
    qos: str | None = doc("Quality of service (sbatch --qos).", None, format="line")
    signal_grace: Duration = doc(
        "Slurm sends USR1 this long before the time limit: checkpoint, exit, requeue.",
        Duration(120.0),
        gt=0,
        accepts="a positive duration",
    )
    extra_args: list[str] = doc(
        'More sbatch options, e.g. ["--constraint=h100"].', factory=list, format="line"
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


@dataclass(kw_only=True)
class SkypilotSpec:
    """Options of the SkyPilot export (`acceptrun export skypilot`)."""

    SECTION: ClassVar[str] = "skypilot"

    cloud: str | None = doc(
        'Cloud to launch on, e.g. "lambda", "aws"; default: any.', None, format="name"
    )
    region: str | None = doc("Region, e.g. us-east-1; default: any.", None, format="name")
    accelerators: str | None = doc(
        'SkyPilot accelerators, e.g. "H100:8"; default: from resources.gpu_types and gpus.', None
    )
    use_spot: bool = doc(
        "Use spot (preemptible) capacity; recovery resumes from the mirror.", False
    )
    image_id: str | None = doc(
        "Machine or Docker image, e.g. docker:nvcr.io/nvidia/pytorch:24.05-py3.", None
    )
    disk_size: int | None = doc("Disk size in GB.", None, unit="GB")
    teardown: str = doc(
        'What ends the cluster after the run: "down" (autostop with down: the cluster is '
        'torn down idle_minutes after the run ends, under `sky launch`), "managed" (launch it '
        "with `sky jobs launch`: the jobs controller tears the cluster down when the job "
        'ends; autostop with down stays as a safety net) or "keep" (no teardown: the '
        "cluster bills until `sky down`).",
        "down",
        choices=SKYPILOT_TEARDOWNS,
    )
    idle_minutes: int = doc(
        "Minutes the cluster may sit idle after the run before autostop tears it down.",
        5,
        ge=0,
        le=7 * 24 * 60,  # a week: more is a unit mistake (hours or seconds given as minutes)
        unit="minutes",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


@dataclass(kw_only=True)
class CostSpec:
    """What the machine costs, for the ledger and the budget."""

    SECTION: ClassVar[str] = "cost"

    provider: str | None = doc('Provider in the price catalog, e.g. "lambda".', None, format="name")
    instance: str | None = doc(
        'Instance type in the price catalog, e.g. "gpu_1x_h100_sxm5".', None, format="name"
    )
    price_per_hour: float | None = doc(
        "Price of the machine in USD per hour (overrides the catalog).",
        None,
        ge=0,
        unit="USD per hour",
    )
    billing_increment: Duration | None = doc(
        'Billing increment of a price_per_hour without provider/instance, e.g. "1s" or "1h"; '
        "default: per minute. A catalog instance keeps its provider's rules.",
        None,
        gt=0,
        accepts='a duration above 0, e.g. "1s"',
    )
    mirror_per_gib_month: float | None = doc(
        "Price of the checkpoint mirror's storage in USD per GiB-month, e.g. 0.023 (S3 "
        "Standard); unset: mirrored bytes are counted in GiB-hours at 0 USD.",
        None,
        ge=0,
        unit="USD per GiB-month",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        require(
            self.billing_increment is None
            or (self.price_per_hour is not None and self.provider is None and self.instance is None),
            "cost.billing_increment", self.billing_increment,
            "only with cost.price_per_hour and no provider/instance (a catalog instance bills "
            "by its provider's rules; `acceptrun cost prices` shows them)",
        )  # fmt: skip


@dataclass(kw_only=True)
class AcceptanceSpec:
    """What the run must show to be accepted."""

    SECTION: ClassVar[str] = "acceptance"

    metrics: dict[str, str] = doc(
        'Thresholds on final metrics, e.g. { "eval/accuracy" = ">= 0.9" }.',
        factory=dict,
        format="condition",
    )
    outputs: list[str] = doc(
        'Outputs the run must register, e.g. ["model"].', factory=list, format="name"
    )
    drills: list[str] = doc(
        f"Drills that must pass: {', '.join(KNOWN_DRILLS)}.", factory=list, choices=KNOWN_DRILLS
    )
    throughput: list[float] = doc(
        "Acceptable median throughput [min, max] in throughput_unit, e.g. [900, 1200].",
        factory=list,
        ge=0,
        min_items=2,
        max_items=2,
        empty_ok=True,
        accepts="two numbers [min, max] with min <= max",
    )
    throughput_unit: str = doc(
        f"Unit of the throughput range: {', '.join(THROUGHPUT_UNITS)}.",
        "samples/s",
        choices=THROUGHPUT_UNITS,
    )
    max_data_wait: float | None = doc(
        "Largest share of step time spent waiting for data, 0 to 1.",
        0.25,
        ge=0,
        le=1,
        accepts=_SHARE,
    )
    min_ettr: float | None = doc(
        "Smallest acceptable effective training time ratio (productive step time / wall "
        "time), 0 to 1; none: the checkpoint-interval line is information only.",
        None,
        ge=0,
        le=1,
        accepts=_SHARE,
    )
    max_idle: float | None = doc(
        "Largest share of the attempts' time the GPU (or process) was idle, 0 to 1.",
        0.25,
        ge=0,
        le=1,
        accepts=_SHARE,
    )
    max_first_step: Duration | None = doc(
        'Longest acceptable time from launch to the first step, e.g. "10m".',
        None,
        gt=0,
        accepts="a positive duration",
    )
    max_downtime: Duration | None = doc(
        "Longest acceptable time a serving run is without a ready server after its first "
        'ready, all outages added, e.g. "30s"; none: downtime is information only.',
        None,
        ge=0,
        accepts='a duration, e.g. "30s" ("0s": no outage at all)',
    )
    tolerances: dict[str, float] = doc(
        'Absolute tolerance per metric (and "loss" for the loss curve) when `acceptrun diff` '
        "compares two runs; unnamed ones must match exactly.",
        factory=dict,
        ge=0,
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        if self.throughput:
            rng = self.throughput
            require(
                rng[0] <= rng[1], "acceptance.throughput", rng,
                "two numbers [min, max] with min <= max",
            )  # fmt: skip


def _require_enabled_when_set(section: Any, key_field: str, example: str) -> None:
    """A run kind's section ([inference], [serving]) that sets any field must set the one
    that turns it on (``key_field``): ``[serving] rate = 5`` without a url is refused, not
    quietly ignored."""
    changed = any(getattr(section, f.name) != _default_of(f) for f in dataclasses.fields(section))
    require(
        section.enabled or not changed,
        f"{section.SECTION}.{key_field}", getattr(section, key_field), example,
    )  # fmt: skip


def _default_of(f: dataclasses.Field[Any]) -> Any:
    """A field's default: its factory's value when it has one (a dict, a list)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@dataclass(kw_only=True)
class InferenceSpec:
    """A batch inference run: its input items, its committed outputs and what it must show."""

    SECTION: ClassVar[str] = "inference"

    input: str | None = doc(
        "Input items: a JSONL file (one record a line), a text file (one item a line), a "
        "directory of such files (sorted by name) or an fsspec URL; setting it makes the "
        "run a batch inference run (docs/inference.md).",
        None,
        format="path",
        reach=_READ_ONLY,
    )
    output: str = doc(
        "Directory of the committed output shards (shard-00000.jsonl, ...), relative to the "
        "spec file.",
        "inference-out",
        format="path",
        reach="the batch's output directory: acceptrun writes only its shard files there",
    )
    shard_size: int = doc(
        "Items per shard: the unit of work handed out, committed at once and redone after a kill.",
        100,
        ge=1,
        accepts="1 or more items",
    )
    format: str = doc(
        '"auto" (.jsonl/.json files are JSONL, anything else text lines), "jsonl" or "text".',
        "auto",
        choices=INFERENCE_FORMATS,
    )
    id_field: str | None = doc(
        "JSONL field holding each item's stable, unique id; default: the item's index (0, 1, ...).",
        None,
    )
    min_coverage: float = doc(
        "Share of input items that must have exactly one output or be listed as failed, 0 to 1.",
        1.0,
        ge=0,
        le=1,
        accepts=_SHARE,
    )
    max_error_rate: float | None = doc(
        "Largest share of input items listed as failed, 0 to 1; unset: shown, not checked.",
        None,
        ge=0,
        le=1,
        accepts=_SHARE,
    )
    min_items_per_s: float | None = doc(
        "Lowest acceptable throughput in items per second over the attempts' wall time.",
        None,
        gt=0,
        unit="items/s",
        accepts="a positive number",
    )
    max_usd_per_1k_items: float | None = doc(
        "Highest acceptable cost per 1,000 items with an output, in USD (needs a price in [cost]).",
        None,
        gt=0,
        unit="USD",
        accepts="a positive number",
    )
    max_usd_per_million_tokens: float | None = doc(
        "Highest acceptable cost per million tokens reported by shard.commit(tokens=...), in USD.",
        None,
        gt=0,
        unit="USD",
        accepts="a positive number",
    )

    @property
    def enabled(self) -> bool:
        """True when the spec describes a batch inference run."""
        return self.input is not None

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        _require_enabled_when_set(
            self, "input",
            'the input items of an [inference] section, e.g. input = "data/prompts.jsonl"',
        )  # fmt: skip
        require(
            self.id_field is None or self.format != "text",
            "inference.id_field", self.id_field, 'no id_field with format = "text" (ids are indexes)',
        )  # fmt: skip


@dataclass(kw_only=True)
class ServingSpec:
    """A serving run: the command is a server; acceptrun waits for it, loads it, judges it."""

    SECTION: ClassVar[str] = "serving"

    url: str | None = doc(
        'URL the load is sent to, e.g. "http://127.0.0.1:8000/v1/completions"; setting it '
        "makes the run a serving run whose command is the server (docs/inference.md).",
        None,
        pattern=_HTTP_URL,
        accepts=_HTTP_ACCEPTS,
    )
    method: str = doc(
        'HTTP method of every request: "POST", "GET" or "PUT".',
        "POST",
        choices=SERVING_METHODS,
        any_case=True,
    )
    payload: str | None = doc(
        "JSONL file of request bodies, one JSON value a line, sent in turn (cycled); relative "
        "to the spec file; unset: an empty body.",
        None,
        format="path",
        reach=_READ_ONLY,
    )
    headers: dict[str, str] = doc(
        'Extra request headers, e.g. { Authorization = "Bearer <token>" }.', factory=dict
    )
    ready_url: str | None = doc(
        "Health URL polled until it answers 2xx: the server is then ready, e.g. "
        '"http://127.0.0.1:8000/health".',
        None,
        pattern=_HTTP_URL,
        accepts=_HTTP_ACCEPTS,
    )
    ready_log: str | None = doc(
        "Regular expression searched in the server's stdout and stderr: the server is ready "
        'at the first matching line, e.g. "Uvicorn running on".',
        None,
        format="regex",
    )
    ready_timeout: Duration = doc(
        "Longest wait from launch to ready; past it the readiness check fails.",
        Duration(120.0),
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    rate: float | None = doc(
        "Open loop: requests per second sent on a schedule fixed in advance (Poisson arrivals "
        "as MLPerf's Server scenario), whether or not earlier ones have answered.",
        None,
        gt=0,
        unit="requests/s",
        accepts="a positive rate",
    )
    arrivals: str = doc(
        'Open-loop arrival process: "poisson" (exponential gaps) or "uniform" (even gaps).',
        "poisson",
        choices=SERVING_ARRIVALS,
    )
    concurrency: int | None = doc(
        "Closed loop: this many clients, each sending its next request when the last answered.",
        None,
        ge=1,
        accepts="1 or more clients",
    )
    duration: Duration | None = doc(
        'Send requests for this long (from ready), e.g. "60s".',
        None,
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    requests: int | None = doc(
        "Send this many requests; with duration too, whichever comes first.",
        None,
        ge=1,
        accepts="1 or more requests",
    )
    stream: bool = doc(
        "Responses are server-sent events (OpenAI-style stream = true): time to first token "
        "and inter-token latency are measured, one token per data event.",
        False,
    )
    request_timeout: Duration = doc(
        "A request with no complete answer after this long is an error.",
        Duration(30.0),
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    seed: int = doc("Seed of the arrival schedule (the same seed, the same schedule).", 0)
    slo_latency: Duration | None = doc(
        'Per-request SLO on end-to-end latency, for goodput, e.g. "500ms".',
        None,
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    slo_ttft: Duration | None = doc(
        "Per-request SLO on time to first token, for goodput.",
        None,
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    slo_itl: Duration | None = doc(
        "Per-request SLO on the mean time per output token after the first, for goodput.",
        None,
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    max_latency_p50: Duration | None = doc(
        "Highest acceptable median latency.", None, gt=0, accepts=_POSITIVE_DURATION
    )
    max_latency_p90: Duration | None = doc(
        "Highest acceptable 90th percentile latency.", None, gt=0, accepts=_POSITIVE_DURATION
    )
    max_latency_p99: Duration | None = doc(
        "Highest acceptable 99th percentile latency.", None, gt=0, accepts=_POSITIVE_DURATION
    )
    max_ttft_p99: Duration | None = doc(
        "Highest acceptable 99th percentile time to first token (stream = true).",
        None,
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    max_error_rate: float | None = doc(
        "Largest share of requests that failed (status >= 400, broken or timed out), 0 to 1.",
        None,
        ge=0,
        le=1,
        accepts=_SHARE,
    )
    min_goodput: float | None = doc(
        "Lowest acceptable goodput: successful requests per second that met every slo_*.",
        None,
        gt=0,
        unit="requests/s",
        accepts="a positive number",
    )
    min_requests_per_s: float | None = doc(
        "Lowest acceptable rate of completed requests per second over the load.",
        None,
        gt=0,
        unit="requests/s",
        accepts="a positive number",
    )
    max_cold_start: Duration | None = doc(
        "Longest acceptable time from launch to the first successful response.",
        None,
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    max_usd_per_1k_requests: float | None = doc(
        "Highest acceptable cost per 1,000 successful requests, in USD (needs a price in [cost]).",
        None,
        gt=0,
        unit="USD",
        accepts="a positive number",
    )

    @property
    def enabled(self) -> bool:
        """True when the spec describes a serving run."""
        return self.url is not None

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        _require_enabled_when_set(
            self, "url",
            'the URL the load goes to, e.g. url = "http://127.0.0.1:8000/v1/completions"',
        )  # fmt: skip
        if not self.enabled:
            return
        require(
            self.ready_url is not None or self.ready_log is not None,
            "serving.ready_url", self.ready_url,
            'a health URL (ready_url = "http://127.0.0.1:8000/health") or a log pattern '
            '(ready_log = "Uvicorn running on") that says when the server is ready',
        )  # fmt: skip
        require(
            (self.rate is None) != (self.concurrency is None),
            "serving.rate", self.rate,
            "exactly one of rate (open loop, requests/s) and concurrency (closed loop, clients)",
        )  # fmt: skip
        require(
            self.duration is not None or self.requests is not None,
            "serving.duration", self.duration,
            'a length of load (duration = "60s") or a count (requests = 1000), or both',
        )  # fmt: skip
        require(
            self.stream or (self.slo_ttft is None and self.slo_itl is None and self.max_ttft_p99 is None),
            "serving.stream", self.stream,
            "stream = true for slo_ttft, slo_itl or max_ttft_p99 (tokens come from a stream)",
        )  # fmt: skip


@dataclass(kw_only=True)
class CleanupSpec:
    """What to clean up when the run ends."""

    SECTION: ClassVar[str] = "cleanup"

    commands: list[str] = doc(
        "Shell commands run in the workdir after the last attempt.", factory=list, format="arg"
    )
    remove: list[str] = doc(
        "Paths or globs inside the workdir, relative to it, removed after the run; never the "
        "workspace, a run record, a checkpoint store or the data, and a symlink is removed "
        "as a link (what it points to stays).",
        factory=list,
        format="workdir-glob",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


# What [notify] can tell, by the name a user writes in its events lists (notify/conditions.py
# maps each to the events.jsonl kinds that record it).
NOTIFY_EVENTS = (
    "rejected", "accepted", "attempt_failed", "hang", "divergence", "idle_stop", "budget",
    "mirror_behind", "checkpoint_quarantined", "supervisor_gone",
)  # fmt: skip
_NOTIFY_EVENTS_TEXT = ", ".join(NOTIFY_EVENTS)
_ENV_VAR = r"^[A-Za-z_][A-Za-z0-9_]*$"
_EMAIL = r"^[^@\s<>]+@[^@\s<>]+$"
_EVENTS_FOR = "Events sent {to}; empty: those of notify.events."


@dataclass(kw_only=True)
class NotifySpec:
    """Who is told when a run needs someone: webhooks, Slack, e-mail, a local command."""

    SECTION: ClassVar[str] = "notify"

    webhook: str | None = doc(
        "Generic JSON webhook: each message is POSTed as JSON (its text field also suits "
        'Slack-compatible receivers), e.g. "https://hooks.example.com/T0/B0/xyz". A secret: '
        "never shown or recorded.",
        None,
        pattern=_HTTP_URL,
        accepts=_HTTP_ACCEPTS,
        secret=True,
    )
    webhook_events: list[str] = doc(
        _EVENTS_FOR.format(to="to notify.webhook"), factory=list, choices=NOTIFY_EVENTS
    )
    slack: str | None = doc(
        'Slack (or Mattermost) incoming webhook: messages are {"text": ...}, e.g. '
        '"https://hooks.slack.com/services/<team>/<channel>/<secret>". A secret: never shown or recorded.',
        None,
        pattern=_HTTP_URL,
        accepts=_HTTP_ACCEPTS,
        secret=True,
    )
    slack_events: list[str] = doc(
        _EVENTS_FOR.format(to="to notify.slack"), factory=list, choices=NOTIFY_EVENTS
    )
    email_to: list[str] = doc(
        'E-mail recipients, e.g. ["oncall@example.com"]; needs smtp_host and email_from.',
        factory=list,
        pattern=_EMAIL,
        accepts='an e-mail address such as "oncall@example.com"',
    )
    email_from: str | None = doc(
        'Sender of the e-mails, e.g. "acceptrun@example.com".',
        None,
        pattern=_EMAIL,
        accepts='an e-mail address such as "acceptrun@example.com"',
    )
    smtp_host: str | None = doc(
        'SMTP server for e-mail, e.g. "smtp.example.com".', None, format="line"
    )
    smtp_port: int = doc(
        "SMTP port: 587 (submission with STARTTLS) by default.", 587, ge=1, le=65535,
        accepts="a TCP port from 1 to 65535",
    )  # fmt: skip
    smtp_starttls: bool = doc(
        "Upgrade the SMTP connection with STARTTLS before logging in (refused if the server "
        "cannot); false only for a relay on a trusted network.",
        True,
    )
    smtp_user_env: str | None = doc(
        "Name of the environment variable that holds the SMTP user name (never the value "
        'itself), e.g. "SMTP_USER"; unset: no login.',
        None,
        pattern=_ENV_VAR,
        accepts='an environment variable name such as "SMTP_USER"',
    )
    smtp_password_env: str | None = doc(
        "Name of the environment variable that holds the SMTP password (never the value "
        'itself), e.g. "SMTP_PASSWORD".',
        None,
        pattern=_ENV_VAR,
        accepts='an environment variable name such as "SMTP_PASSWORD"',
        secret_env=True,
    )
    email_events: list[str] = doc(
        _EVENTS_FOR.format(to="by e-mail"), factory=list, choices=NOTIFY_EVENTS
    )
    command: list[str] = doc(
        "A local command (argv list, no shell) run once per message: the message as JSON "
        'on stdin, its fields in ACCEPTRUN_NOTIFY_* variables, e.g. ["notify-send", "acceptrun"].',
        factory=list,
        format="arg",
    )
    command_events: list[str] = doc(
        _EVENTS_FOR.format(to="to notify.command"), factory=list, choices=NOTIFY_EVENTS
    )
    events: list[str] = doc(
        f"Events every target is sent unless it names its own: {_NOTIFY_EVENTS_TEXT}.",
        factory=lambda: list(NOTIFY_EVENTS),
        choices=NOTIFY_EVENTS,
    )
    budget_fractions: list[float] = doc(
        "Shares of limits.budget_usd whose crossing is recorded (budget_warning) and sent "
        "as a budget event, e.g. [0.5, 0.8].",
        factory=lambda: [0.8],
        gt=0,
        lt=1,
        accepts="shares between 0 and 1, e.g. [0.5, 0.8]",
    )
    retries: int = doc(
        "Tries per message and target before the delivery is recorded as failed.", 5, ge=1,
        accepts="1 or more tries",
    )  # fmt: skip
    retry_backoff: Duration = doc(
        "Wait after the first failed try; doubles after each (at most 5 min).",
        Duration(2.0),
        gt=0,
        accepts=_POSITIVE_DURATION,
    )
    timeout: Duration = doc(
        "Longest wait for one try (connect and answer).", Duration(10.0), gt=0,
        accepts=_POSITIVE_DURATION,
    )  # fmt: skip
    close_wait: Duration = doc(
        "At the close, wait at most this long for messages still being delivered; what is "
        "left is recorded as not delivered.",
        Duration(30.0),
        ge=0,
        accepts="0 or more seconds",
    )

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)
        email = bool(self.email_to)
        require(
            not email or (self.smtp_host is not None and self.email_from is not None),
            "notify.email_to", self.email_to,
            'email_to with smtp_host and email_from, e.g. smtp_host = "smtp.example.com"',
        )  # fmt: skip
        require(
            email or self.smtp_host is None,
            "notify.smtp_host", self.smtp_host, 'smtp_host with email_to = ["you@example.com"]',
        )  # fmt: skip
        require(
            self.smtp_password_env is None or self.smtp_user_env is not None,
            "notify.smtp_password_env", self.smtp_password_env,
            'smtp_password_env with smtp_user_env (the login\'s user name), e.g. "SMTP_USER"',
        )  # fmt: skip

    @property
    def enabled(self) -> bool:
        """True when at least one target is set."""
        return bool(self.webhook or self.slack or self.email_to or self.command)


def _command_from_string(value: str, path: str) -> list[str]:
    """``command = "python train.py && echo done"`` runs through /bin/sh."""
    require(bool(value.strip()), path, value, 'a command such as "python train.py"')
    try:
        shlex.split(value)
    except ValueError as exc:
        raise Problem(path, value, f"a command with balanced quotes ({exc})") from None
    return ["/bin/sh", "-c", value]


@dataclass(kw_only=True)
class RunSpec:
    """A run spec: the job and everything fixed about it before launch."""

    SECTION: ClassVar[str] = ""

    name: str = doc(
        "Name of the job; part of each run id.",
        pattern=r"\S",
        format="name",
        accepts='a non-empty name such as "bert-squad"',
    )
    command: list[str] = doc(
        'The job: a list (run as is) or a string (run by /bin/sh -c), e.g. ["python", "train.py"].',
        from_string=_command_from_string,
        example='["python", "train.py"]',
        min_items=1,
        accepts='a command such as ["python", "train.py"]',
        format="arg",
    )
    workdir: str = doc(
        "Working directory of the job, relative to the spec file.",
        ".",
        format="path",
        reach="it is the root that every workdir-relative field is confined to",
    )
    env: dict[str, str] = doc(
        "Extra environment variables for the job.", factory=dict, format="arg"
    )
    python_unbuffered: bool = doc(
        "Give the job PYTHONUNBUFFERED=1 unless env sets it: a Python script's prints reach "
        "acceptrun as printed, not in 8 KiB blocks that date its steps late.",
        True,
    )
    description: str | None = doc("A sentence on what this run is for.", None, format="name")
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
        format="workdir-glob",
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
    notify: NotifySpec = doc(
        "Notifications: webhooks, Slack, e-mail, a command (docs/notify.md).",
        factory=NotifySpec,
    )

    # Set by load_spec, not by the user: where the spec came from.
    source: str = field(default="<memory>", metadata={"internal": True}, compare=False)
    base_dir: str = field(default=".", metadata={"internal": True}, compare=False)

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)  # the name's control characters: format "name"
        for env_name in self.env:
            # execve and os.environ refuse these: caught here, not as a crash at launch
            # that leaves the run "interrupted".
            require(
                bool(env_name) and "=" not in env_name and _ENV_NAME_BAD.search(env_name) is None,
                f"env.{key(env_name) if _ENV_NAME_BAD.search(env_name) is None else repr(env_name)}",
                env_name,
                'an environment variable name: not empty, without "=", NUL or other '
                'control characters, e.g. HF_HOME',
            )  # fmt: skip
        require(
            bool(self.command[0]),
            "command",
            self.command,
            'a command such as ["python", "train.py"]',
        )
        require(
            self.checkpoint.memory_every is None
            or (self.resources.processes == 1 and self.resources.nodes == 1),
            "checkpoint.memory_every", self.checkpoint.memory_every,
            "a run of one process for the memory tier (resources.processes = 1 and "
            "resources.nodes = 1): leave memory_every out of a multi-process run",
        )  # fmt: skip
        require(
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

    def to_dict(self, *, secrets: bool = True) -> dict[str, Any]:
        """The resolved spec as plain data (durations in seconds), ready for TOML.

        ``secrets=False`` leaves out the fields declared secret (a webhook URL): what a run
        record keeps (notify/secrets.py keeps their values apart, mode 0600).
        """
        plain: dict[str, Any] = to_plain(self)
        if not secrets:
            for section, name in SECRET_FIELDS:
                plain.get(section, {}).pop(name, None)
        return plain

    def secret_values(self) -> dict[str, str]:
        """The values of the fields declared secret that are set, by "section.name"."""
        out: dict[str, str] = {}
        for section, name in SECRET_FIELDS:
            value = getattr(getattr(self, section), name)
            if isinstance(value, str) and value:
                out[f"{section}.{name}"] = value
        return out

    def to_toml(self, *, secrets: bool = True) -> str:
        """The frozen, resolved spec: loadable again by :func:`load_spec`.

        ``secrets=False``: without the fields declared secret (the run record's copy).
        """
        data = self.to_dict(secrets=secrets)
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
        # Without the secret fields: a frozen copy (which leaves them out) hashes the same.
        return hash_bytes(tomli_w.dumps(self.to_dict(secrets=False)).encode())


def _secret_fields(kind: str = "secret") -> tuple[tuple[str, str], ...]:
    """(section, field) of every field declared ``secret=True`` (or, with ``kind``
    "secret_env", ``secret_env=True``): read off the declaration."""
    out = []
    for section in dataclasses.fields(RunSpec):
        cls = section.type if isinstance(section.type, type) else globals().get(str(section.type))
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        for f in dataclasses.fields(cls):
            rules = f.metadata.get("rules")
            if isinstance(rules, Rules) and getattr(rules, kind):
                out.append((section.name, f.name))
    return tuple(out)


# The fields declared secret; the redactor learns their values whenever a spec is parsed.
SECRET_FIELDS: tuple[tuple[str, str], ...] = _secret_fields()
declare_secret_fields(SECRET_FIELDS)
# The fields that name a variable holding a secret; the redactor learns that variable's value.
SECRET_ENV_FIELDS: tuple[tuple[str, str], ...] = _secret_fields("secret_env")
declare_secret_env_fields(SECRET_ENV_FIELDS)
