"""Ways to spare PostgreSQL the parse and plan of a single enqueue, measured side by side.

A single ``enqueue()`` sends one statement, unprepared (Django's default), so the server
parses and plans it on every call. This replays that exact statement (captured from
``add.enqueue(1, 2)`` on the test project) from plain psycopg, in autocommit, in forms
that would let PostgreSQL reuse a plan:

- ``as_sent``: what the library sends today (bound on the server, unprepared);
- ``prepared``: the same, prepared by psycopg (``prepare=True``; a named statement on the
  server, what ``OPTIONS["prepare_threshold"]`` turns on);
- ``function``: a PL/pgSQL function holding the INSERT and the NOTIFY (PL/pgSQL caches
  its statements' plans per session), called with the row's values;
- ``execute``: a ``PREPARE``d statement run by SQL ``EXECUTE``, whose values the client
  must inline (a utility statement takes no bound parameters).

Rounds alternate the order; each prints wall time, client CPU and the backend's CPU
(``/proc``: the database is on this host) per call, medians over rounds.

    python bench/enqueue_plans.py --calls 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject"), str(HERE)]

from benchenv import PG_SERVER as SERVER  # noqa: E402
from benchenv import recreate_database  # noqa: E402
from cpuaccount import process_cpu  # noqa: E402

KINDS = ("as_sent", "prepared", "function", "execute")
# The types of the captured statement's parameters, in order: the values a single
# enqueue binds (the rest are inlined constants), then the NOTIFY's channel and queue.
PARAMETER_TYPES = (
    "uuid, text, text, text, smallint, text, timestamptz, integer, timestamptz, text, text, text"
)


def captured_statement(database: str) -> tuple[str, list[Any]]:
    """The statement and values ``add.enqueue(1, 2)`` sends, from a migrated database."""
    os.environ["DATABASE_URL"] = f"{SERVER}/{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("DEBUG", "false")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from example.tasks import add

    call_command("migrate", verbosity=0)
    seen: list[tuple[str, list[Any]]] = []

    def capture(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any):
        seen.append((sql, list(params)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        add.enqueue(1, 2)
    connection.close()
    (found,) = [entry for entry in seen if "pg_notify" in entry[0]]
    return found


def numbered(sql: str) -> str:
    """psycopg's ``%s`` placeholders as PostgreSQL's ``$1 … $n``."""
    count = iter(range(1, sql.count("%s") + 1))
    return re.sub(r"%s", lambda _: f"${next(count)}", sql)


def install(conn: psycopg.Connection[Any], sql: str) -> None:
    """The function and the named statement, both from the captured text."""
    insert = numbered(sql.split("WITH inserted AS (", 1)[1].rsplit(") SELECT pg_notify", 1)[0])
    conn.execute(
        f"CREATE OR REPLACE FUNCTION bench_enqueue_one({PARAMETER_TYPES}) RETURNS void "
        f"LANGUAGE plpgsql AS $fn$ BEGIN {insert}; PERFORM pg_notify($11, $12); END $fn$"
    )
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE bench_enqueue_one ({PARAMETER_TYPES}) AS {numbered(sql)}")


def measure(database: str, sql: str, values: list[Any], calls: int, rounds: int) -> None:
    with psycopg.connect(f"{SERVER}/{database}", autocommit=True) as conn:
        install(conn, sql)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None
        bound = conn.cursor()
        inlined = psycopg.ClientCursor(conn)
        marks = ", ".join(["%s"] * len(values))
        function_call = f"SELECT bench_enqueue_one({marks})"
        execute_call = f"EXECUTE bench_enqueue_one({marks})"

        def fresh() -> list[Any]:
            now = datetime.now(UTC)
            row = list(values)
            row[0], row[6], row[8] = str(uuid.uuid4()), now, now
            return row

        def one(kind: str) -> None:
            if kind == "as_sent":
                bound.execute(sql, fresh(), prepare=False)
            elif kind == "prepared":
                bound.execute(sql, fresh(), prepare=True)
            elif kind == "function":
                bound.execute(function_call, fresh(), prepare=False)
            else:
                inlined.execute(execute_call, fresh())

        figures: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in KINDS}
        for round_ in range(rounds):
            for kind in KINDS if round_ % 2 == 0 else KINDS[::-1]:
                client0, server0 = time.process_time(), process_cpu(backend[0])
                wall0 = time.perf_counter()
                for _ in range(calls):
                    one(kind)
                wall = time.perf_counter() - wall0
                client = time.process_time() - client0
                server = process_cpu(backend[0]) - server0
                figures[kind].append((wall, client, server))
            conn.execute("TRUNCATE django_tasks_plus_taskrecord")
    print(f"{'form':<10} {'calls/s':>8} {'wall µs':>8} {'client µs':>10} {'backend µs':>11}")
    for kind, runs in figures.items():
        wall, client, server = (statistics.median(run[i] for run in runs) for i in range(3))
        print(
            f"{kind:<10} {calls / wall:>8,.0f} {1e6 * wall / calls:>8.0f} "
            f"{1e6 * client / calls:>10.0f} {1e6 * server / calls:>11.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="enqueue_plans", help="recreated (enqueue_plans)")
    parser.add_argument("--calls", type=int, default=3000, help="enqueues per form and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    args = parser.parse_args()
    recreate_database(args.database)
    sql, values = captured_statement(args.database)
    measure(args.database, sql, values, args.calls, args.rounds)


if __name__ == "__main__":
    main()
