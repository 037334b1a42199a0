"""How many PostgreSQL sessions a fleet of worker processes holds (docs/installation.md,
"Connections per worker").

Starts ``--processes`` separate ``runtasks`` processes (``--concurrency`` threads each,
NOTIFY on, no connection pool) against one fresh database and counts its sessions in
``pg_stat_activity`` (this script's own excluded):

    idle      every worker registered, a leader elected, every service run once
    busy      the peak while the fleet drains tasks that each run one short query
    after     once drained: task threads that queried keep their sessions

    python bench/fleet_sessions.py                          # this checkout's code
    python bench/fleet_sessions.py --repo /path/to/other    # another checkout's code

Needs PostgreSQL at 127.0.0.1:5432 (user root, trust); the database (``--database``,
default ``bench_fleet``) is dropped and recreated. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchenv import PG_SERVER, REPO  # noqa: E402
from claim_backlog import env_for, recreate  # noqa: E402

TASKS = "django_tasks_plus_taskrecord"
OTHERS = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def sessions(conn) -> int:  # type: ignore[no-untyped-def]
    return conn.execute(OTHERS).fetchone()[0]


def wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def settled(conn, seconds: float) -> int:  # type: ignore[no-untyped-def]
    """The session count once it has not changed for ``seconds``."""
    last, since = sessions(conn), time.monotonic()
    while time.monotonic() - since < seconds:
        time.sleep(0.2)
        now = sessions(conn)
        if now != last:
            last, since = now, time.monotonic()
    return last


def enqueue_queries(conn, count: int, seconds: float) -> None:  # type: ignore[no-untyped-def]
    conn.execute(
        f"""
        INSERT INTO {TASKS} (id, task_path, backend_name, queue_name, priority, args,
            kwargs, status, run_after, attempt, worker_ids, enqueued_at, errors,
            dead_letter_reason, ordering_blocked, cancel_requested, metadata)
        SELECT gen_random_uuid(), 'benchtasks.queries', 'default', 'default', 0,
            jsonb_build_array(%s::float), '{{}}', 'READY', now(), 0, '[]', now(), '[]', '',
            false, false, '{{}}'
        FROM generate_series(1, %s)
        """,
        [seconds, count],
    )
    conn.execute("NOTIFY django_tasks_plus, 'default'")


def run(args: argparse.Namespace) -> dict[str, object]:
    import psycopg

    repo = Path(args.repo).resolve()
    env = {**env_for(repo, args.database), "TASKS_METRICS": "true"}
    recreate(args.database)
    manage = [sys.executable, str(repo / "testproject" / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True)
    command = [*manage, "runtasks", "-v", "0", "--queue", "default"]
    command += ["--concurrency", str(args.concurrency), "--visibility-timeout", "6"]
    workers = [
        subprocess.Popen(
            [*command, "--worker-id", f"fleet-{n}"], env=env, stdout=subprocess.DEVNULL
        )
        for n in range(args.processes)
    ]
    figures: dict[str, object] = {"processes": args.processes, "concurrency": args.concurrency}
    try:
        with psycopg.connect(f"{PG_SERVER}/{args.database}", autocommit=True) as conn:
            registered = "SELECT count(*) FROM django_tasks_plus_workerrecord"
            wait(lambda: conn.execute(registered).fetchone()[0] == args.processes, 300, "workers")
            # Every periodic service has run (the metrics flusher's interval is 10 s).
            time.sleep(12)
            figures["idle"] = settled(conn, 5)
            enqueue_queries(conn, args.processes * args.concurrency * 4, 0.2)
            peak = 0
            done = f"SELECT count(*) FROM {TASKS} WHERE status = 'SUCCESSFUL'"
            total = args.processes * args.concurrency * 4
            deadline = time.monotonic() + 600
            while conn.execute(done).fetchone()[0] < total and time.monotonic() < deadline:
                peak = max(peak, sessions(conn))
                time.sleep(0.05)
            figures["busy_peak"] = peak
            figures["after"] = settled(conn, 3)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(REPO), help="checkout whose code runs")
    parser.add_argument("--database", default=os.environ.get("BENCH_DATABASE", "bench_fleet"))
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    print(json.dumps(run(parser.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
