"""PostgreSQL's CPU per claimed row and per written outcome, read from its backend.

The worker's own session (its settings, its prepared statements) claims batches of
``--batch`` tasks and writes their outcomes as successes until the queue is empty; around
each statement the backend's CPU time is read from ``/proc/<pid>/schedstat`` (the server
runs on this host), so the figures are the server's work alone, without the client's or
the round trip's. Medians per row over the batches.

``--history N`` puts N finished tasks in the table first (as W4 does). ``--ordered-ids``
enqueues half the tasks with time-ordered ids (version-7 style: milliseconds first) to a
second queue and claims the two queues in alternating batches, so both id kinds are
measured in the same table at the same moment: what random ids cost in the primary key.

    python bench/row_cpu.py --history 1000000 --ordered-ids

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust); ``--database`` (default
``bench_rows``) is dropped and recreated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import migrated_database  # noqa: E402
from cpuaccount import thread_cpu  # noqa: E402

ORDERED_QUEUE = "other"  # a queue of the test project's QUEUES


def ordered_ids(count: int) -> list[str]:
    """``count`` ids in the version-7 layout: 48 bits of Unix milliseconds, then random."""
    ids = []
    for _ in range(count):
        h = f"{time.time_ns() // 1_000_000:012x}" + os.urandom(10).hex()
        ids.append(f"{h[:8]}-{h[8:12]}-7{h[13:16]}-8{h[17:20]}-{h[20:32]}")
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--history", type=int, default=0, help="finished rows first")
    parser.add_argument("--ordered-ids", action="store_true")
    parser.add_argument("--database", default="bench_rows")
    args = parser.parse_args()

    env = migrated_database(args.database)
    os.environ.update(env)
    sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)  # the package and the test project
    import django

    django.setup()
    from benchtasks import stamp
    from django.db import connection
    from django.utils import timezone
    from driver import fill_history

    import django_tasks_plus.envelope as envelope
    from django_tasks_plus import enqueue_many
    from django_tasks_plus.compat import TaskResultStatus
    from django_tasks_plus.db import dialect_for
    from django_tasks_plus.lifecycle import Transition

    if args.history:
        fill_history(args.history)
    queues = {"default": envelope.new_task_ids}
    if args.ordered_ids:
        queues[ORDERED_QUEUE] = ordered_ids
    random_ids = envelope.new_task_ids
    per_queue = args.tasks // len(queues)
    for start in range(0, per_queue, 5_000):
        for queue, ids in queues.items():
            envelope.new_task_ids = ids  # type: ignore[assignment]
            calls = [((0.0,), {}) for _ in range(min(5_000, per_queue - start))]
            enqueue_many(stamp.using(queue_name=queue), calls)
    envelope.new_task_ids = random_ids
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE django_tasks_plus_taskrecord")
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    dialect = dialect_for(connection)
    dialect.bound_worker_statements(connection, 60.0)  # the worker's session settings

    def cpu_us() -> float:
        return thread_cpu(backend) * 1e6

    claims: dict[str, list[float]] = {queue: [] for queue in queues}
    outcomes: dict[str, list[float]] = {queue: [] for queue in queues}
    left = set(queues)
    while left:
        for queue in sorted(left):
            before = cpu_us()
            tasks = dialect.claim(
                connection,
                backend_name="default",
                queues=[queue],
                limit=args.batch,
                worker_id="row-cpu",
                lease_token=uuid.uuid4().hex,
                visibility_timeout=60,
                synchronous=False,
            )
            claimed = cpu_us()
            if not tasks:
                left.discard(queue)
                continue
            now = timezone.now()
            values = {"return_value": 0.0, "finished_at": now, "last_attempted_at": now}
            done = [(task, Transition(TaskResultStatus.SUCCESSFUL, dict(values))) for task in tasks]
            before_outcomes = cpu_us()
            if not all(dialect.write_outcomes(connection, done)):
                raise SystemExit("an outcome did not land")
            written = cpu_us()
            claims[queue].append((claimed - before) / len(tasks))
            outcomes[queue].append((written - before_outcomes) / len(tasks))
    print(f"{args.tasks} tasks beside {args.history:,} finished rows, batches of {args.batch}")
    for queue in queues:
        kind = "time-ordered ids" if queue == ORDERED_QUEUE else "random ids"
        print(
            f"{kind:17s} backend CPU per claimed row {statistics.median(claims[queue]):5.1f} µs,"
            f" per outcome {statistics.median(outcomes[queue]):5.1f} µs"
            f" ({len(claims[queue])} batches)"
        )


if __name__ == "__main__":
    main()
