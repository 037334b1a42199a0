"""One Celery + Redis measurement per invocation (run in ``.venv-peer-celery``).

Uses the public API only: ``add.delay`` per task, a ``group`` for the batch (Celery has no
bulk insert: a group still publishes one message per task, through one connection), the
result backend's ``get_many`` for outcomes and ``date_done``, and the ``celery worker``
command as the worker: ONE prefork worker with ``--concurrency`` equal to ``--processes``,
which is a supervisor and that many forked children, the shape of our ``runtasks
--processes N`` (starting N ``celery worker`` commands would make N supervisors too).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import peerkit
import redis
from benchenv import latency_figures, paced
from celery import group
from celery_tasks import BROKER, RESULTS, add, app, stamp


def worker_command(processes: int) -> list[str]:
    """``celery worker`` with its defaults but the pool size and the log level."""
    return [
        str(Path(sys.executable).with_name("celery")),
        "-A",
        "celery_tasks",
        "worker",
        "--concurrency",
        str(processes),
        "--loglevel",
        "WARNING",
    ]


def reset() -> None:
    """Empty the broker's and the result backend's Redis databases."""
    for url in (BROKER, RESULTS):
        with redis.Redis.from_url(url) as client:
            client.flushdb()


def _finished() -> int:
    """Result keys written so far: one per finished task (results db holds nothing else)."""
    with redis.Redis.from_url(RESULTS) as client:
        return int(client.dbsize())


def setup(_: argparse.Namespace) -> dict[str, Any]:
    reset()
    return {}


def enqueue_single(args: argparse.Namespace) -> dict[str, Any]:
    """``add.delay`` per task: one message published to Redis each."""
    reset()
    return peerkit.timed(args.tasks, lambda: [add.delay(i, i) for i in range(args.tasks)])


def _batch(count: int) -> list[str]:
    result = group(add.s(i, i) for i in range(count)).apply_async()
    return [child.id for child in result.results]


def enqueue_bulk(args: argparse.Namespace) -> dict[str, Any]:
    """A ``group`` of all tasks, the closest Celery has to a bulk enqueue."""
    reset()
    result = peerkit.timed(args.tasks, lambda: _batch(args.tasks))
    result["api"] = "group(...).apply_async() (one message per task)"
    return result


def _metas(ids: list[str]) -> list[dict[str, Any]]:
    return [meta for _, meta in app.backend.get_many(ids, timeout=60, interval=0.1)]


def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Pre-enqueue, then time one prefork worker until every task's result is stored.

    Celery records no start time (``task_track_started`` would add a write per task), so
    the steady span runs from the first task's ``date_done`` to the last one's.
    """
    reset()
    ids = _batch(args.tasks)
    wall, memory = peerkit.timed_drain(
        worker_command(args.processes), 1, lambda: _finished() >= args.tasks, args.timeout
    )
    metas = _metas(ids)
    failed = sum(meta["status"] != "SUCCESS" for meta in metas)
    if failed or len(metas) < args.tasks:
        raise RuntimeError(f"{failed} Celery tasks failed, {args.tasks - len(metas)} missing")
    done = sorted(datetime.fromisoformat(meta["date_done"]) for meta in metas)
    span = (done[-1] - done[0]).total_seconds()
    return peerkit.drain_figures(args.tasks, wall, span or None, memory)


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Send ``stamp(sent=now)`` at a steady rate to an idle worker; it returns its start."""
    reset()
    enqueue_seconds: list[float] = []
    ids: list[str] = []

    def send(_: int) -> None:
        sent = time.time()
        ids.append(stamp.delay(sent).id)
        enqueue_seconds.append(time.time() - sent)

    with peerkit.Workers() as workers:
        workers.start(worker_command(args.processes), 1)
        peerkit.wait_done(workers, lambda: bool(app.control.ping(timeout=0.5)), 60, "worker start")
        time.sleep(1.0)
        paced(args.tasks, args.rate, send)
        peerkit.wait_done(workers, lambda: _finished() >= args.tasks, 60, "latency tasks")
    delays = [(meta["result"][1] - meta["result"][0]) * 1000 for meta in _metas(ids)]
    return latency_figures(delays, enqueue_seconds)


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
