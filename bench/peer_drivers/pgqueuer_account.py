"""pgqueuer's side of ``account.py`` (run in ``.venv-peer-pgqueuer``), one step per call.

    python pgqueuer_account.py {setup,single,fill} [--tasks N]

The same API as ``pgqueuer_driver.py``: ``Queries.enqueue("add", payload)`` per job over
one asyncpg connection, timed by the loop that times ours (``cpuaccount``); ``fill``
queues a batch that ``account.py`` drains with ``pgqueuer_worker.py`` processes.
"""

from __future__ import annotations

import argparse
import json

import asyncpg
import peerkit
import pgqueuer_driver
from cpuaccount import single_enqueues
from pgqueuer import Queries
from pgqueuer_tasks import DSN


def single(args: argparse.Namespace) -> dict[str, object]:
    pgqueuer_driver.reset()
    loop = peerkit.Loop()
    connection = loop.run(asyncpg.connect(DSN))
    try:
        queries = Queries.from_asyncpg_connection(connection)
        backend = loop.run(connection.fetchval("SELECT pg_backend_pid()"))
        return single_enqueues(
            lambda i: loop.run(queries.enqueue("add", pgqueuer_driver._payload(i))),
            args.tasks,
            backend,
        )
    finally:
        loop.run(connection.close())
        loop.close()


def fill(args: argparse.Namespace) -> dict[str, object]:
    pgqueuer_driver.reset()
    with pgqueuer_driver.client() as (run, queries):
        pgqueuer_driver._batch(run, queries, args.tasks)
    pgqueuer_driver.sql("VACUUM ANALYZE pgqueuer")
    return {"queued": args.tasks}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="pgqueuer's side of account.py.")
    parser.add_argument("step", choices=("setup", "single", "fill"))
    parser.add_argument("--tasks", type=int, default=2_000)
    options = parser.parse_args()
    steps = {"setup": pgqueuer_driver.setup, "single": single, "fill": fill}
    print(json.dumps(steps[options.step](options)))
