"""Backends beyond the local machine: Slurm batch jobs and SkyPilot task exports.

- :mod:`acceptrun.backends.slurm`: ``submit``, ``jobs``, ``cancel`` for a Slurm cluster;
  the batch job runs ``acceptrun run`` inside the allocation and ``acceptrun resume``
  after a requeue.
- :mod:`acceptrun.backends.skypilot`: a SkyPilot task YAML for a spec
  (``acceptrun export skypilot``).
- :mod:`acceptrun.cli.backends`: the ``acceptrun export`` commands.

Nothing is imported here: each backend loads only when used.
"""
