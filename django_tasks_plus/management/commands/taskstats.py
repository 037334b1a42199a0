"""``manage.py taskstats``: the queues, rates, latencies, workers and breakers of a backend
in the terminal, once or every few seconds (``--watch``), as text or JSON.

Built on the metrics query API (``django_tasks_plus.metrics``) and
``circuits.breaker_states``, which Python code can call as well.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from ... import metrics
from ...circuits import breaker_states
from ...compat import DEFAULT_TASK_BACKEND_ALIAS
from ...waiting import Capped, Reason
from ..base import BackendCommand
from .breakers import status_json

WINDOW = timedelta(hours=1)
# READY tasks per queue by what they wait for, in the table's order (``waiting.Reason``).
REASONS = (Reason.DUE, Reason.BLOCKED, Reason.HELD, Reason.RETRYING, Reason.SCHEDULED)
# Shown per queue, per minute over the window.
RATE_NAMES = ("enqueued", "succeeded", "attempt_failed", "retried", "dead_lettered")
CLEAR = "\x1b[H\x1b[2J"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def snapshot(backend: str, *, now: datetime | None = None) -> dict[str, Any]:
    """Everything ``taskstats`` shows, as JSON-ready data (times in ISO 8601)."""
    now = now or timezone.now()
    minutes = WINDOW.total_seconds() / 60
    per_queue: dict[str, dict[str, int]] = {}
    for total in metrics.totals(backend, WINDOW, now=now):
        counts = per_queue.setdefault(total.queue, {})
        counts[total.name] = counts.get(total.name, 0) + total.value
    queues = []
    for queue in metrics.queue_waiting(backend, now=now):
        counts = per_queue.get(queue.queue, {})
        queues.append(
            {
                "queue": queue.queue,
                # READY tasks that could run now: due, not held, not blocked.
                "ready": queue.waiting[Reason.DUE].count,
                **{reason.value: queue.waiting[reason].count for reason in REASONS[1:]},
                # The counts read at most a cap of rows: these are bounds, not exact.
                "at_least": [r.value for r in REASONS if queue.waiting[r].at_least],
                "at_most": [r.value for r in REASONS if queue.waiting[r].at_most],
                "running": queue.running,
                "dead": queue.dead,
                "oldest_ready_age": queue.oldest_runnable_age,
                "per_minute": {name: counts.get(name, 0) / minutes for name in RATE_NAMES},
            }
        )
    workers = metrics.workers(backend, now=now)
    return {
        "backend": backend,
        "at": now.isoformat(),
        "window_seconds": int(WINDOW.total_seconds()),
        "queues": queues,
        "dead": sum(queue["dead"] for queue in queues),
        "counts": metrics.counter_totals(backend, WINDOW, now=now),
        "latency": {
            kind: {
                f"p{round(q * 100)}": value
                for q, value in metrics.percentiles(backend, kind, WINDOW, now=now).items()
            }
            for kind in metrics.HISTOGRAM_NAMES
        },
        "workers": {
            "alive": sum(1 for worker in workers if worker.alive),
            "stale": sum(1 for worker in workers if not worker.alive),
            "list": [
                {
                    "worker_id": worker.worker_id,
                    "hostname": worker.hostname,
                    "pid": worker.pid,
                    "queues": list(worker.queues),
                    "concurrency": worker.concurrency,
                    "started_at": worker.started_at.isoformat(),
                    "last_heartbeat_at": worker.last_heartbeat_at.isoformat(),
                    "alive": worker.alive,
                }
                for worker in workers
            ],
        },
        "breakers": [status_json(status) for status in breaker_states(backend)],
    }


def _waiting(queue: dict[str, Any], reason: Reason) -> str:
    """One reason's count of a ``snapshot`` queue, "10,000+" when it is a lower bound."""
    key = "ready" if reason is Reason.DUE else reason.value
    bounds = reason.value in queue["at_least"], reason.value in queue.get("at_most", ())
    return str(Capped(queue[key], *bounds))


def _table(headings: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headings, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (headings, *rows)
    ]


def render_text(stats: dict[str, Any]) -> list[str]:
    """The text form of a ``snapshot``."""
    at = datetime.fromisoformat(stats["at"]).isoformat(sep=" ", timespec="seconds")
    lines = [f"Backend {stats['backend']!r} at {at}; rates per minute over the last hour."]
    rows = [
        [
            queue["queue"],
            *(_waiting(queue, reason) for reason in REASONS),
            str(queue["running"]),
            str(queue["dead"]),
            _seconds(queue["oldest_ready_age"]),
            *(f"{queue['per_minute'][name]:.1f}" for name in RATE_NAMES),
        ]
        for queue in stats["queues"]
    ]
    headings = ["QUEUE", "READY", "BLOCKED", "HELD", "RETRYING", "SCHEDULED"]
    headings += ["RUNNING", "DEAD", "OLDEST READY"]
    headings += [f"{name.upper().replace('_', ' ')}/MIN" for name in RATE_NAMES]
    lines += ["", *_table(headings, rows)]
    lines += [
        "READY: due, not held, not blocked; OLDEST READY: the longest wait among them. "
        "A count read past its cap shows N+."
    ]
    latency = stats["latency"]
    lines += [
        "",
        f"Wait  p50 {_seconds(latency['wait']['p50'])}  p95 {_seconds(latency['wait']['p95'])}"
        "   (from due to start)",
        f"Run   p50 {_seconds(latency['run']['p50'])}  p95 {_seconds(latency['run']['p95'])}",
        f"Dead  {stats['dead']} task(s) FAILED",
    ]
    workers = stats["workers"]
    lines += ["", f"Workers: {workers['alive']} alive, {workers['stale']} stale"]
    if workers["list"]:
        lines += _table(
            ["WORKER", "HOST", "PID", "QUEUES", "CONCURRENCY", "LAST HEARTBEAT", "STATE"],
            [
                [
                    w["worker_id"],
                    w["hostname"],
                    str(w["pid"]),
                    ",".join(w["queues"]),
                    str(w["concurrency"]),
                    datetime.fromisoformat(w["last_heartbeat_at"]).isoformat(
                        sep=" ", timespec="seconds"
                    ),
                    "alive" if w["alive"] else "stale",
                ]
                for w in workers["list"]
            ],
        )
    breakers = stats["breakers"]
    lines += ["", f"Breakers: {len(breakers)} stored circuit(s)"]
    if breakers:
        lines += _table(
            ["BREAKER", "KEY", "STATE", "FAILURES", "HELD"],
            [
                [b["name"], b["key"], b["state"], str(b["failures"]), str(b["held"])]
                for b in breakers
            ],
        )
    return lines


class Command(BackendCommand):
    needed_by = "manage.py taskstats"
    help = (
        "Show the queues (READY, scheduled, RUNNING, dead), rates and latency percentiles "
        "over the last hour, workers and circuit breakers of a django-tasks-plus backend."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="TASKS alias.")
        parser.add_argument(
            "--watch",
            nargs="?",
            const=2.0,
            type=float,
            metavar="SECONDS",
            help="Refresh every SECONDS (default 2) until interrupted.",
        )
        parser.add_argument(
            "--count", type=int, help="With --watch: stop after this many refreshes."
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print JSON (one object; with --watch one object per line).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = self._backend(options["backend"]).alias
        watch = options["watch"]
        count = options["count"]
        if watch is not None and not 0 < watch < float("inf"):
            raise CommandError(f"--watch must be a positive number of seconds, got {watch!r}.")
        if count is not None and count < 1:
            raise CommandError(f"--count must be a whole number of at least 1, got {count!r}.")
        as_json = options["json"]
        shown = 0
        try:
            while True:
                stats = snapshot(backend)
                if as_json:
                    self.stdout.write(json.dumps(stats, indent=None if watch else 2))
                else:
                    if watch is not None and self.stdout.isatty():
                        self.stdout.write(CLEAR, ending="")
                    elif shown:
                        self.stdout.write("")
                    self.stdout.write("\n".join(render_text(stats)))
                self.stdout.flush()
                shown += 1
                if watch is None or (count is not None and shown >= count):
                    return
                time.sleep(watch)
        except DatabaseError as exc:
            raise CommandError(f"The database refused: {exc}") from exc
        except KeyboardInterrupt:
            return
