"""The Celery app the driver and ``celery worker`` both import (``-A celery_tasks``).

Redis is the broker and the result backend, each on its own database number, both flushed
before every measurement. The result backend is on so that, like ours, every finished
task leaves its state, return value and time of completion behind (Celery stores none of
that by default). Everything else is Celery's defaults.
"""

from __future__ import annotations

import os
import time

from celery import Celery

BROKER = os.environ["PEER_REDIS_BROKER"]
RESULTS = os.environ["PEER_REDIS_RESULTS"]

app = Celery("celery_tasks", broker=BROKER, backend=RESULTS)


@app.task(name="add")
def add(a: int, b: int) -> int:
    """The no-op task of the drain, as our ``example.tasks.add``."""
    return a + b


@app.task(name="stamp")
def stamp(sent: float) -> tuple[float, float]:
    """When the body started, as its return value (the result backend keeps it)."""
    return sent, time.time()
