"""The workload contract: what the supervisor and the training process agree on.

Both sides import this module and nothing else of each other: the supervisor sets the
environment variables below for every attempt and reads the events and exit statuses;
the workload (:mod:`acceptrun.workload.run`) reads the variables and writes the events.
It imports nothing, so the supervisor, the launcher and the lifecycle commands can use
it without loading the client.

>>> ENV_RUN_DIR
'ACCEPTRUN_RUN_DIR'
>>> ENV_VARS[ENV_RESUME_FROM]
'checkpoint directory to resume from; empty on a fresh start'
>>> EXIT_STOPPED, EXIT_DIVERGED
(143, 3)
>>> divergence(120, float("nan"), None)
'loss nan at step 120 is not finite'
"""

from __future__ import annotations

import math

__all__ = [
    "CONTROL_FILE",
    "DRILL_SCRATCH_PREFIX",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_DRILL",
    "ENV_HEARTBEAT_S",
    "ENV_INJECT",
    "ENV_INJECT_RANK",
    "ENV_MAX_STEPS",
    "ENV_RESUME_FROM",
    "ENV_RUN_DIR",
    "ENV_RUN_ID",
    "ENV_SPEC",
    "ENV_VARS",
    "EVENT_KINDS",
    "EXIT_DIVERGED",
    "EXIT_STOPPED",
    "HEARTBEAT_S",
    "STACKS_FILE",
    "divergence",
]

# ---- environment variables the supervisor sets for every attempt ---------------------------
ENV_RUN_DIR = "ACCEPTRUN_RUN_DIR"
ENV_RUN_ID = "ACCEPTRUN_RUN_ID"
ENV_ATTEMPT = "ACCEPTRUN_ATTEMPT"
ENV_RESUME_FROM = "ACCEPTRUN_RESUME_FROM"
ENV_CHECKPOINT_DIR = "ACCEPTRUN_CHECKPOINT_DIR"
ENV_SPEC = "ACCEPTRUN_SPEC"
ENV_DRILL = "ACCEPTRUN_DRILL"
ENV_INJECT = "ACCEPTRUN_INJECT"
ENV_HEARTBEAT_S = "ACCEPTRUN_HEARTBEAT_S"
ENV_MAX_STEPS = "ACCEPTRUN_MAX_STEPS"
ENV_INJECT_RANK = "ACCEPTRUN_INJECT_RANK"

HEARTBEAT_S = 10.0  # seconds between heartbeats: what hang and data-stall detection read

ENV_VARS = {
    ENV_RUN_DIR: "absolute path of the run record directory",
    ENV_RUN_ID: "the run id",
    ENV_ATTEMPT: "attempt number, 1 for the first launch",
    ENV_RESUME_FROM: "checkpoint directory to resume from; empty on a fresh start",
    ENV_CHECKPOINT_DIR: "directory where the workload's checkpoints go",
    ENV_SPEC: "path of the frozen spec (spec.toml in the run record)",
    ENV_DRILL: "set by `acceptrun ckpt drill`: restore, run one step, record the result, exit",
    ENV_INJECT: "faults to inject for drills, e.g. kill@step=40 (acceptrun run --inject)",
    ENV_HEARTBEAT_S: f"seconds between heartbeat events (default {HEARTBEAT_S:g})",
    ENV_MAX_STEPS: "run.steps() yields at most this many steps (set by `acceptrun bench scaling`)",
    ENV_INJECT_RANK: "the rank that fires injected step faults in a multi-process run (default 0)",
}

# ---- exit statuses the workload ends with -----------------------------------------------------
EXIT_STOPPED = 143  # a graceful stop (checkpointed, "stopped" event): what SIGTERM's death gives
EXIT_DIVERGED = 3  # exit status after a "diverged" event (the event, not the code, decides)


def divergence(step: int, loss: float, max_loss: float | None) -> str | None:
    """Why a loss means the run diverged (the "diverged" event's reason), or None.

    The one rule, for the client's loop and the supervisor's reading of a script's log: a
    loss that is NaN or infinite, or above ``limits.max_loss`` when one is set.
    """
    if math.isfinite(loss) and (max_loss is None or loss <= max_loss):
        return None
    if not math.isfinite(loss):
        return f"loss {loss} at step {step} is not finite"
    return f"loss {loss} at step {step}, above limits.max_loss = {max_loss:g}"


# ---- files in the run record ------------------------------------------------------------------
# `acceptrun stop|kill RUN` (and the Slurm backend) write this, then signal the supervisor:
# {"action": "stop" | "kill", "by": "user@host", ...}. The supervisor removes it at start.
CONTROL_FILE = "control.json"
# attempts/<n>/stacks.txt: the workload's faulthandler writes every thread's stack there on
# SIGUSR2, which the supervisor sends before killing a hung attempt (rank r > 0: stacks-rank<r>.txt).
STACKS_FILE = "stacks.txt"
# <run>/.drill-checkpoints-<launch>/: where a restore drill's sharded saves commit (the
# workload's scratch store, so that a drill never changes the run's checkpoints); the drill
# removes those it made once the workload has exited.
DRILL_SCRATCH_PREFIX = ".drill-checkpoints-"

# ---- events the workload appends to events.jsonl ----------------------------------------------
EVENT_KINDS = {
    "workload_start": "init() attached: pid, resume_from (rank 0)",
    "step": "a step ended: step, step_time, data_wait, total_steps, the logged values",
    "heartbeat": "every ACCEPTRUN_HEARTBEAT_S seconds: phase, step, phase_s (rank 0)",
    "stop_requested": "SIGTERM reached the loop: signal",
    "stopped": "a graceful stop at a step boundary: step, checkpoint (then exit 143)",
    "diverged": "a NaN/inf loss or one above limits.max_loss: step, loss, reason (then exit 3)",
    "restored": "a checkpoint was loaded: step, path, seconds",
    "metric": "a final or evaluation metric: name, value",
    "output": "a registered output file: name, path, hash, size",
    "drill": "the result of a restore drill: drill, ok, step, evidence",
    "workload_end": "the process is ending: status",
}
