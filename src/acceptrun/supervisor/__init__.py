"""Supervision of a workload: attempts, signals, limits, restarts."""

from acceptrun.supervisor.core import AttemptResult, Supervisor, SupervisorResult
from acceptrun.supervisor.process import ChildProcess

__all__ = ["AttemptResult", "ChildProcess", "Supervisor", "SupervisorResult"]
