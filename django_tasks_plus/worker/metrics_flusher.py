"""The worker's metrics service: the flusher, on every worker.

The flusher writes what this process counted (``metrics.aggregate``) every
``FLUSH_INTERVAL`` seconds in one upsert, and once more after every other service has
stopped (it is started first, so it stops last and sees the reporter's final outcomes).
The leader's pruner (``pruner.py``) sums the per-minute rows past ``RETENTION_DAYS`` into
hourly rows and deletes the flush keys past it; the all-time totals stay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import DatabaseError, connections

from ..conf import BackendSettings
from ..db import worker_connection
from ..metrics import aggregate
from .plugins import ServiceContext
from .services import LoopService, Service

logger = logging.getLogger("django_tasks_plus.worker")

# How long the last flush waits for the services it follows to stop (the engine's own
# shutdown bound applies to the flusher as to any service).
FINAL_WAIT = 10.0


class MetricsFlusher(LoopService):
    """Every worker: flush the process's counts every ``interval`` seconds and at stop."""

    name = "tasks-metrics-flusher"
    singleton = False

    def __init__(
        self,
        database: str,
        *,
        interval: float,
        bound_seconds: float,
        after: Sequence[Service] = (),
        aggregator: aggregate.Aggregator | None = None,
    ) -> None:
        """``aggregator``: the one to flush (default: the app's)."""
        super().__init__(database)
        self.interval = interval
        self.bound_seconds = bound_seconds
        self.after = tuple(after)
        self.aggregator = aggregator if aggregator is not None else aggregate.aggregator()

    def start(self) -> None:
        self.aggregator.claim()
        try:
            super().start()
        except BaseException:
            self.aggregator.release()
            raise

    def serve(self) -> None:
        try:
            super().serve()
            # The engine asks every service to stop at once: let the outcome writer
            # write (and emit) its last batch before the last flush.
            for service in self.after:
                if service.is_alive():  # never started (a failed start): nothing to wait for
                    service.join(FINAL_WAIT)
            with self.turn():
                self.tick()
        finally:
            self.aggregator.release()
            for database in self.aggregator.databases - {self.database}:
                connections[database].close()

    def tick(self) -> None:
        try:
            worker_connection(self.database, self.bound_seconds)
        except DatabaseError as exc:
            logger.warning("Metrics not flushed: no database connection (%s); will retry", exc)
            return
        self.aggregator.flush()


def metrics_services(
    settings: BackendSettings,
    *,
    bound_seconds: float,
    after: Sequence[Service] = (),
) -> list[Service]:
    """The flusher when the backend keeps metrics, else none. Put it first: the flusher
    then stops last, its final flush after ``after`` (the outcome writer) has stopped."""
    if not settings.metrics.enabled:
        return []
    return [
        MetricsFlusher(
            settings.database,
            interval=settings.metrics.flush_interval,
            bound_seconds=bound_seconds,
            after=after,
        ),
    ]


def metrics_service_factory(context: ServiceContext) -> list[Service]:
    """The metrics feature's service factory (registered by ``AppConfig.ready``)."""
    return metrics_services(
        context.settings,
        bound_seconds=context.bound_seconds,
        after=[context.outcome_writer],
    )
