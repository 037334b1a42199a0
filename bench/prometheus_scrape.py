"""What a Prometheus scrape costs on a big backlog: the whole exposition, and the reads
behind the breaker gauges and the oldest runnable age.

Fills one queue with ``--rows`` READY tasks in ``waiting_counts.py``'s mix (a tenth of
them held by the open circuit ``http/api.example.com``, a tenth of the due ones blocked
by their ordering key), stores that circuit open and ``--circuits`` closed ones; then, in
a Django process, times ``metrics.prometheus.render`` and EXPLAINs (ANALYZE, BUFFERS)
the held count of the open circuit and the oldest-runnable read.

    python bench/prometheus_scrape.py --database bench_scrape --rows 1000000

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust); the database is dropped and
recreated unless ``--keep``. Prints JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import PG_SERVER  # noqa: E402
from waiting_counts import env_for, fill, timed  # noqa: E402


def store_circuits(database: str, closed: int) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/{database}", autocommit=True) as conn:
        conn.execute("DELETE FROM django_tasks_plus_breakerrecord")
        conn.execute(
            """
            INSERT INTO django_tasks_plus_breakerrecord (backend_name, name, key, state,
                failures, opened_at, updated_at)
            SELECT 'default', 'http', 'host-' || n, 'closed', '[]', NULL, now()
            FROM generate_series(1, %s) AS n
            UNION ALL
            SELECT 'default', 'http', 'api.example.com', 'open', '[]', now(), now()
            """,
            [closed],
        )


def measure(runs: int) -> dict[str, Any]:
    """(Django process.) The timings and plans, as JSON-ready data."""
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_tasks_plus.metrics.breakers import breaker_gauges
    from django_tasks_plus.metrics.prometheus import render
    from django_tasks_plus.metrics.queries import queue_gauges

    found: dict[str, Any] = {"render": timed(lambda: render(["default"]), runs)}
    found["breaker_gauges"] = timed(lambda: breaker_gauges("default"), runs)
    found["queue_gauges"] = timed(lambda: queue_gauges("default"), runs)
    gauges = breaker_gauges("default")
    found["open circuit"] = [
        {"key": c.key, "held": c.held, "capped": c.held_capped}
        for c in gauges.circuits
        if c.state != "closed"
    ]
    found["circuits named"] = len(gauges.circuits)
    found["oldest_ready_age"] = {g.queue: g.oldest_ready_age for g in queue_gauges("default")}
    plans: dict[str, Any] = {}
    with CaptureQueriesContext(connection) as captured:
        breaker_gauges("default")
        queue_gauges("default")
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if "breaker_key" not in sql and "EXISTS" not in sql:  # the two reads of interest
                continue
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0][0]
            text = json.dumps(plan)
            plans.setdefault(
                sql[:90],
                {
                    "ms": plan["Execution Time"],
                    "indexes": sorted(set(_indexes(plan["Plan"]))),
                    "seq scan of tasks": '"Seq Scan"' in text and "taskrecord" in text,
                },
            )
    found["plans"] = plans
    return found


def _indexes(node: dict[str, Any]) -> list[str]:
    names = [node["Index Name"]] if "Index Name" in node else []
    for child in node.get("Plans", []):
        names += _indexes(child)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="bench_scrape")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--circuits", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Reuse the filled database.")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.runs), indent=2, default=str))
        return
    if not args.keep:
        fill(args.database, args.rows)
    store_circuits(args.database, args.circuits)
    subprocess.run(
        [sys.executable, __file__, "--measure", "--runs", str(args.runs)],
        env=env_for(args.database),
        check=True,
    )


if __name__ == "__main__":
    main()
