"""One pgqueuer measurement per invocation (run in ``.venv-peer-pgqueuer``).

Uses the public API only: ``Queries.enqueue`` (one job, or lists for a batch) over an
asyncpg connection (the driver of pgqueuer's README), and ``pgqueuer.run`` as the worker
(``pgqueuer_worker.py``). pgqueuer deletes a finished job from its queue table and writes
``picked`` and ``successful`` rows to ``pgqueuer_log``: completion and timings come from there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import peerkit
import psycopg
from benchenv import latency_figures, paced
from pgqueuer import Queries
from pgqueuer_tasks import DSN, LATENCY_TABLE

WORKER = [sys.executable, str(Path(__file__).with_name("pgqueuer_worker.py"))]


def sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        cursor = conn.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


def reset() -> None:
    """Empty queue, log and latency table; fresh statistics for the planner."""
    sql(f"TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics, {LATENCY_TABLE}")
    sql("VACUUM ANALYZE pgqueuer")


Run = Callable[[Awaitable[Any]], Any]


@contextmanager
def client() -> Iterator[tuple[Run, Queries]]:
    """pgqueuer's async ``Queries`` on one asyncpg connection, driven from sync code."""
    loop = peerkit.Loop()
    connection = loop.run(asyncpg.connect(DSN))
    try:
        yield loop.run, Queries.from_asyncpg_connection(connection)
    finally:
        loop.run(connection.close())
        loop.close()


def _payload(i: int) -> bytes:
    return json.dumps({"a": i, "b": i}).encode()


def _batch(run: Run, queries: Queries, count: int) -> None:
    run(queries.enqueue(["add"] * count, [_payload(i) for i in range(count)], [0] * count))


def setup(_: argparse.Namespace) -> dict[str, Any]:
    with client() as (run, queries):
        run(queries.install())
    sql(f"CREATE TABLE {LATENCY_TABLE} (sent double precision, started double precision)")
    return {}


def enqueue_single(args: argparse.Namespace) -> dict[str, Any]:
    """``Queries.enqueue`` per job; each call is its own transaction."""
    reset()
    with client() as (run, queries):
        return peerkit.timed(
            args.tasks,
            lambda: [run(queries.enqueue("add", _payload(i))) for i in range(args.tasks)],
        )


def enqueue_bulk(args: argparse.Namespace) -> dict[str, Any]:
    """One ``Queries.enqueue`` with lists (pgqueuer's batch form)."""
    reset()
    with client() as (run, queries):
        result = peerkit.timed(args.tasks, lambda: _batch(run, queries, args.tasks))
    result["api"] = "Queries.enqueue(lists)"
    return result


def _succeeded() -> int:
    return sql("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")[0][0]


def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Pre-enqueue, then time ``processes`` default workers until every job succeeded."""
    reset()
    with client() as (run, queries):
        _batch(run, queries, args.tasks)
    sql("VACUUM ANALYZE pgqueuer")
    wall, memory = peerkit.timed_drain(
        WORKER, args.processes, lambda: _succeeded() >= args.tasks, args.timeout
    )
    left = sql("SELECT count(*) FROM pgqueuer")[0][0]
    if left:
        raise RuntimeError(f"{left} pgqueuer jobs still queued or failed")
    span = sql(
        "SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
        " - min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log"
    )[0][0]
    return peerkit.drain_figures(args.tasks, wall, float(span) if span else None, memory)


def _connected() -> int:
    """Other connections to the peer's database: one per started worker."""
    return sql(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )[0][0]


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue ``stamp`` jobs at a steady rate to idle, listening workers."""
    reset()
    enqueue_seconds: list[float] = []

    def stamped() -> int:
        return sql(f"SELECT count(*) FROM {LATENCY_TABLE}")[0][0]

    with peerkit.Workers() as workers, client() as (run, queries):

        def send(_: int) -> None:
            sent = time.time()
            run(queries.enqueue("stamp", json.dumps({"sent": sent}).encode()))
            enqueue_seconds.append(time.time() - sent)

        workers.start(WORKER, args.processes)
        peerkit.wait_done(workers, lambda: _connected() > args.processes, 60, "worker start")
        time.sleep(1.0)
        paced(args.tasks, args.rate, send)
        peerkit.wait_done(workers, lambda: stamped() >= args.tasks, 60, "latency tasks")
    rows = sql(f"SELECT (started - sent) * 1000 FROM {LATENCY_TABLE}")
    return latency_figures([row[0] for row in rows], enqueue_seconds)


if __name__ == "__main__":
    peerkit.main(
        {
            "setup": setup,
            "enqueue-single": enqueue_single,
            "enqueue-bulk": enqueue_bulk,
            "drain": drain,
            "latency": latency,
        },
        __doc__.splitlines()[0],
    )
