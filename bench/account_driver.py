"""Our side of ``account.py``, one step per invocation, printed as a JSON line.

    python bench/account_driver.py {setup,single,fill,binding} [--tasks N]

``single`` times ``add.enqueue(i, i)`` in autocommit (as W1a) with ``cpuaccount``;
``fill`` queues ``--tasks`` calls with ``enqueue_many`` for a drain that ``account.py``
times from outside (``runtasks --burst``); ``binding`` replays the INSERT that one
``add.enqueue`` sends, from plain psycopg, bound three ways (what would a change of
binding save?).
"""

from __future__ import annotations

import argparse
import json
import uuid

import django

django.setup()

import psycopg  # noqa: E402
from cpuaccount import single_enqueues  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from driver import empty_tables, enqueue_backlog, vacuum_analyze  # noqa: E402

from django_tasks_plus.models import TaskRecord  # noqa: E402
from example.tasks import add  # noqa: E402


def _empty() -> None:
    """An empty queue with fresh statistics and no dead tuples."""
    empty_tables()
    vacuum_analyze()


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
    """Queue ``--tasks`` no-op tasks; then VACUUM ANALYZE, unless ``--unvacuumed``: the
    table as a flood leaves it, for autovacuum (if the server runs it) to find during
    the drain."""
    _empty()
    enqueue_backlog(args.tasks)
    if not args.unvacuumed:
        vacuum_analyze()
    connection.close()
    return {"queued": args.tasks, "vacuumed": not args.unvacuumed}


def binding(args: argparse.Namespace) -> dict[str, object]:
    """Our single-enqueue statement (INSERT + NOTIFY, fresh id per call) from plain
    psycopg: bound on the client as Django's backend does, or on the server, prepared or
    not. Same SQL, same values: the difference is binding and parse/plan alone."""
    _empty()
    captured: list[tuple[str, list[object]]] = []

    def capture(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        captured.append((sql, list(params)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        add.enqueue(1, 1)
    sql, params = captured[-1]
    settings = connection.settings_dict
    dsn = (
        f"postgresql://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    )
    result: dict[str, object] = {"params": len(params)}
    variants = (
        ("client_side", psycopg.ClientCursor, None),
        ("server_side_prepared", psycopg.Cursor, None),
        ("server_side_unprepared", psycopg.Cursor, False),
    )
    for name, factory, prepare in variants:
        with psycopg.connect(dsn, autocommit=True, cursor_factory=factory) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

            def call(
                _: int, conn: psycopg.Connection = conn, prepare: bool | None = prepare
            ) -> None:
                conn.execute(sql, [uuid.uuid4().hex, *params[1:]], prepare=prepare)

            result[name] = single_enqueues(call, args.tasks, backend)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Our side of account.py.")
    parser.add_argument("step", choices=("setup", "single", "fill", "binding"))
    parser.add_argument("--tasks", type=int, default=2_000)
    parser.add_argument("--unvacuumed", action="store_true", help="fill: no VACUUM after")
    options = parser.parse_args()
    steps = {"setup": setup, "single": single, "fill": fill, "binding": binding}
    print(json.dumps(steps[options.step](options)))
