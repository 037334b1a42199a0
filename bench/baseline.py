"""Bare-psycopg baselines: what the database and driver alone manage on this machine.

The machine is shared and drifts, so django-tasks-plus figures are reported as ratios to
these, measured in the same invocation. Each baseline does the minimum honest work of
its counterpart and nothing more:

* ``insert_loop``: one INSERT of a task-sized row per call, committed (autocommit);
* ``copy_bulk``: COPY of task-sized rows in one transaction;
* ``claim_drain``: P processes claiming batches with ``FOR UPDATE SKIP LOCKED``, "running"
  each row (adding two numbers) and writing its result back, until the table is drained.

The task-sized table has a primary key and a partial index on ready rows, as a queue
table needs; the claim table is deliberately simpler (bigint key, one partial index).
"""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid
from datetime import UTC, datetime
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg

TASKS_TABLE = "baseline_tasks"
CLAIM_TABLE = "baseline_claim"

TASK_COLUMNS = (
    "id",
    "task_path",
    "backend_name",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "status",
    "run_after",
    "attempt",
    "worker_ids",
    "errors",
    "enqueued_at",
    "dead_letter_reason",
    "ordering_blocked",
    "cancel_requested",
)

CREATE_TASKS = f"""
    DROP TABLE IF EXISTS {TASKS_TABLE};
    CREATE TABLE {TASKS_TABLE} (
        id uuid PRIMARY KEY,
        task_path varchar(255) NOT NULL,
        backend_name varchar(100) NOT NULL,
        queue_name varchar(100) NOT NULL,
        priority smallint NOT NULL,
        args jsonb NOT NULL,
        kwargs jsonb NOT NULL,
        status varchar(10) NOT NULL,
        run_after timestamptz NOT NULL,
        attempt integer NOT NULL,
        worker_ids jsonb NOT NULL,
        errors jsonb NOT NULL,
        enqueued_at timestamptz NOT NULL,
        dead_letter_reason text NOT NULL,
        ordering_blocked boolean NOT NULL,
        cancel_requested boolean NOT NULL
    );
    CREATE INDEX {TASKS_TABLE}_ready ON {TASKS_TABLE} (priority DESC, run_after, id)
        WHERE status = 'READY';
"""

CREATE_CLAIM = f"""
    DROP TABLE IF EXISTS {CLAIM_TABLE};
    CREATE TABLE {CLAIM_TABLE} (
        id bigserial PRIMARY KEY,
        status varchar(10) NOT NULL DEFAULT 'READY',
        payload jsonb NOT NULL,
        result jsonb,
        started_at timestamptz,
        finished_at timestamptz
    );
    CREATE INDEX {CLAIM_TABLE}_ready ON {CLAIM_TABLE} (id) WHERE status = 'READY';
"""

CLAIM = f"""
    UPDATE {CLAIM_TABLE} SET status = 'RUNNING', started_at = now()
    WHERE id IN (
        SELECT id FROM {CLAIM_TABLE} WHERE status = 'READY'
        ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
    )
    RETURNING id, payload
"""

COMPLETE = f"""
    UPDATE {CLAIM_TABLE} AS t
    SET status = 'SUCCESSFUL', result = done.result::jsonb, finished_at = now()
    FROM unnest(%s::bigint[], %s::text[]) AS done(id, result)
    WHERE t.id = done.id
"""


def _task_row(n: int) -> tuple[Any, ...]:
    """One row of the width django-tasks-plus writes for ``add(n, n)``."""
    now = datetime.now(UTC)
    args = json.dumps([n, n])
    return (
        uuid.uuid4(),
        "example.tasks.add",
        "default",
        "default",
        0,
        args,
        "{}",
        "READY",
        now,
        0,
        "[]",
        "[]",
        now,
        "",
        False,
        False,
    )


def _reset(dsn: str, ddl: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ddl)


def _vacuum(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {table}")


def insert_loop(dsn: str, n: int) -> dict[str, float]:
    """Rows per second for single INSERTs, each its own committed transaction."""
    _reset(dsn, CREATE_TASKS)
    placeholders = ", ".join(["%s"] * len(TASK_COLUMNS))
    sql = f"INSERT INTO {TASKS_TABLE} ({', '.join(TASK_COLUMNS)}) VALUES ({placeholders})"
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        for i in range(n):
            conn.execute(sql, _task_row(i))
        seconds = time.perf_counter() - started
    return {"rate": n / seconds, "seconds": seconds}


def copy_bulk(dsn: str, n: int) -> dict[str, float]:
    """Rows per second for one COPY of ``n`` rows, row building included."""
    _reset(dsn, CREATE_TASKS)
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        with (
            conn.cursor() as cursor,
            cursor.copy(f"COPY {TASKS_TABLE} ({', '.join(TASK_COLUMNS)}) FROM STDIN") as copy,
        ):
            for i in range(n):
                copy.write_row(_task_row(i))
        conn.commit()
        seconds = time.perf_counter() - started
    return {"rate": n / seconds, "seconds": seconds}


def _claim_worker(dsn: str, batch: int, barrier: Barrier) -> None:
    """Claim, run and complete batches until nothing is left (one process)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        while True:
            rows = conn.execute(CLAIM, (batch,)).fetchall()
            if not rows:
                return
            ids = [row[0] for row in rows]
            results = [json.dumps(payload["a"] + payload["b"]) for _, payload in rows]
            conn.execute(COMPLETE, (ids, results))


def _fill_claim_table(dsn: str, n: int) -> None:
    _reset(dsn, CREATE_CLAIM)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {CLAIM_TABLE} (payload) "
            "SELECT jsonb_build_object('a', g, 'b', g) FROM generate_series(1, %s) AS g",
            (n,),
        )
    _vacuum(dsn, CLAIM_TABLE)


def claim_drain(dsn: str, n: int, processes: int = 2, batch: int = 100) -> dict[str, float]:
    """Tasks per second for a bare claim/complete loop; connections are opened untimed."""
    _fill_claim_table(dsn, n)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes + 1)
    workers = [
        context.Process(target=_claim_worker, args=(dsn, batch, barrier)) for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    if any(worker.exitcode for worker in workers):
        raise RuntimeError("a baseline claim process failed")
    with psycopg.connect(dsn) as conn:
        done = conn.execute(
            f"SELECT count(*) FROM {CLAIM_TABLE} WHERE status = 'SUCCESSFUL' "
            "AND result = to_jsonb((payload->>'a')::int * 2)"
        ).fetchone()
    if not done or done[0] != n:
        raise RuntimeError(f"baseline claim drained {done} of {n} rows")
    return {"rate": n / seconds, "seconds": seconds}


def drop_tables(dsn: str) -> None:
    """Leave the bench database as the task benchmarks expect it."""
    _reset(dsn, f"DROP TABLE IF EXISTS {TASKS_TABLE}; DROP TABLE IF EXISTS {CLAIM_TABLE};")


if __name__ == "__main__":
    from benchenv import PG_DSN

    print("insert", insert_loop(PG_DSN, 2000))
    print("copy", copy_bulk(PG_DSN, 20000))
    print("claim", claim_drain(PG_DSN, 20000))
    drop_tables(PG_DSN)
