"""Framework aggregates that do not survive a resume: declared once, marked, refused.

A framework reports some figures at the end of ``train()`` that it computes over the
attempt that ran, not over the run. The Hugging Face Trainer's ``train_loss`` is the sum
of the losses of the steps *this attempt* ran divided by the global step count: an
attempt resumed after step 100 of 300 divides 200 steps' losses by 300, so a resumed run
whose weights are bitwise those of an uninterrupted one reports a smaller loss (2.89
against 4.63). Its ``train_runtime`` is the attempt's time, and its throughputs divide
the whole run's samples and steps by that time. An acceptance threshold on one of them
would judge identical models differently depending on whether a kill happened.

:data:`PER_ATTEMPT` declares them, per framework (the integration's module name under
``acceptrun.integrations``). Every path goes through it:

* the integration records such a metric with :func:`marks` (``per_attempt``: why,
  ``instead``: what to use), so the record, ``acceptrun show`` and the verdict say it is
  a figure of one attempt;
* :func:`refusal` is the one text of the refusal: ``acceptrun spec check`` and
  ``acceptrun run`` refuse an ``acceptance.metrics`` entry naming one when the script
  imports that integration (workload/usage.py), and the verdict's metric check fails a
  marked metric with the same reason (a script the static check could not read).

>>> refusal("transformers", "eval_loss") is None     # evaluated on the restored weights
True
>>> marks("transformers", "train_runtime")["per_attempt"]
"the Hugging Face Trainer's seconds of this attempt's train() call"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PER_ATTEMPT", "PerAttempt", "marks", "refusal"]


@dataclass(frozen=True, slots=True)
class PerAttempt:
    """One framework figure computed over the attempt that ran, not over the run."""

    what: str  # what the framework computes, in words
    instead: str  # the figure to judge the run by


_TRAINER = "the Hugging Face Trainer's"
_TRAINER_INSTEAD = (
    "judge the model by an evaluation metric (eval_loss: the Trainer evaluates the "
    "restored weights, the same in every attempt) or by the verdict's loss curve"
)

PER_ATTEMPT: dict[str, dict[str, PerAttempt]] = {
    "transformers": {
        "train_loss": PerAttempt(
            f"{_TRAINER} sum of the losses of the steps this attempt ran divided by the "
            "global step count (a resumed attempt divides fewer steps' losses by all of them)",
            _TRAINER_INSTEAD,
        ),
        "train_runtime": PerAttempt(
            f"{_TRAINER} seconds of this attempt's train() call",
            "read the run's wall time and its time breakdown in the verdict",
        ),
        "train_samples_per_second": PerAttempt(
            f"{_TRAINER} samples of the whole run divided by this attempt's seconds",
            "set acceptance.throughput (the median of the step events, every attempt)",
        ),
        "train_steps_per_second": PerAttempt(
            f"{_TRAINER} steps of the whole run divided by this attempt's seconds",
            "set acceptance.throughput (the median of the step events, every attempt)",
        ),
    },
}


def marks(framework: str, name: str) -> dict[str, Any]:
    """The fields a ``metric`` event of ``name`` carries: ``per_attempt`` and ``instead``, or none."""
    declared = PER_ATTEMPT.get(framework, {}).get(name)
    if declared is None:
        return {}
    return {"per_attempt": declared.what, "instead": declared.instead}


def refusal(framework: str, name: str) -> tuple[str, str] | None:
    """(why ``name`` is refused as an acceptance metric, the fix), or None when it is not."""
    declared = PER_ATTEMPT.get(framework, {}).get(name)
    if declared is None:
        return None
    return (
        f"{name} is {declared.what}: a figure of one attempt, which differs between a "
        "resumed run and an uninterrupted one with the same weights",
        f"remove it from [acceptance.metrics] and {declared.instead}",
    )
