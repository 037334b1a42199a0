"""The worker's metrics services: the flusher on every worker, the pruner on the leader.

The flusher writes what this process counted (``metrics.aggregate``) every
``FLUSH_INTERVAL`` seconds in one upsert, and once more after every other service has
stopped (it is started first, so it stops last and sees the reporter's final outcomes).
The pruner deletes the per-minute rows and the flush keys past ``RETENTION_DAYS`` when
its worker becomes leader and every ``PRUNE_INTERVAL`` seconds after; the all-time totals
stay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from django.db import DatabaseError, connections

from ..conf import BackendSettings
from ..db import worker_connection
from ..db.metrics import prune_flush_keys, prune_metrics
from ..metrics import aggregate
from ..metrics.catalog import ALL_TIME
from .plugins import ServiceContext
from .services import LoopService, Service

logger = logging.getLogger("django_tasks_plus.worker")

# How often the leader prunes: rows expire by the minute, so this only bounds the excess.
PRUNE_INTERVAL = 300.0
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
            connections[self.database].close()
            return
        self.aggregator.flush()


class MetricsPruner(LoopService):
    """The leader: delete the backend's per-minute metrics and flush keys older than the
    retention."""

    name = "tasks-metrics-pruner"
    singleton = True
    # As soon as this worker leads: a leader replaced more often than every interval (a
    # fleet redeployed every few minutes) would otherwise never prune.
    first_round_at_start = True

    def __init__(
        self,
        settings: BackendSettings,
        *,
        clock: Callable[[], datetime],
        bound_seconds: float,
        interval: float = PRUNE_INTERVAL,
    ) -> None:
        super().__init__(settings.database)
        self.settings = settings
        self.clock = clock
        self.bound_seconds = bound_seconds
        self.interval = interval

    def tick(self) -> None:
        try:
            worker_connection(self.database, self.bound_seconds)
            before = self.clock() - self.settings.metrics.retention
            deleted = prune_metrics(self.database, self.settings.alias, before, ALL_TIME)
            prune_flush_keys(self.database, self.settings.alias, before)
        except DatabaseError as exc:
            logger.warning("Pruning old metrics failed (%s); will retry", exc)
            connections[self.database].close()
            return
        if deleted:
            logger.debug("Pruned %d metric rows older than %s.", deleted, before.isoformat())


def metrics_services(
    settings: BackendSettings,
    *,
    clock: Callable[[], datetime],
    bound_seconds: float,
    after: Sequence[Service] = (),
) -> list[Service]:
    """The flusher and the pruner when the backend keeps metrics, else none. Put them
    first: the flusher then stops last, its final flush after ``after`` (the outcome
    writer) has stopped."""
    if not settings.metrics.enabled:
        return []
    return [
        MetricsFlusher(
            settings.database,
            interval=settings.metrics.flush_interval,
            bound_seconds=bound_seconds,
            after=after,
        ),
        MetricsPruner(settings, clock=clock, bound_seconds=bound_seconds),
    ]


def metrics_service_factory(context: ServiceContext) -> list[Service]:
    """The metrics feature's service factory (registered by ``AppConfig.ready``)."""
    return metrics_services(
        context.settings,
        clock=context.clock,
        bound_seconds=context.bound_seconds,
        after=[context.outcome_writer],
    )
