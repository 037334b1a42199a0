"""One procrastinate measurement per invocation (run in ``.venv-peer-procrastinate``).

Uses the public API only: ``Task.defer`` / ``Task.batch_defer`` on an opened ``App`` and
the ``procrastinate worker`` command. Completion and timings are read from the
``procrastinate_jobs`` and ``procrastinate_events`` tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import peerkit
import psycopg
from benchenv import latency_figures, paced
from procrastinate_tasks import DSN, LATENCY_TABLE, add, app, stamp

# The peer's own worker command with its defaults; logging at WARNING as for our runtasks
# (the default INFO writes two lines per job, which would measure logging, not the queue).
WORKER = [
    str(Path(sys.executable).with_name("procrastinate")),
    "--app",
    "procrastinate_tasks.app",
    "--log-level",
    "warning",
    "worker",
]


def sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        cursor = conn.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


def reset() -> None:
    """Empty queue, events and latency table; fresh statistics for the planner."""
    sql(
        "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers, "
        f"procrastinate_workers, {LATENCY_TABLE} CASCADE"
    )
    sql("VACUUM ANALYZE procrastinate_jobs")


def setup(_: argparse.Namespace) -> dict[str, Any]:
    with app.open():
        app.schema_manager.apply_schema()
    sql(f"CREATE TABLE {LATENCY_TABLE} (sent double precision, started double precision)")
    return {}


def enqueue_single(args: argparse.Namespace) -> dict[str, Any]:
    """``add.defer`` per task; each call is its own transaction."""
    reset()
    with app.open():
        return peerkit.timed(args.tasks, lambda: [add.defer(a=i, b=i) for i in range(args.tasks)])


def _batch(count: int) -> None:
    add.batch_defer(*({"a": i, "b": i} for i in range(count)))


def enqueue_bulk(args: argparse.Namespace) -> dict[str, Any]:
    """``add.batch_defer`` of all tasks at once (procrastinate's bulk API)."""
    reset()
    with app.open():
        result = peerkit.timed(args.tasks, lambda: _batch(args.tasks))
    result["api"] = "Task.batch_defer"
    return result


def _count(status: str) -> int:
    return sql("SELECT count(*) FROM procrastinate_jobs WHERE status = %s", status)[0][0]


def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Pre-enqueue, then time ``processes`` default workers until every job succeeded."""
    reset()
    with app.open():
        _batch(args.tasks)
    sql("VACUUM ANALYZE procrastinate_jobs")
    wall, memory = peerkit.timed_drain(
        WORKER, args.processes, lambda: _count("succeeded") >= args.tasks, args.timeout
    )
    failed = sql("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")[0][0]
    if failed:
        raise RuntimeError(f"{failed} procrastinate jobs did not succeed")
    span = sql(
        "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
        " - min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events"
    )[0][0]
    return peerkit.drain_figures(args.tasks, wall, float(span) if span else None, memory)


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue ``stamp(sent=now)`` at a steady rate to idle, listening workers."""
    reset()
    enqueue_seconds: list[float] = []

    def send(_: int) -> None:
        sent = time.time()
        stamp.defer(sent=sent)
        enqueue_seconds.append(time.time() - sent)

    def stamped() -> int:
        return sql(f"SELECT count(*) FROM {LATENCY_TABLE}")[0][0]

    with peerkit.Workers() as workers, app.open():
        workers.start(WORKER, args.processes)
        registered = "SELECT count(*) FROM procrastinate_workers"
        peerkit.wait_done(
            workers, lambda: sql(registered)[0][0] >= args.processes, 60, "worker start"
        )
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
