"""The checkpoint-interval model (cost/interval.py) against independent computations.

The closed forms are checked against figures recomputed here from their definitions
(Young's √(2δM), the minimum of Daly's expected wall time found numerically by a search
written in this file), and the simulator against the closed form over a grid of M from
15 minutes to 24 hours and δ from 1 second to 10 minutes.
"""

from __future__ import annotations

import math

import pytest

from acceptrun.cost.interval import (
    FLEET,
    Tiers,
    daly_interval,
    ettr,
    expected_wall,
    forecast,
    simulate,
    simulate_tiers,
    tiered_forecast,
    young_interval,
)

MINUTE, HOUR = 60.0, 3600.0


def _daly_wall(tau: float, save: float, mtbf: float, restart: float, work: float) -> float:
    """Daly (2006) eq. 13, written out again: M e^(R/M) (e^((τ+δ)/M) - 1) W/τ."""
    return mtbf * math.exp(restart / mtbf) * (math.exp((tau + save) / mtbf) - 1.0) * work / tau


def _numeric_optimum(save: float, mtbf: float) -> float:
    """The τ that minimises the expected wall time, by golden-section search (R and W
    scale it without moving the minimum)."""
    lo, hi = 1e-6 * mtbf, 10.0 * mtbf
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if _daly_wall(a, save, mtbf, 0.0, 1.0) < _daly_wall(b, save, mtbf, 0.0, 1.0):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2.0


def test_young_for_a_five_minute_save_and_a_daily_interruption_is_two_hours() -> None:
    # √(2 x 300 s x 86,400 s) = √51,840,000 = 7,200 s.
    assert young_interval(5 * MINUTE, 24 * HOUR) == pytest.approx(2 * HOUR, rel=1e-12)


@pytest.mark.parametrize(
    ("save", "mtbf"),
    [(1.0, 15 * MINUTE), (30.0, HOUR), (5 * MINUTE, 24 * HOUR), (10 * MINUTE, 15 * MINUTE),
     (10 * MINUTE, HOUR), (20 * MINUTE, 15 * MINUTE)],
)  # fmt: skip
def test_daly_is_the_minimum_of_the_expected_wall_time(save: float, mtbf: float) -> None:
    best = _numeric_optimum(save, mtbf)
    daly, young = daly_interval(save, mtbf), young_interval(save, mtbf)
    at = lambda tau: 1.0 / _daly_wall(tau, save, mtbf, 0.0, 1.0)  # noqa: E731
    # Daly's estimate loses almost nothing against the true optimum of the model ...
    assert at(daly) >= at(best) * (1 - 1e-3), (daly, best)
    # ... and is at least as close to it as Young's first-order one.
    assert abs(daly - best) <= abs(young - best) + 1e-9 * best


def test_daly_takes_m_itself_for_a_save_longer_than_two_interruptions() -> None:
    assert daly_interval(3 * HOUR, HOUR) == HOUR
    assert daly_interval(2 * HOUR, HOUR) == HOUR


def test_forecast_is_the_model_written_out() -> None:
    save, mtbf, restart, work = 40.0, 3 * HOUR, 10 * MINUTE, 14 * 24 * HOUR
    tau = daly_interval(save, mtbf)
    f = forecast(tau, save=save, mtbf=mtbf, restart=restart, work=work, usd_per_hour=2000.0)
    wall = _daly_wall(tau, save, mtbf, restart, work)
    assert f.wall_s == pytest.approx(wall, rel=1e-12)
    assert f.ettr == pytest.approx(work / wall, rel=1e-12)
    assert f.ettr == pytest.approx(ettr(tau, save, mtbf, restart), rel=1e-12)
    assert f.expected_interruptions == pytest.approx(wall / mtbf, rel=1e-12)
    assert f.cost_usd == pytest.approx(2000.0 * wall / HOUR, rel=1e-12)
    assert expected_wall(tau, save, mtbf, restart, work) == pytest.approx(wall, rel=1e-12)
    fixed = forecast(tau, save=save, mtbf=mtbf, restart=restart, work=work, fixed=600.0)
    assert fixed.wall_s == pytest.approx(wall + 600.0, rel=1e-12)
    assert set(f.to_dict()) == {
        "interval_s",
        "ettr",
        "wall_s",
        "expected_interruptions",
        "cost_usd",
    }


def test_bad_inputs_name_the_value() -> None:
    with pytest.raises(ValueError, match="mtbf must be a positive number of seconds, got 0"):
        young_interval(30.0, 0)
    with pytest.raises(ValueError, match="save and restart must be >= 0"):
        expected_wall(60.0, -1.0, HOUR, 0.0, HOUR)


def test_the_fleet_rate_is_the_published_one() -> None:
    # 419 interruptions in 54 days on 16,384 GPUs: the job's M is 54 d / 419 = 3.09 h.
    assert FLEET.gpu_mtbf_s / 16384 == pytest.approx(54 * 24 * HOUR / 419, rel=1e-12)
    assert "Llama 3" in FLEET.source and "419" in FLEET.source


GRID_M = [15 * MINUTE, HOUR, 4 * HOUR, 24 * HOUR]
GRID_SAVE = [1.0, 30.0, 10 * MINUTE]


@pytest.mark.parametrize("mtbf", GRID_M)
@pytest.mark.parametrize("save", GRID_SAVE)
def test_the_advised_interval_simulates_within_one_percent_of_the_best(
    save: float, mtbf: float
) -> None:
    restart, work = 5 * MINUTE, 60 * mtbf
    advised = daly_interval(save, mtbf)
    factors = [0.25, 0.4, 0.6, 0.8, 1.0, 1.25, 1.6, 2.5, 4.0]
    # The same interruptions for every interval (one seed): differences are the interval's.
    sims = {
        f: simulate(advised * f, save=save, mtbf=mtbf, restart=restart, work=work, runs=300,
                    seed=7)["ettr"]
        for f in factors
    }  # fmt: skip
    best = max(sims.values())
    assert sims[1.0] >= best * 0.99, sims
    # And the simulation agrees with the closed form where both apply.
    predicted = ettr(advised, save, mtbf, restart)
    assert sims[1.0] == pytest.approx(predicted, rel=0.01)


def test_a_persist_window_loses_the_checkpoint_in_flight() -> None:
    args = {"save": 10.0, "mtbf": HOUR, "restart": 60.0, "work": 50 * HOUR, "runs": 300}
    tau = daly_interval(10.0, HOUR)
    sync = simulate(tau, **args)["ettr"]
    upload = simulate(tau, persist=tau / 2, **args)["ettr"]
    assert upload < sync  # an interruption during the upload goes back one more interval
    bursts = simulate(tau, weibull_shape=0.7, **args)
    assert 0 < bursts["ettr"] < 1 and bursts["interruptions"] > 0


# The memory tier (tiered_forecast, simulate_tiers): the first-order closed form against
# the event-by-event process, over stalls, shares reached and restarts; and the reduction
# to one tier.
@pytest.mark.parametrize(
    ("memory_save", "survives", "restart"),
    [(0.1, 1.0, 30.0), (0.5, 0.5, 60.0), (0.05, 0.0, 300.0), (1.0, 0.9, 5.0)],
)
def test_the_tiered_forecast_matches_its_simulation(
    memory_save: float, survives: float, restart: float
) -> None:
    mtbf, work, save = 3 * HOUR, 14 * 24 * HOUR, 4.0
    interval = daly_interval(save, mtbf)
    tiers = Tiers(
        save=save,
        memory_save=memory_save,
        survives=survives,
        mtbf=mtbf,
        restart=restart,
        work=work,
    )
    tiered = tiered_forecast(interval, tiers)
    sim = simulate_tiers(tiered.memory_interval_s, interval, tiers, runs=150, seed=3)
    assert sim["ettr"] == pytest.approx(tiered.ettr, rel=0.005)
    assert sum(tiered.shares.values()) == pytest.approx(1.0)
    assert tiered.interval_s / tiered.memory_interval_s == round(
        tiered.interval_s / tiered.memory_interval_s
    )  # a durable point is a memory point


def test_one_tier_is_daly_to_first_order_and_the_simulators_agree() -> None:
    mtbf, work, save, restart = 3 * HOUR, 14 * 24 * HOUR, 4.0, 300.0
    tau = daly_interval(save, mtbf)
    tiers = Tiers(save=save, memory_save=save, survives=0.0, mtbf=mtbf, restart=restart, work=work)
    alone = tiered_forecast(tau, tiers, memory_interval=tau)
    assert alone.shares["memory_saves"] == 0.0
    assert alone.ettr == pytest.approx(ettr(tau, save, mtbf, restart), rel=0.002)
    one = simulate(tau, save=save, mtbf=mtbf, restart=restart, work=work, runs=2000, seed=1)
    two = simulate_tiers(tau, tau, tiers, runs=300, seed=2)
    assert two["ettr"] == pytest.approx(one["ettr"], rel=0.003)


def test_a_memory_tier_that_is_always_reached_loses_less_than_none() -> None:
    mtbf, work, save = 3 * HOUR, 14 * 24 * HOUR, 4.0
    tau = daly_interval(save, mtbf)
    kw = {"save": save, "memory_save": 0.1, "mtbf": mtbf, "restart": 30.0, "work": work}
    with_tier = tiered_forecast(tau, Tiers(survives=1.0, **kw))
    never = tiered_forecast(tau, Tiers(survives=0.0, **kw))
    assert with_tier.shares["lost_work"] < never.shares["lost_work"] / 4
    assert with_tier.ettr > never.ettr
    assert never.memory_interval_s == tau  # reached after no interruption: not worth a save


def test_the_tiered_forecast_refuses_what_it_cannot_model() -> None:
    kw = {"save": 4.0, "memory_save": 0.1, "mtbf": HOUR, "work": HOUR}
    with pytest.raises(ValueError, match="survives"):
        Tiers(survives=1.5, restart=30.0, **kw)
    with pytest.raises(OverflowError):
        tiered_forecast(300.0, Tiers(survives=1.0, restart=2 * HOUR, **kw))


def test_ckpt_plan_prints_the_memory_tier_and_where_the_time_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from acceptrun.cli.main import main

    base = ["ckpt", "plan", "--gpus", "16384", "--save", "4s", "--restart", "30s",
            "--work", "54d"]  # fmt: skip
    assert main([*base, "--memory-save", "0.1s", "--memory-survives", "0.8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tier = out["memory_tier"]
    assert tier["survives"] == 0.8 and tier["survives_from"] == "--memory-survives"
    assert tier["ettr"] > tier["without"]["ettr"] and tier["interval_s"] == out["interval_s"]
    assert set(tier["shares"]) == {"work", "disk_saves", "memory_saves", "restarts", "lost_work"}
    assert main([*base, "--memory-save", "0.1s"]) == 0
    text = capsys.readouterr().out
    assert "with a memory tier" in text and "assumed" in text and "work lost" in text
    with pytest.raises(SystemExit) as bad:
        main([*base, "--memory-save", "0.1s", "--memory-survives", "2"])
    assert bad.value.code == 2 and "--memory-survives" in capsys.readouterr().err
