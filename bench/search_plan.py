"""The admin search's plans and times on a large table, without and with the search indexes.

    python bench/search_plan.py                  # 1,000,000 rows
    python bench/search_plan.py --rows 200000

Fills one database (``bench_search_plan``) with finished tasks by ``generate_series``
(``args`` ``[i, i]``, ``kwargs`` ``{"user_id": i}``, ``metadata`` ``{"tenant": "t<i % 1000>"}``),
then runs the task list's first page for each kind of JSON term (the admin's own
queryset: ``selection.with_search``, newest first, 50 rows) under ``EXPLAIN (ANALYZE)``,
before and after ``manage.py searchindex create``. Prints the plan's top nodes, the
execution time, and how long building the indexes took.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from benchenv import migrated_database

SEARCHES = ("arg:123456", "kwarg:user_id=123456", 'meta:tenant="t7"', 'meta:tenant="nobody"')

FILL = """
INSERT INTO django_tasks_plus_taskrecord (
    id, task_path, backend_name, queue_name, priority, args, kwargs, status, run_after,
    attempt, worker_ids, enqueued_at, finished_at, errors, dead_letter_reason,
    ordering_blocked, cancel_requested, metadata)
SELECT gen_random_uuid(), 'example.tasks.add', 'default', 'default', 0,
    jsonb_build_array(i, i), jsonb_build_object('user_id', i), 'SUCCESSFUL',
    now() - i * interval '1 second', 1, '[]', now() - i * interval '1 second', now(), '[]',
    '', false, false, jsonb_build_object('tenant', 't' || (i %% 1000))
FROM generate_series(1, %s) AS i
"""


def run(args: argparse.Namespace) -> int:  # inside Django, on the bench database
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_tasks_plus.models import TaskRecord
    from django_tasks_plus.search import parse_search
    from django_tasks_plus.selection import with_search

    with connection.cursor() as cursor:
        cursor.execute(FILL, [args.rows])
        cursor.execute("VACUUM ANALYZE django_tasks_plus_taskrecord")

    def explain(label: str) -> None:
        for text in SEARCHES:
            rows = with_search(
                TaskRecord.objects.filter(backend_name="default"), parse_search(text)
            )
            page = rows.order_by("-enqueued_at", "-id")[:50]
            plan = page.explain(analyze=True).splitlines()
            nodes = [plan[0].strip(), *[line.strip() for line in plan[1:] if "->" in line][:3]]
            timing = [line for line in plan if line.startswith("Execution Time")]
            print(f"{label:8} {text:24} {timing[0] if timing else ''}")
            for node in nodes:
                print(f"{'':8}   {node[:150]}")

    explain("without")
    started = time.perf_counter()
    call_command("searchindex", "create")
    print(f"searchindex create on {args.rows} rows: {time.perf_counter() - started:.1f} s")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_tasks_plus_taskrecord")
    explain("with")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database", default="bench_search_plan")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        return run(args)
    env = migrated_database(args.database)
    return subprocess.run(
        [sys.executable, __file__, "--inside", *(argv or sys.argv[1:])], env=env, check=False
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
