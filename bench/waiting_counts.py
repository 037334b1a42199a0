"""What the overview and ``taskstats`` pay to say what READY tasks wait for, on a big queue.

Fills one queue with ``--rows`` READY tasks (default 1,000,000) in the mix a backlog
has: due ones (a tenth of them blocked behind an earlier task of their ordering key),
scheduled, retrying and breaker-held ones; then, in a Django process:

- times ``metrics.queue_waiting`` (the capped per-reason counts the overview and
  ``taskstats`` show) against ``metrics.queue_gauges`` (exact counts, for Prometheus);
- times the overview's ``build()`` and the first page of the task list filtered to each
  reason (``?waiting=…``), rendered by the test client;
- EXPLAINs (ANALYZE, BUFFERS) every statement ``queue_waiting`` runs and says which
  indexes the plans use, and whether any reads the table sequentially.

    python bench/waiting_counts.py --database bench_waiting --rows 1000000

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust); the database is dropped and
recreated. Prints JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import MANAGE, PG_SERVER, REPO, recreate_database  # noqa: E402

TASKS = "django_tasks_plus_taskrecord"
# (share of the rows, seconds until due, attempt, held, ordering key every n-th row)
MIX: list[tuple[str, float, int, int, bool]] = [
    ("due", 0.6, -600, 0, False),
    ("scheduled", 0.2, 3600, 0, False),
    ("retrying", 0.1, 600, 2, False),
    ("held", 0.1, 300, 1, True),
]


def env_for(database: str) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), str(REPO / "testproject"), str(BENCH)])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "DATABASE_URL": f"postgres://root@127.0.0.1:5432/{database}",
        "DEBUG": "false",
        "TASKS_LOG_LEVEL": "WARNING",
        "ALLOWED_HOSTS": "testserver",
    }


def fill(database: str, rows: int) -> None:
    import psycopg

    recreate_database(database)
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env_for(database), check=True
    )
    with psycopg.connect(f"{PG_SERVER}/{database}", autocommit=True) as conn:
        for name, share, due_in, attempt, held in MIX:
            count = int(rows * share)
            # Due rows: every 10th pair shares an ordering key, so one of the pair blocks
            # the other (a tenth of the due rows are blocked).
            keyed = "NULL"
            if name == "due":
                keyed = "CASE WHEN n %% 20 < 2 THEN 'acct:' || (n / 20) END"
            conn.execute(
                f"""
                INSERT INTO {TASKS} (id, task_path, backend_name, queue_name, priority, args,
                    kwargs, status, run_after, attempt, worker_ids, enqueued_at, errors,
                    dead_letter_reason, ordering_blocked, cancel_requested, metadata,
                    ordering_key, sequence, held_since, breaker_key)
                SELECT gen_random_uuid(), 'tests.tasks.add', 'default', 'default', 0, '[1, 1]',
                    '{{}}', 'READY', now() + make_interval(secs => %s + n %% 60), %s, '[]',
                    now() - make_interval(secs => n %% 3600), '[]', '', false, false, '{{}}',
                    {keyed}, n, CASE WHEN %s THEN now() END,
                    CASE WHEN %s THEN 'http/api.example.com' END
                FROM generate_series(1, %s) AS n
                """,
                [due_in, attempt, held, held, count],
            )
        conn.execute(f"VACUUM ANALYZE {TASKS}")


def timed(call: Any, runs: int) -> dict[str, float]:
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return {"median_ms": round(statistics.median(seconds) * 1000, 1), "runs": runs}


def measure(runs: int) -> dict[str, Any]:
    """(Django process.) The timings and plans, as JSON-ready data."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse
    from django.utils import timezone

    from django_tasks_plus import metrics
    from django_tasks_plus.admin import overview
    from django_tasks_plus.waiting import Reason

    found: dict[str, Any] = {}
    waiting = metrics.queue_waiting("default")
    found["counts"] = {
        q.queue: {r.value: str(c) for r, c in q.waiting.items()} for q in waiting if q.ready.count
    }
    found["queue_waiting"] = timed(lambda: metrics.queue_waiting("default"), runs)
    found["queue_gauges (exact)"] = timed(lambda: metrics.queue_gauges("default"), runs)
    found["overview build"] = timed(lambda: overview.build("default", timezone.now()), runs)

    user = get_user_model().objects.filter(username="bench").first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
    client = Client()
    client.force_login(user)
    changelist = reverse("admin:django_tasks_plus_taskrecord_changelist")
    for reason in Reason:
        url = f"{changelist}?waiting={reason.value}"
        status = client.get(url).status_code
        assert status == 200, (url, status)
        found[f"list ?waiting={reason.value}"] = timed(lambda url=url: client.get(url), runs)

    with CaptureQueriesContext(connection) as queries:
        metrics.queue_waiting("default")
    plans = []
    with connection.cursor() as cursor:
        for query in queries.captured_queries:
            sql = query["sql"]
            if "django_tasks_plus_taskrecord" not in sql:
                continue
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
            raw = cursor.fetchone()[0]
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
            text = json.dumps(plan)
            plans.append(
                {
                    "sql": sql[:160],
                    "ms": round(plan["Execution Time"], 2),
                    "indexes": sorted(
                        {part.split('"')[0] for part in text.split('"Index Name": "')[1:]}
                    ),
                    "seq_scan": '"Seq Scan"' in text,
                }
            )
    found["plans"] = plans
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="bench_waiting")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Reuse the filled database.")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.runs), indent=2))
        return
    if not args.keep:
        fill(args.database, args.rows)
    subprocess.run(
        [sys.executable, __file__, "--measure", "--runs", str(args.runs)],
        env=env_for(args.database),
        check=True,
    )


if __name__ == "__main__":
    main()
