"""The pgqueuer entrypoints and worker factory the driver and the workers both import.

``create_pgqueuer`` is the factory that ``pgqueuer.run("pgqueuer_tasks:create_pgqueuer")``
(the entry point behind ``pgq run``) supervises; everything else is the library's defaults
(batch size 10, continuous mode, LISTEN/NOTIFY on, finished jobs moved to the log table),
over an asyncpg connection as in its README's quick start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import psycopg
from pgqueuer import Job, PgQueuer

DSN = os.environ["PEER_DSN"]
LATENCY_TABLE = "peer_latency"

_connection: psycopg.Connection | None = None


def register(pgq: PgQueuer) -> None:
    """The two entrypoints of the bench, as our ``add`` and latency task."""

    @pgq.entrypoint("add")
    async def add(job: Job) -> None:
        arguments = json.loads(job.payload or b"{}")
        _ = arguments["a"] + arguments["b"]

    @pgq.entrypoint("stamp")
    async def stamp(job: Job) -> None:
        """Record when the body started; pgqueuer keeps no return values, so use a table."""
        started = time.time()
        global _connection
        if _connection is None or _connection.closed:
            _connection = psycopg.connect(DSN, autocommit=True)
        sent = json.loads(job.payload or b"{}")["sent"]
        _connection.execute(
            f"INSERT INTO {LATENCY_TABLE} (sent, started) VALUES (%s, %s)", (sent, started)
        )


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory a pgqueuer worker runs: one asyncpg connection."""
    connection = await asyncpg.connect(DSN)
    try:
        pgq = PgQueuer.from_asyncpg_connection(connection)
        register(pgq)
        yield pgq
    finally:
        await connection.close()
