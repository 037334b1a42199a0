"""One django-tasks-db measurement per invocation (run in ``.venv-peer-django-tasks-db``).

Uses the public API only: ``Task.enqueue`` and the ``db_worker`` management command;
completion and timings are read from its ``DBTaskResult`` model. django-tasks-db has no
bulk enqueue, so the bulk figure is an ``enqueue`` loop inside one transaction.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import django

django.setup()

import peerkit  # noqa: E402
from benchenv import latency_figures, paced  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Max, Min  # noqa: E402
from django_tasks_db.models import DBTaskResult  # noqa: E402
from djdb_tasks import add, stamp  # noqa: E402

# The peer's own worker command with its defaults; -v 0 as our runtasks gets (the default
# logs every task).
WORKER = [sys.executable, "-m", "django", "db_worker", "--verbosity", "0"]


def reset() -> None:
    """Empty task table and fresh statistics (TRUNCATE leaves no dead tuples)."""
    table = connection.ops.quote_name(DBTaskResult._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        cursor.execute(f"VACUUM ANALYZE {table}")


def setup(_: argparse.Namespace) -> dict[str, Any]:
    call_command("migrate", verbosity=0)
    return {}


def enqueue_single(args: argparse.Namespace) -> dict[str, Any]:
    """``add.enqueue`` in autocommit: one INSERT and commit per call."""
    reset()
    return peerkit.timed(args.tasks, lambda: [add.enqueue(i, i) for i in range(args.tasks)])


def _enqueue_in_one_transaction(count: int) -> None:
    with transaction.atomic():
        for i in range(count):
            add.enqueue(i, i)


def enqueue_bulk(args: argparse.Namespace) -> dict[str, Any]:
    """No bulk API: ``enqueue`` loop inside one transaction, labelled as such."""
    reset()
    result = peerkit.timed(args.tasks, lambda: _enqueue_in_one_transaction(args.tasks))
    result["api"] = "no bulk API: enqueue loop in one transaction"
    return result


def drain(args: argparse.Namespace) -> dict[str, Any]:
    """Pre-enqueue, then time ``processes`` default ``db_worker``s until all succeeded."""
    reset()
    _enqueue_in_one_transaction(args.tasks)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {DBTaskResult._meta.db_table}")
    connection.close()
    succeeded = DBTaskResult.objects.successful()
    wall, memory = peerkit.timed_drain(
        WORKER, args.processes, lambda: succeeded.count() >= args.tasks, args.timeout
    )
    if DBTaskResult.objects.exclude(status="SUCCESSFUL").exists():
        raise RuntimeError("some django-tasks-db tasks did not succeed")
    span = DBTaskResult.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    steady = (span["last"] - span["first"]).total_seconds()
    return peerkit.drain_figures(args.tasks, wall, steady, memory)


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue ``stamp(now)`` at a steady rate to idle default ``db_worker``s."""
    reset()
    enqueue_seconds: list[float] = []

    def send(_: int) -> None:
        sent = time.time()
        stamp.enqueue(sent)
        enqueue_seconds.append(time.time() - sent)

    done = DBTaskResult.objects.successful()
    with peerkit.Workers() as workers:
        workers.start(WORKER, args.processes)
        time.sleep(3.0)  # no registration to wait for: start-up plus the random start delay
        workers.check_alive()
        paced(args.tasks, args.rate, send)
        peerkit.wait_done(workers, lambda: done.count() >= args.tasks, 60, "latency tasks")
    delays = [
        (started - call["args"][0]) * 1000
        for call, started in done.values_list("args_kwargs", "return_value")
    ]
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
