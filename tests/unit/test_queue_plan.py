"""The local queue's scheduler rules: priority then FIFO, backfill, the shadow of unknown
runtimes, preemption, jobs larger than the worker (real workers:
tests/integration/test_queue.py)."""

from __future__ import annotations

import math

from acceptrun.queue.scheduler import Active, Pending, Policy, plan

# ---- the scheduler (pure) ---------------------------------------------------------------------


def test_plan_orders_by_priority_then_fifo() -> None:
    pending = [
        Pending(1, 0, 1, submitted_at=1.0, queued_at=1.0),
        Pending(2, 5, 1, submitted_at=3.0, queued_at=3.0),
        Pending(3, 5, 1, submitted_at=2.0, queued_at=2.0),
    ]
    out = plan(pending, [], [0, 1], now=10.0)
    assert out.start == [(3, (0,)), (2, (1,))]


def test_plan_backfills_beside_a_blocked_job_until_it_reserves() -> None:
    running = [Active(9, 0, (0, 1, 2), started_at=0.0, expected_s=100.0)]
    big = Pending(1, 0, 4, submitted_at=1.0, queued_at=1.0)
    small = Pending(2, 0, 1, submitted_at=2.0, queued_at=2.0, expected_s=500.0)
    policy = Policy(reserve_after=60.0)
    # The big job has waited 9 s: no reservation yet, the small one takes the free slot.
    assert plan([big, small], running, range(4), now=10.0, policy=policy).start == [(2, (3,))]
    # After 60 s it reserves: the shadow is t=100 (job 9's end); the small job would end
    # at t=570 on a slot the big job needs, so it waits.
    out = plan([big, small], running, range(4), now=70.0, policy=policy)
    assert (out.start, out.reserved, out.shadow) == ([], 1, 100.0)
    # A small job that ends before the shadow still backfills (EASY backfill).
    short = Pending(3, 0, 1, submitted_at=3.0, queued_at=3.0, expected_s=20.0)
    assert plan([big, short], running, range(4), now=70.0, policy=policy).start == [(3, (3,))]
    # Unknown runtimes only take devices the reserved job will not need.
    unknown = Pending(4, 0, 1, submitted_at=3.0, queued_at=3.0)
    assert plan([big, unknown], running, range(4), now=70.0, policy=policy).start == []
    wide = [Active(9, 0, (0, 1), started_at=0.0, expected_s=100.0)]
    need3 = Pending(1, 0, 3, submitted_at=1.0, queued_at=1.0)
    out = plan([need3, unknown], wide, range(4), now=70.0, policy=policy)
    assert out.start == [(4, (2,))] and out.shadow == 100.0  # 4 free at t=100, 3 needed


def test_plan_unknown_runtime_of_running_jobs_makes_the_shadow_infinite() -> None:
    running = [Active(9, 0, (0, 1), started_at=0.0)]
    big = Pending(1, 0, 4, submitted_at=1.0, queued_at=1.0)
    short = Pending(2, 0, 1, submitted_at=2.0, queued_at=2.0, expected_s=1.0)
    out = plan([big, short], running, range(4), now=100.0, policy=Policy(reserve_after=0))
    assert out.shadow == math.inf and out.start == [(2, (2,))]


def test_plan_preempts_lower_priority_only_when_it_makes_room() -> None:
    running = [
        Active(7, 1, (0, 1), started_at=0.0),
        Active(8, 0, (2,), started_at=5.0),
        Active(9, 9, (3,), started_at=1.0),
    ]
    urgent = Pending(1, 5, 2, submitted_at=1.0, queued_at=1.0)
    policy = Policy(reserve_after=600.0, preempt_after=30.0)
    assert plan([urgent], running, range(4), now=20.0, policy=policy).preempt == []
    out = plan([urgent], running, range(4), now=40.0, policy=policy)
    # Lowest priority first (job 8, one slot), then job 7; job 9 outranks it.
    assert out.preempt == [(8, 1), (7, 1)] and out.reserved == 1 and out.start == []
    # While they stop, nothing backfills into what they free.
    filler = Pending(2, 0, 1, submitted_at=2.0, queued_at=2.0, expected_s=1.0)
    stopping = [
        Active(a.id, a.priority, a.devices, a.started_at, stopping=a.id in (7, 8)) for a in running
    ]
    out = plan([urgent, filler], stopping, range(4), now=41.0, policy=policy)
    assert out.preempt == [] and out.start == []
    # A job as important as everything running preempts nothing.
    assert plan([Pending(3, 0, 4, 1.0, 1.0)], running, range(4), 99.0, policy).preempt == []


def test_plan_skips_jobs_larger_than_the_worker() -> None:
    out = plan([Pending(1, 9, 8, 0.0, 0.0), Pending(2, 0, 2, 1.0, 1.0)], [], range(4), now=1.0)
    assert out.start == [(2, (0, 1))] and out.reserved is None


# ---- real workers -----------------------------------------------------------------------------
