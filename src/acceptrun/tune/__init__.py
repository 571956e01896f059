"""The training-efficiency playbook: ``acceptrun tune`` and ``acceptrun bench comm``.

::

    target.py   the tune target interface: TuneConfig, TuneTarget, Built, load_target
    search.py   the batch-size search (doubling, then bisection) over a fits() probe
    trial.py    one trial in a fresh child process (precision, compile, attention, memory cap)
    sweep.py    the sweep: baseline, one axis at a time, numerics checks, budget
    report.py   the table, the best configuration file (write_best, read_best)
    comm.py     all-reduce algbw/busbw, DDP bucket sweep, scaling 1..N processes
    cli.py      the commands

Importing this package imports no torch.
"""

from __future__ import annotations

from acceptrun.tune.target import Built, TuneConfig, TuneTarget, load_target

__all__ = ["Built", "TuneConfig", "TuneTarget", "load_target", "read_best"]


def read_best(path: str) -> TuneConfig:
    """The configuration written by ``acceptrun tune --out PATH`` (TOML or JSON)."""
    from acceptrun.tune.report import read_best as _read

    return _read(path)
