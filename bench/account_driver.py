"""Our side of ``account.py``, one step per invocation, printed as a JSON line.

    python bench/account_driver.py {setup,single,fill} [--tasks N]

``single`` times ``add.enqueue(i, i)`` in autocommit (as W1a) with ``cpuaccount``;
``fill`` queues ``--tasks`` calls with ``enqueue_many`` for a drain that ``account.py``
times from outside (``runtasks --burst``).
"""

from __future__ import annotations

import argparse
import json

import django

django.setup()

from cpuaccount import single_enqueues  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_tasks_plus import enqueue_many  # noqa: E402
from django_tasks_plus.models import DedupKey, TaskRecord, WorkerRecord  # noqa: E402
from example.tasks import add  # noqa: E402

TASKS = connection.ops.quote_name(TaskRecord._meta.db_table)


def _empty() -> None:
    """An empty queue with fresh statistics and no dead tuples."""
    names = ", ".join(
        connection.ops.quote_name(model._meta.db_table)
        for model in (TaskRecord, WorkerRecord, DedupKey)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {names}")
        cursor.execute(f"VACUUM ANALYZE {TASKS}")


def setup(_: argparse.Namespace) -> dict[str, object]:
    call_command("migrate", verbosity=0)
    return {"table": TaskRecord._meta.db_table}


def single(args: argparse.Namespace) -> dict[str, object]:
    _empty()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return single_enqueues(lambda i: add.enqueue(i, i), args.tasks, backend)


def fill(args: argparse.Namespace) -> dict[str, object]:
    _empty()
    enqueue_many(add, [((i, i), {}) for i in range(args.tasks)])
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {TASKS}")
    connection.close()
    return {"queued": args.tasks}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Our side of account.py.")
    parser.add_argument("step", choices=("setup", "single", "fill"))
    parser.add_argument("--tasks", type=int, default=2_000)
    options = parser.parse_args()
    print(json.dumps({"setup": setup, "single": single, "fill": fill}[options.step](options)))
