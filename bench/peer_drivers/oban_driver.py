"""One oban-py measurement per invocation (run in ``.venv-peer-oban``, Python 3.12).

Uses the public API only: a client-mode ``Oban`` (no queues) over ``Oban.create_pool``,
``Add.enqueue`` of a ``@worker`` class and ``Oban.enqueue_many`` for the batch, and the
``oban start`` command as the worker with the ``default:10`` queue of its own examples.
oban keeps finished jobs (``completed``, with ``attempted_at`` and ``completed_at``) until
its pruner removes them a day later: completion and timings come from ``oban_jobs``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import peerkit
import psycopg
from benchenv import latency_figures, paced
from oban import Oban
from oban.schema import install
from oban_tasks import DSN, LATENCY_TABLE, QUEUE, Add, Stamp

CONCURRENCY = 10  # oban's own examples (`oban start --queues default:10`)
WORKER = [
    str(Path(sys.executable).with_name("oban")),
    "start",
    "--dsn",
    DSN,
    "--queues",
    f"{QUEUE}:{CONCURRENCY}",
    "--log-level",
    "WARNING",
]


def sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        cursor = conn.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


def reset() -> None:
    """Empty jobs and latency table; fresh statistics for the planner."""
    sql(f"TRUNCATE oban_jobs, {LATENCY_TABLE}")
    sql("VACUUM ANALYZE oban_jobs")


@contextmanager
def client() -> Iterator[tuple[peerkit.Loop, Oban]]:
    """A started client-mode ``Oban`` (enqueues only), driven from sync code."""
    loop = peerkit.Loop()
    pool = loop.run(Oban.create_pool(DSN))
    oban = Oban(pool=pool)
    loop.run(oban.start())
    try:
        yield loop, oban
    finally:
        loop.run(oban.stop())
        loop.run(pool.close())
        loop.close()


def setup(_: argparse.Namespace) -> dict[str, Any]:
    loop = peerkit.Loop()
    pool = loop.run(Oban.create_pool(DSN))
    loop.run(install(pool))
    loop.run(pool.close())
    loop.close()
    sql(f"CREATE TABLE {LATENCY_TABLE} (sent double precision, started double precision)")
    return {}


def _batch(loop: peerkit.Loop, oban: Oban, count: int) -> None:
    loop.run(oban.enqueue_many(Add.new({"a": i, "b": i}) for i in range(count)))


def enqueue_single(args: argparse.Namespace) -> dict[str, Any]:
    """``Add.enqueue`` per job; each call is its own transaction."""
    reset()
    with client() as (loop, _):
        return peerkit.timed(
            args.tasks, lambda: [loop.run(Add.enqueue({"a": i, "b": i})) for i in range(args.tasks)]
        )


def enqueue_bulk(args: argparse.Namespace) -> dict[str, Any]:
    """One ``Oban.enqueue_many`` of all jobs (oban's bulk API)."""
    reset()
    with client() as (loop, oban):
        result = peerkit.timed(args.tasks, lambda: _batch(loop, oban, args.tasks))
    result["api"] = "Oban.enqueue_many"
    return result


def _completed() -> int:
    return sql("SELECT count(*) FROM oban_jobs WHERE state = 'completed'")[0][0]


def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Pre-enqueue, then time ``processes`` ``oban start`` workers until every job completed."""
    reset()
    with client() as (loop, oban):
        _batch(loop, oban, args.tasks)
    sql("VACUUM ANALYZE oban_jobs")
    wall, memory = peerkit.timed_drain(
        WORKER, args.processes, lambda: _completed() >= args.tasks, args.timeout
    )
    other = sql("SELECT count(*) FROM oban_jobs WHERE state <> 'completed'")[0][0]
    if other:
        raise RuntimeError(f"{other} oban jobs did not complete")
    span = sql("SELECT extract(epoch FROM max(completed_at) - min(attempted_at)) FROM oban_jobs")[
        0
    ][0]
    return peerkit.drain_figures(args.tasks, wall, float(span) if span else None, memory)


def _producers() -> int:
    """Queue producers the started workers registered (one per node and queue)."""
    return sql("SELECT count(*) FROM oban_producers")[0][0]


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue ``Stamp`` jobs at a steady rate to idle ``oban start`` workers."""
    reset()
    sql("DELETE FROM oban_producers")
    enqueue_seconds: list[float] = []

    def stamped() -> int:
        return sql(f"SELECT count(*) FROM {LATENCY_TABLE}")[0][0]

    with peerkit.Workers() as workers, client() as (loop, _):

        def send(_: int) -> None:
            sent = time.time()
            loop.run(Stamp.enqueue({"sent": sent}))
            enqueue_seconds.append(time.time() - sent)

        workers.start(WORKER, args.processes)
        peerkit.wait_done(workers, lambda: _producers() >= args.processes, 60, "worker start")
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
