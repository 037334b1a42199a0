"""Enqueues beside a migration that adds indexes to a big task table: do they go on?

    python bench/migrate_concurrently.py                    # 1,000,000 rows, concurrent build
    python bench/migrate_concurrently.py --plain            # then a plain CREATE INDEX too
    python bench/migrate_concurrently.py --rows 50000 --settle 5

The database (``--database``, default ``bench_migrate``) is dropped, recreated and
migrated; ``--rows`` tasks go into the task table in one INSERT … SELECT (nine in ten
SUCCESSFUL, the rest READY, some of those retrying or held, so that both partial indexes
of migration 0017 get entries), then VACUUM ANALYZE; ``migrate django_tasks_plus 0016``
drops 0017's two indexes. Then one process calls ``add.enqueue()`` in a loop, in
autocommit, while this one waits ``--settle`` seconds (*before*), runs ``manage.py migrate
django_tasks_plus 0017`` (*during*: ``AddIndexConcurrently``, ``CREATE INDEX
CONCURRENTLY``), and waits ``--settle`` seconds more (*after*). With ``--plain`` the same
follows with the same two indexes built by a plain ``CREATE INDEX`` in one transaction
(the SQL of ``sqlmigrate`` without ``CONCURRENTLY``: what a migration with ``AddIndex``
would run), after ``migrate … 0016`` has dropped them again.

For each phase: enqueues per second and the longest gap between two consecutive
enqueues (one that spans a phase's edge counts in both). A table on stdout, progress on
stderr, JSON in ``bench/results/migrate-concurrently-<time>.json``; the database is
dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchenv import MANAGE, PG_SERVER, RESULTS, migrated_database, phase_gaps

TASKS = "django_tasks_plus_taskrecord"
BEFORE_INDEXES = "0016"  # the migration before the two concurrent indexes
WITH_INDEXES = "0017"
INDEXES = ("dtp_task_held_idx", "dtp_task_retry_idx")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fill(dsn: str, rows: int) -> float:
    """``rows`` tasks in one statement, then VACUUM ANALYZE; return the seconds taken.

    One row in ten is READY and due tomorrow; of those, one in three is retrying
    (``attempt`` 1) and one in five held by a breaker (``held_since`` set).
    """
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"""
            INSERT INTO {TASKS} (
                id, task_path, backend_name, queue_name, priority, args, kwargs, status,
                run_after, attempt, worker_ids, enqueued_at, started_at, last_attempted_at,
                finished_at, return_value, errors, dead_letter_reason, ordering_blocked,
                cancel_requested, metadata, held_since
            )
            SELECT gen_random_uuid(), 'example.tasks.add', 'default', 'default', 0,
                   jsonb_build_array(g, g), '{{}}', CASE WHEN ready THEN 'READY'
                   ELSE 'SUCCESSFUL' END,
                   CASE WHEN ready THEN now() + interval '1 day' ELSE at END,
                   CASE WHEN ready AND g %% 30 = 0 THEN 1 ELSE 0 END + (NOT ready)::int,
                   '[]', at,
                   CASE WHEN ready THEN NULL ELSE at + interval '1 ms' END,
                   CASE WHEN ready THEN NULL ELSE at + interval '1 ms' END,
                   CASE WHEN ready THEN NULL ELSE at + interval '2 ms' END,
                   CASE WHEN ready THEN NULL ELSE to_jsonb(2 * g) END,
                   '[]', '', false, false, '{{}}',
                   CASE WHEN ready AND g %% 50 = 0 THEN now() END
            FROM generate_series(1, %s) AS g,
                 LATERAL (SELECT now() - interval '1 day' + g * interval '50 ms',
                                 g %% 10 = 0) AS t(at, ready)
            """,
            [rows],
        )
        conn.execute(f"VACUUM ANALYZE {TASKS}")
    return time.perf_counter() - started


def valid_indexes(dsn: str) -> list[str]:
    """Migration 0017's indexes that exist and are valid (a failed concurrent build leaves
    an invalid one behind)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass AND i.indisvalid AND c.relname = ANY(%s)"
            " ORDER BY 1",
            [TASKS, list(INDEXES)],
        ).fetchall()
    return [name for (name,) in rows]


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(MANAGE), *args], env=env, check=True, capture_output=True, text=True
    )
    return done.stdout


def plain_sql(env: dict[str, str]) -> list[str]:
    """Migration 0017's statements with ``CONCURRENTLY`` taken out."""
    text = manage(env, "sqlmigrate", "django_tasks_plus", WITH_INDEXES)
    statements = [line for line in text.splitlines() if line.startswith("CREATE INDEX")]
    if len(statements) != 2 or not all("CONCURRENTLY" in line for line in statements):
        raise RuntimeError(f"unexpected sqlmigrate output:\n{text}")
    return [line.replace(" CONCURRENTLY", "") for line in statements]


def enqueue_loop(out: str) -> int:  # inside Django
    """Enqueue until SIGTERM; write each enqueue's end time (``time.time()``) to ``out``."""
    import django

    django.setup()
    from example.tasks import add

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    add.enqueue(0, 0)  # connection and first statement out of the timed part
    stamps = [time.time()]
    print("ready", flush=True)
    i = 0
    while not stopping:
        i += 1
        add.enqueue(i, i)
        stamps.append(time.time())
    Path(out).write_text(json.dumps(stamps))
    return 0


def phase(env: dict[str, str], settle: float, build: Any, label: str) -> dict[str, Any]:
    """Enqueues before, during and after ``build()``, from a separate process."""
    with tempfile.TemporaryDirectory(prefix="dtp-migrate-") as folder:
        out = str(Path(folder) / "stamps.json")
        enqueuer = subprocess.Popen(
            [sys.executable, __file__, "enqueue", "--out", out],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert enqueuer.stdout is not None
            if enqueuer.stdout.readline().strip() != "ready":
                raise RuntimeError("the enqueuer did not start")
            time.sleep(settle)
            progress(f"{label}: building")
            start = time.time()
            build()
            end = time.time()
            progress(f"{label}: built in {end - start:.1f} s")
            time.sleep(settle)
        finally:
            enqueuer.send_signal(signal.SIGTERM)
            enqueuer.wait(timeout=60)
        stamps = json.loads(Path(out).read_text())
    edges = {
        "before": (start - settle, start),
        "during": (start, end),
        "after": (end, end + settle),
    }
    return {
        "build_seconds": end - start,
        "load_average": os.getloadavg(),
        "phases": phase_gaps(stamps, edges),
    }


def run(args: argparse.Namespace) -> int:
    dsn = f"{PG_SERVER}/{args.database}"
    progress(f"migrating a new database {args.database}")
    env = migrated_database(args.database)
    results: dict[str, Any] = {"args": vars(args), "load_average_start": os.getloadavg()}
    progress(f"filling {args.rows:,} rows")
    results["fill_seconds"] = fill(dsn, args.rows)
    manage(env, "migrate", "django_tasks_plus", BEFORE_INDEXES, "-v0")
    runs: dict[str, Any] = {}
    results["runs"] = runs
    runs["concurrent"] = phase(
        env,
        args.settle,
        lambda: manage(env, "migrate", "django_tasks_plus", WITH_INDEXES, "-v0"),
        "migrate (concurrent)",
    )
    runs["concurrent"]["indexes"] = valid_indexes(dsn)
    # Django's start-up and migration planning, without a build: a no-op migrate.
    started = time.perf_counter()
    manage(env, "migrate", "django_tasks_plus", WITH_INDEXES, "-v0")
    results["noop_migrate_seconds"] = time.perf_counter() - started
    if args.plain:
        statements = plain_sql(env)
        manage(env, "migrate", "django_tasks_plus", BEFORE_INDEXES, "-v0")

        def build_plain() -> None:
            import psycopg

            with psycopg.connect(dsn) as conn:  # one transaction, as an atomic migration
                for statement in statements:
                    conn.execute(statement)

        runs["plain"] = phase(env, args.settle, build_plain, "plain CREATE INDEX")
        runs["plain"]["indexes"] = valid_indexes(dsn)
        results["plain_sql"] = statements
    results["load_average_end"] = os.getloadavg()
    print(
        f"enqueue() beside an index build on {args.rows:,} rows, settle {args.settle:g} s, "
        f"load {results['load_average_start'][0]:.2f} -> {results['load_average_end'][0]:.2f}"
    )
    print(f"(a no-op migrate, Django's start-up alone: {results['noop_migrate_seconds']:.1f} s)")
    print(f"{'build':12} {'seconds':>8} {'phase':7} {'enqueues/s':>11} {'longest gap ms':>15}")
    for name, figures in runs.items():
        if figures["indexes"] != sorted(INDEXES):
            raise RuntimeError(f"{name}: valid indexes after the build: {figures['indexes']}")
        for phase_name, row in figures["phases"].items():
            print(
                f"{name:12} {figures['build_seconds']:>8.1f} {phase_name:7} "
                f"{row['rate']:>11,.0f} {row['longest_gap_ms']:>15,.1f}"
            )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"migrate-concurrently-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"results: {path}", file=sys.stderr)
    if not args.keep:
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "enqueue"])
    parser.add_argument("--rows", type=int, default=1_000_000, help="tasks in the table")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before and after")
    parser.add_argument("--plain", action="store_true", help="also a plain CREATE INDEX")
    parser.add_argument("--database", default="bench_migrate")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "enqueue":
        return enqueue_loop(args.out)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
