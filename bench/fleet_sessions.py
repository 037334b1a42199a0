"""How many PostgreSQL sessions a fleet of worker processes holds (docs/installation.md,
"Connections per worker").

Starts ``--processes`` separate ``runtasks`` processes (``--concurrency`` threads each,
NOTIFY on; no connection pool, or with ``--pool-size N`` Django's, ``max_size`` N per
process) against one fresh database and counts its sessions in ``pg_stat_activity``
(this script's own excluded):

    idle      every worker registered, a leader elected, every service run once
    busy      the peak while the fleet drains tasks (``--task``: ``stamp`` does not
              query; ``queries`` runs one short query per task, so every task thread
              that ran one holds a session: needs ``max_connections`` of at least
              processes x (3 + concurrency), or it starves every other client)
    after     once drained

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

from benchenv import PG_SERVER, REPO, recreate_database  # noqa: E402
from claim_backlog import env_for  # noqa: E402

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


def enqueue(conn, task: str, count: int) -> None:  # type: ignore[no-untyped-def]
    """``count`` READY tasks in one INSERT, then a wake-up for the listeners."""
    argument = "jsonb_build_array(0.2)" if task == "queries" else "jsonb_build_array(0)"
    conn.execute(
        f"""
        INSERT INTO {TASKS} (id, task_path, backend_name, queue_name, priority, args,
            kwargs, status, run_after, attempt, worker_ids, enqueued_at, errors,
            dead_letter_reason, ordering_blocked, cancel_requested, metadata)
        SELECT gen_random_uuid(), %s, 'default', 'default', 0,
            {argument}, '{{}}', 'READY', now(), 0, '[]', now(), '[]', '',
            false, false, '{{}}'
        FROM generate_series(1, %s)
        """,
        [f"benchtasks.{task}", count],
    )
    conn.execute("NOTIFY django_tasks_plus, 'default'")


def run(args: argparse.Namespace) -> dict[str, object]:
    import psycopg

    repo = Path(args.repo).resolve()
    env = {**env_for(repo, args.database), "TASKS_METRICS": "true"}
    if args.pool_size:
        env.update(DTP_DB_POOL="true", DTP_DB_POOL_MAX_SIZE=str(args.pool_size))
    recreate_database(args.database)
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
    figures: dict[str, object] = {
        "processes": args.processes,
        "concurrency": args.concurrency,
        "task": args.task,
        "pool_size": args.pool_size,
    }
    try:
        with psycopg.connect(f"{PG_SERVER}/{args.database}", autocommit=True) as conn:
            registered = "SELECT count(*) FROM django_tasks_plus_workerrecord"
            wait(lambda: conn.execute(registered).fetchone()[0] == args.processes, 300, "workers")
            # Every periodic service has run (the metrics flusher's interval is 10 s).
            time.sleep(12)
            figures["idle"] = settled(conn, 5)
            total = args.processes * args.concurrency * (4 if args.task == "queries" else 200)
            enqueue(conn, args.task, total)
            peak = 0
            done = f"SELECT count(*) FROM {TASKS} WHERE status = 'SUCCESSFUL'"
            deadline = time.monotonic() + 600
            while conn.execute(done).fetchone()[0] < total and time.monotonic() < deadline:
                peak = max(peak, sessions(conn))
                if peak > args.max_sessions:  # leave the server's other clients room
                    figures["aborted"] = f"more than {args.max_sessions} sessions"
                    break
                time.sleep(0.05)
            figures["busy_peak"] = peak
            figures["finished"] = conn.execute(done).fetchone()[0]
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the fleet on the way out
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(REPO), help="checkout whose code runs")
    parser.add_argument("--database", default=os.environ.get("BENCH_DATABASE", "bench_fleet"))
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--task", choices=["stamp", "queries"], default="stamp")
    parser.add_argument(
        "--pool-size",
        type=int,
        default=0,
        help="put each process's task threads behind Django's pool of this max_size (0: none)",
    )
    parser.add_argument(
        "--max-sessions", type=int, default=80, help="stop the fleet early past this many"
    )
    print(json.dumps(run(parser.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
