"""How often to checkpoint: the optimum interval, the goodput it buys, and a simulator.

The model (docs/checkpoint-interval.md) has four inputs, each in seconds:

- ``save`` (δ): what one checkpoint blocks the training loop for (the stall);
- ``mtbf`` (M): the mean time between interruptions of the whole job (one GPU's mean
  time to failure divided by the GPUs, for independent failures);
- ``restart`` (R): from the interruption to the restarted job's first step: detection,
  restart, restore, first step;
- ``work`` (W): the failure-free compute the run needs.

With interruptions a Poisson process of rate 1/M, a run that checkpoints every ``τ``
seconds of compute is expected to take (Daly 2006, eq. 13, the restart counted in R)::

    T(τ) = M · e^(R/M) · (e^((τ+δ)/M) − 1) · W/τ

Its minimum has no closed form; Young (1974) gives the first-order optimum √(2δM),
Daly (2006) the higher-order estimate used here::

    τ* = √(2δM) · (1 + ⅓·√(δ/2M) + ⅑·(δ/2M)) − δ     (δ < 2M; else τ* = M)

ETTR (effective training time ratio) is W / T. :func:`simulate` runs the same process
event by event, and goes where the closed form does not: an asynchronous persist window
during which an interruption loses the checkpoint in flight, Weibull interruptions.

A memory tier beside the durable store (:func:`tiered_forecast`, over :class:`Tiers`) adds
two inputs: its own stall ``memory_save`` (δm) and ``survives`` (p), the share of
interruptions after which its copy is still reachable. Saves go to memory every τm of
compute and to the durable store every τ = k·τm (one host copy serves both at a durable
point); an interruption costs R and the compute since the last memory save with
probability p, else since the last durable one. To first order in the interruption rate::

    T = W · (1 + δm/τm · (k−1)/k + δ/τ) / (1 − (R + p·(τm+δm)/2 + (1−p)·(τ+δ)/2) / M)

which is Daly's to first order when p = 0. :func:`simulate_tiers` runs it event by event.

Sources: J. W. Young, "A first order approximation to the optimum checkpoint interval",
Comm. ACM 17(9), 1974; J. T. Daly, "A higher order estimate of the optimum
checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), 2006.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FLEET",
    "Fleet",
    "Forecast",
    "Tiers",
    "daly_interval",
    "ettr",
    "expected_wall",
    "forecast",
    "simulate",
    "simulate_tiers",
    "tiered_forecast",
    "young_interval",
]


@dataclass(frozen=True, slots=True)
class Fleet:
    """A published interruption rate: per-GPU mean time between interruptions, its source."""

    name: str
    gpu_mtbf_s: float  # seconds of one GPU's time per interruption of a job it is in
    source: str


# The Llama 3 405B pre-training: 419 unexpected interruptions in a 54-day snapshot on
# 16,384 H100 GPUs, one every 3.1 hours for the job, 16,384 x 54 x 24 / 419 = 50,674 GPU
# hours (5.8 years) per interruption for one GPU.
FLEET = Fleet(
    name="Llama 3 405B pre-training (16,384 H100)",
    gpu_mtbf_s=54 * 86400 * 16384 / 419,
    source=(
        "The Llama 3 Herd of Models (Meta, 2024), section 3.3.4: 419 unexpected "
        "interruptions in 54 days on 16,384 H100 GPUs"
    ),
)


def young_interval(save: float, mtbf: float) -> float:
    """Young's first-order optimum: √(2·δ·M) seconds of compute between checkpoints."""
    _positive(save=save, mtbf=mtbf)
    return math.sqrt(2.0 * save * mtbf)


def daly_interval(save: float, mtbf: float) -> float:
    """Daly's higher-order optimum (seconds of compute between checkpoints).

    Approaches Young's when δ is small against M; stays right when it is not; M itself
    when δ ≥ 2M (a checkpoint that costs more than two interruptions' worth is taken once
    per mean time between them).
    """
    _positive(save=save, mtbf=mtbf)
    if save >= 2.0 * mtbf:
        return mtbf
    x = save / (2.0 * mtbf)
    return math.sqrt(2.0 * save * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save


def expected_wall(interval: float, save: float, mtbf: float, restart: float, work: float) -> float:
    """Expected wall seconds of ``work`` seconds of compute, checkpointing every ``interval``."""
    _positive(interval=interval, mtbf=mtbf, work=work)
    if save < 0 or restart < 0:
        raise ValueError(f"save and restart must be >= 0, got {save!r} and {restart!r}")
    segments = work / interval
    return mtbf * math.exp(restart / mtbf) * math.expm1((interval + save) / mtbf) * segments


def ettr(interval: float, save: float, mtbf: float, restart: float) -> float:
    """Effective training time ratio at ``interval``: work / expected wall time."""
    return 1.0 / (mtbf * math.exp(restart / mtbf) * math.expm1((interval + save) / mtbf) / interval)


@dataclass(frozen=True, slots=True)
class Forecast:
    """The model's answer for one interval."""

    interval_s: float
    ettr: float
    wall_s: float
    expected_interruptions: float
    cost_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": round(self.interval_s, 3),
            "ettr": round(self.ettr, 6),
            "wall_s": round(self.wall_s, 3),
            "expected_interruptions": round(self.expected_interruptions, 3),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
        }


def forecast(
    interval: float,
    *,
    save: float,
    mtbf: float,
    restart: float,
    work: float,
    usd_per_hour: float | None = None,
    fixed: float = 0.0,
) -> Forecast:
    """Wall time, ETTR, interruptions and cost of a run at ``interval``.

    ``usd_per_hour``: what the whole job costs per wall hour (all its GPUs), or None.
    ``fixed``: seconds outside the model that every run pays once (the first start-up,
    the close), added to the wall time.
    """
    wall = expected_wall(interval, save, mtbf, restart, work) + max(0.0, fixed)
    cost = None if usd_per_hour is None else usd_per_hour * wall / 3600.0
    return Forecast(interval, work / wall, wall, wall / mtbf, cost)


def simulate(
    interval: float,
    *,
    save: float,
    mtbf: float,
    restart: float,
    work: float,
    runs: int = 400,
    persist: float = 0.0,
    weibull_shape: float | None = None,
    seed: int = 0,
    deadline: float | None = None,
) -> dict[str, float]:
    """Simulate ``runs`` runs event by event; their mean ETTR, wall time and interruptions.

    Each run computes ``interval`` seconds, blocks ``save`` seconds to checkpoint, and
    goes on; a checkpoint is durable ``persist`` seconds after its blocking part ends (an
    asynchronous upload: 0 for a synchronous save), so an interruption in that window
    loses it and the restore comes from the one before. An interruption loses the
    compute since the last durable checkpoint and costs ``restart`` seconds. The times
    between interruptions are exponential with mean ``mtbf`` or, with ``weibull_shape``
    k, Weibull with that mean (k < 1: failures come in bursts).

    ``deadline``: a ``time.monotonic()`` past which it raises :class:`TimeoutError`
    (a run whose ETTR is near 0 takes millions of rounds to finish).
    """
    import numpy as np

    _positive(interval=interval, mtbf=mtbf, work=work)
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs!r}")
    rng = np.random.default_rng(seed)
    period = interval + save
    persist = min(max(persist, 0.0), period)

    def gaps(n: int) -> Any:
        if deadline is not None and time.monotonic() > deadline:  # once per round
            raise TimeoutError(f"the simulation of {runs} runs passed its deadline")
        if weibull_shape is None:
            return rng.exponential(mtbf, n)
        scale = mtbf / math.gamma(1.0 + 1.0 / weibull_shape)
        return scale * rng.weibull(weibull_shape, n)

    done = np.zeros(runs)  # durable compute, seconds
    wall = np.zeros(runs)
    hits = np.zeros(runs)
    active = np.arange(runs)
    while active.size:
        # The restart (or the first start, free): an interruption can come during it too.
        restarting = active[hits[active] > 0]
        while restarting.size:
            g = gaps(restarting.size)
            again = g < restart
            wall[restarting[again]] += g[again]
            hits[restarting[again]] += 1
            wall[restarting[~again]] += restart
            restarting = restarting[again]
        left = work - done[active]
        # Seconds to finish from here: the compute left and a save after each interval of
        # it, the last one included (Daly's model: W/τ segments of τ + δ).
        finish = left + np.ceil(left / interval - 1e-12) * save
        fail = gaps(active.size)
        ends = fail >= finish
        wall[active[ends]] += finish[ends]
        done[active[ends]] = work
        cut = active[~ends]
        f = fail[~ends]
        # Checkpoints whose blocking part ended and whose persist window closed by f.
        durable = np.floor(np.maximum(f - persist, 0.0) / period)
        done[cut] += durable * interval
        wall[cut] += f
        hits[cut] += 1
        active = cut
    ratio = work / wall
    return {
        "ettr": float(ratio.mean()),
        "wall_s": float(wall.mean()),
        "interruptions": float(hits.mean()),
        "runs": float(runs),
    }


@dataclass(frozen=True, slots=True)
class TieredForecast:
    """The model's answer with a memory tier: both intervals, ETTR, where the wall time goes."""

    memory_interval_s: float
    interval_s: float
    ettr: float
    wall_s: float
    expected_interruptions: float
    cost_usd: float | None
    shares: dict[str, float]  # of the wall time: work, saves to disk and memory, restarts, lost

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_interval_s": round(self.memory_interval_s, 3),
            "interval_s": round(self.interval_s, 3),
            "ettr": round(self.ettr, 6),
            "wall_s": round(self.wall_s, 3),
            "expected_interruptions": round(self.expected_interruptions, 3),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
            "shares": {k: round(v, 6) for k, v in self.shares.items()},
        }


@dataclass(frozen=True, slots=True)
class Tiers:
    """A run with a memory tier beside its durable saves, the intervals aside (seconds)."""

    save: float
    """What a durable save blocks the run for (δ)."""
    memory_save: float
    """What a save to memory blocks the run for (δm)."""
    survives: float
    """The share of interruptions after which the memory copy is still reachable (p)."""
    mtbf: float
    """Mean time between interruptions (M)."""
    restart: float
    """What an interruption costs before the run computes again (R)."""
    work: float
    """The compute the run needs (W)."""

    def __post_init__(self) -> None:
        _positive(mtbf=self.mtbf, work=self.work)
        if not (0.0 <= self.survives <= 1.0):
            raise ValueError(f"survives must be a share from 0 to 1, got {self.survives!r}")
        if self.memory_save < 0 or self.save < 0 or self.restart < 0:
            raise ValueError("save, memory_save and restart must be >= 0")


def tiered_forecast(
    interval: float,
    tiers: Tiers,
    *,
    memory_interval: float | None = None,
    usd_per_hour: float | None = None,
) -> TieredForecast:
    """The run with a memory tier beside durable saves every ``interval`` seconds of compute.

    ``memory_interval`` None: the one that minimises the wall time, searched over the
    divisors ``interval / k``; given, the durable interval is rounded to a multiple of it.
    Raises OverflowError when an interruption costs more than the time between them.
    """
    _positive(interval=interval)
    save, memory_save, survives = tiers.save, tiers.memory_save, tiers.survives
    mtbf, restart, work = tiers.mtbf, tiers.restart, tiers.work

    def terms(k: int) -> tuple[float, dict[str, float]]:
        tm = interval / k
        saves_m = memory_save / tm * (k - 1) / k
        lost = survives * (tm + memory_save) / 2.0 + (1.0 - survives) * (interval + save) / 2.0
        free = 1.0 - (restart + lost) / mtbf
        if free <= 0.0:
            raise OverflowError("an interruption costs more than the time between them")
        wall = work * (1.0 + saves_m + save / interval) / free
        hits = wall / mtbf
        return wall, {
            "work": work / wall,
            "disk_saves": work * save / interval / wall,
            "memory_saves": work * saves_m / wall,
            "restarts": hits * restart / wall,
            "lost_work": hits * lost / wall,
        }

    if memory_interval is not None:
        _positive(memory_interval=memory_interval)
        ks = [max(1, round(interval / memory_interval))]
    else:  # k = 1 (no memory saves but the durable ones) to one memory save a second
        top = max(1, min(int(interval), 1_000_000))
        ks = sorted({max(1, round(top ** (i / 400))) for i in range(401)})
    best = min(ks, key=lambda k: terms(k)[0])
    wall, shares = terms(best)
    cost = None if usd_per_hour is None else usd_per_hour * wall / 3600.0
    return TieredForecast(interval / best, interval, work / wall, wall, wall / mtbf, cost, shares)


def simulate_tiers(
    memory_interval: float,
    interval: float,
    tiers: Tiers,
    *,
    runs: int = 200,
    seed: int = 0,
    deadline: float | None = None,
) -> dict[str, float]:
    """:func:`tiered_forecast`'s process event by event, ``runs`` times: mean ETTR and more.

    Saves fall at every multiple of ``memory_interval`` of compute, durable ones at every
    multiple of ``interval`` (rounded to a multiple of it); an interruption goes back to
    the newest memory save with probability ``survives``, else to the newest durable one,
    and costs ``restart`` (during which another interruption can come).
    """
    import random

    _positive(interval=interval, memory_interval=memory_interval)
    save, memory_save, survives = tiers.save, tiers.memory_save, tiers.survives
    mtbf, restart, work = tiers.mtbf, tiers.restart, tiers.work
    rng = random.Random(seed)
    k = max(1, round(interval / memory_interval))
    tm = interval / k
    walls, hits_all = [], []
    for _ in range(runs):
        base = durable = 0.0  # compute restored from, and the newest durable point
        wall, hits = 0.0, 0
        while True:
            if hits:
                gap = rng.expovariate(1.0 / mtbf)
                if gap < restart:
                    wall, hits = wall + gap, hits + 1
                    continue
                wall += restart
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the simulation of {runs} runs passed its deadline")
            first = round(base / tm)  # save points are j = first+1, first+2, ...
            pace = (first, k, tm, memory_save, save)
            last = max(first + 1, math.ceil(work / tm - 1e-9))
            finish = (work - base) + _save_end(last, *pace) - (last - first) * tm
            fail = rng.expovariate(1.0 / mtbf)
            if fail >= finish:
                wall += finish
                break
            lo, hi = first, last  # the newest save point finished by ``fail``
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _save_end(mid, *pace) <= fail:
                    lo = mid
                else:
                    hi = mid - 1
            if lo // k > first // k:
                durable = (lo // k) * k * tm
            memory = lo * tm
            base = memory if rng.random() < survives else durable
            base = max(base, durable)
            wall, hits = wall + fail, hits + 1
        walls.append(wall)
        hits_all.append(hits)
    return {
        "ettr": sum(work / w for w in walls) / runs,
        "wall_s": sum(walls) / runs,
        "interruptions": sum(hits_all) / runs,
        "runs": float(runs),
    }


def _save_end(j: int, first: int, k: int, tm: float, memory_save: float, save: float) -> float:
    """Wall seconds from a restart at save point ``first`` to the end of save point ``j``
    (every ``k``-th point is durable and blocks ``save``, the others ``memory_save``)."""
    n = j - first
    durables = j // k - first // k
    return n * tm + (n - durables) * memory_save + durables * save


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
