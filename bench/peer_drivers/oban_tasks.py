"""The oban-py jobs the driver enqueues and ``oban start`` runs (imported by name).

oban resolves a job's worker by its module path, so these live in a module of their own
that both the driver and the ``oban start`` workers import. They are ``@worker`` classes:
in 0.7.0 the ``.enqueue`` of a ``@job`` function binds its arguments twice (the dict of
arguments lands in the first parameter), so ``@job`` cannot enqueue a two-argument call.
"""

from __future__ import annotations

import os
import time

import psycopg
from oban import Job, worker

DSN = os.environ["PEER_DSN"]
LATENCY_TABLE = "peer_latency"
QUEUE = "default"

_connection: psycopg.Connection | None = None


@worker(queue=QUEUE)
class Add:
    """The no-op job of the drain, as our ``example.tasks.add``."""

    async def process(self, job: Job) -> int:
        return job.args["a"] + job.args["b"]


@worker(queue=QUEUE)
class Stamp:
    """Record when the body started, into a table as for the other peers."""

    async def process(self, job: Job) -> None:
        started = time.time()
        global _connection
        if _connection is None or _connection.closed:
            _connection = psycopg.connect(DSN, autocommit=True)
        _connection.execute(
            f"INSERT INTO {LATENCY_TABLE} (sent, started) VALUES (%s, %s)",
            (job.args["sent"], started),
        )
