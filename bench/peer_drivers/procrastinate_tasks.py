"""The procrastinate app the peer driver and ``procrastinate worker`` both import.

Configured from ``PEER_DSN`` with the library's defaults otherwise (one job at a time per
worker, LISTEN/NOTIFY on, finished jobs kept).
"""

from __future__ import annotations

import os
import time

import psycopg
from procrastinate import App, PsycopgConnector

DSN = os.environ["PEER_DSN"]
LATENCY_TABLE = "peer_latency"

app = App(connector=PsycopgConnector(conninfo=DSN))

_connection: psycopg.Connection | None = None


@app.task(name="add")
def add(a: int, b: int) -> int:
    """The no-op task of the drain, as our ``example.tasks.add``."""
    return a + b


@app.task(name="stamp")
def stamp(sent: float) -> None:
    """Record when the body started; procrastinate keeps no return values, so use a table."""
    started = time.time()
    global _connection
    if _connection is None or _connection.closed:
        _connection = psycopg.connect(DSN, autocommit=True)
    _connection.execute(
        f"INSERT INTO {LATENCY_TABLE} (sent, started) VALUES (%s, %s)", (sent, started)
    )
