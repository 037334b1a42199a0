"""Bench-only tasks, imported by the worker as ``benchtasks.*`` (``bench/`` on PYTHONPATH)."""

import time

from django_tasks_plus import task


@task
def stamp(sent: float) -> float:
    """Return the wall-clock time at which the body started.

    ``sent`` is the enqueuer's clock just before ``enqueue()``; it rides in the row so each
    finished task carries both ends of its enqueue-to-start latency.
    """
    return time.time()
