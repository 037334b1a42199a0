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


@task
def queries(seconds: float) -> float:
    """One statement of ``seconds`` on the database: a task thread that uses a session
    (``bench/fleet_sessions.py`` counts them)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
    return seconds
