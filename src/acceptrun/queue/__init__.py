"""The local queue over a pool of GPUs (or CPU slots): submit, queue, worker, cancel.

::

    submit.py      checks a spec as a launch would, freezes it, adds a job
    db.py          queue.sqlite: jobs and workers, one transaction per state change
    scheduler.py   plan(): priority, FIFO, EASY backfill with reservations, preemption
    worker.py      runs jobs as `acceptrun run|resume` children; stops, orphans, adoption
    cli.py         acceptrun submit | queue | worker | cancel (--backend slurm too)

See docs/queue.md.
"""
