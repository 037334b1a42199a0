"""The leader's pruner: one service and one loop, taking turns on the worker's shared
periodic session (a turn per batch), that deletes what the queue no longer needs.

Every round (a third of the visibility timeout) it forgets the rows of dead workers.
Every ``RETENTION["INTERVAL"]`` seconds, and 5 s after it becomes leader, it also
sweeps: finished tasks past their status's retention, lapsed dedup keys, idle circuit
breaker rows, old schedule occurrences, and (with metrics on) per-minute metrics and
flush keys past ``RETENTION_DAYS``. A sweep deletes ``BATCH_SIZE`` rows per transaction
and rests between batches three times as long as the batch took, so it never takes
more than about a quarter of one database session's time from the workers draining
beside it; a backlog left when the round's time is up is taken up again the next round.

On PostgreSQL it also gives a task table that has never been analyzed its first
statistics, once the table holds ``FIRST_STATISTICS_ROWS`` rows (asked every round until
then): a new deployment's first flood otherwise drains with the worker's statements
planned blind until autovacuum comes round, or for good where it is off
(docs/performance.md, "A deep backlog without VACUUM"). Later statistics are
autovacuum's.

A failed batch is logged and the sweep given up for the round; the others go on, and
the service never dies of one bad row or one lost connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError

from ..conf import BackendSettings
from ..db import dialect_for, worker_connection
from ..db.dedup import prune_keys
from ..db.metrics import prune_flush_keys, prune_hours, roll_up_minutes
from ..db.retention import delete_finished, delete_idle_breakers, delete_old_occurrences
from ..db.store import prune_workers
from ..metrics.catalog import ALL_TIME
from .plugins import ServiceContext
from .services import LoopService

logger = logging.getLogger("django_tasks_plus.worker")

# The rest after each batch, as a multiple of the time the batch took: the pruner's
# session is busy at most a quarter of the time, so a drain beside it keeps its pace
# (bench W5) while a million expired rows still go within minutes.
REST_PER_BATCH = 3.0


@dataclass(frozen=True)
class Sweep:
    """One kind of spent row: ``batch(now, limit)`` deletes up to ``limit`` of them in
    one transaction and returns how many."""

    name: str
    batch: Callable[[datetime, int], int]


def sweeps_for(settings: BackendSettings) -> list[Sweep]:
    """What the pruner deletes for this backend, as its settings say."""
    database, alias = settings.database, settings.alias
    retention = settings.retention
    sweeps = [
        Sweep(f"{status} tasks", _finished_tasks(database, alias, status, age))
        for status, age in retention.by_status().items()
    ]
    sweeps.append(Sweep("dedup keys", lambda now, limit: prune_keys(database, alias, now)))
    if retention.breakers is not None:
        idle = retention.breakers
        sweeps.append(
            Sweep(
                "breaker rows",
                lambda now, limit: delete_idle_breakers(database, alias, now - idle, limit),
            )
        )
    if retention.schedule_occurrences is not None:
        kept = retention.schedule_occurrences
        sweeps.append(
            Sweep(
                "schedule occurrences",
                lambda now, limit: delete_old_occurrences(database, alias, now - kept, limit),
            )
        )
    if settings.metrics.enabled:
        minutes, hours = settings.metrics.retention, settings.metrics.hourly_retention
        sweeps += [
            # Minutes are moved into hourly rows (never deleted uncounted), then old
            # hours deleted.
            Sweep(
                "metric minutes rolled up",
                lambda now, limit: roll_up_minutes(database, alias, now - minutes, ALL_TIME, limit),
            ),
            Sweep(
                "metric hours",
                lambda now, limit: prune_hours(database, alias, now - hours, limit),
            ),
            Sweep(
                "metrics flush keys",
                lambda now, limit: prune_flush_keys(database, alias, now - minutes, limit),
            ),
        ]
    return sweeps


def _finished_tasks(
    database: str, alias: str, status: str, age: timedelta
) -> Callable[[datetime, int], int]:
    def batch(now: datetime, limit: int) -> int:
        return delete_finished(database, alias, status, now - age, limit)

    return batch


FIRST_SWEEP_DELAY = 5.0
"""Seconds from gaining leadership to the first sweep."""

FIRST_STATISTICS_ROWS = 1_000
"""Rows in a never-analyzed task table from which the leader analyzes it."""


class Pruner(LoopService):
    """Leader only: forget dead workers every round, sweep spent rows every interval."""

    name = "tasks-pruner"
    singleton = True
    # Dead workers are forgotten as soon as this worker leads; the first sweep follows
    # FIRST_SWEEP_DELAY later (``start``), so a leader replaced more often than every
    # interval (a fleet redeployed every few minutes) still prunes.
    first_round_at_start = True
    # A sweep takes one turn on the shared periodic session per batch, so the heartbeat
    # and the other services get the session between batches.
    tick_in_one_turn = False

    def __init__(
        self,
        settings: BackendSettings,
        *,
        clock: Callable[[], datetime],
        bound_seconds: float,
        sweeps: list[Sweep] | None = None,
    ) -> None:
        super().__init__(settings.database)
        self.settings = settings
        self.clock = clock
        self.bound_seconds = bound_seconds
        self.interval = max(0.05, bound_seconds / 3)
        self.sweeps = sweeps_for(settings) if sweeps is None else sweeps
        self.batch_size = settings.retention.batch_size
        self.sweep_interval = settings.retention.interval
        self._next_sweep = 0.0  # time.monotonic() of the next sweep; 0: at the first round
        # time.monotonic() from which to ask about the task table's statistics again;
        # None once they are there (or this database keeps none of its own).
        self._statistics_due: float | None = 0.0
        self.deleted: dict[str, int] = {}
        """Rows deleted per sweep since the service was built (for logs and tests)."""

    def start(self) -> None:
        # A new leader sweeps soon, not at once: a fleet redeployed every few minutes
        # still prunes, and a starting worker's first seconds (registering, reaping,
        # its first claims) do not share the database with a burst of deletes.
        self._next_sweep = time.monotonic() + FIRST_SWEEP_DELAY
        self._statistics_due = 0.0  # asked again in each term of leadership
        super().start()

    def tick(self) -> None:
        try:
            with self.turn():
                worker_connection(self.database, self.bound_seconds)
                forgotten = prune_workers(self.database, self.clock())
        except DatabaseError as exc:
            # The turn replaces a broken session; closing it here would drop the
            # leader's lock held on the same session.
            logger.warning("Pruning dead worker rows failed (%s); will retry", exc)
            return
        if forgotten:
            logger.info("Forgot the rows of silent workers: %s.", ", ".join(forgotten))
        if self._statistics_due is not None and time.monotonic() >= self._statistics_due:
            self._first_statistics()
        if time.monotonic() >= self._next_sweep:
            self.sweep(budget=self.interval)

    def _first_statistics(self) -> None:
        """Analyze a never-analyzed task table that has grown (one turn, at most half a
        round, so the heartbeat sharing the session is not held up); a failure is
        tried again an interval later."""
        try:
            with self.turn():
                connection = worker_connection(self.database, self.bound_seconds)
                outcome = dialect_for(connection).gather_first_statistics(
                    connection, FIRST_STATISTICS_ROWS, self.interval / 2
                )
        except DatabaseError as exc:
            logger.warning(
                "Gathering the task table's first statistics failed (%s); will retry in %.0f s.",
                exc,
                self.sweep_interval,
            )
            self._statistics_due = time.monotonic() + self.sweep_interval
            return
        except Exception:
            logger.exception(
                "Gathering the task table's first statistics failed unexpectedly; will "
                "retry in %.0f s.",
                self.sweep_interval,
            )
            self._statistics_due = time.monotonic() + self.sweep_interval
            return
        if outcome == "gathered":
            logger.info(
                "Analyzed the task table: it had no statistics yet (autovacuum had not "
                "analyzed it), so its statements were planned without them."
            )
        elif outcome == "refused":
            logger.warning(
                "The task table has no statistics and this database user may not "
                "ANALYZE it; its statements are planned without them until autovacuum "
                "or its owner analyzes it."
            )
        if outcome != "too few rows":
            self._statistics_due = None

    def sweep(self, budget: float) -> None:
        """Run every sweep until done or ``budget`` seconds have passed. Unfinished
        work is taken up again next round; finished, the next sweep is an interval away.
        A database error ends the round (the next turn replaces a broken session)."""
        deadline = time.monotonic() + budget
        finished = True
        for sweep in self.sweeps:
            outcome = self._drain(sweep, deadline)
            if outcome == "lost connection":
                return
            # A sweep that failed for its own reasons is tried again next interval, not
            # every round (its error would fill the log).
            finished = finished and outcome in ("done", "failed")
            if self.stopping.is_set():
                return
        if finished:
            self._next_sweep = time.monotonic() + self.sweep_interval

    def _drain(self, sweep: Sweep, deadline: float) -> str:
        """Batches of ``sweep`` until one comes back short (``"done"``), the time is up
        or the service stops (``"more"``), or a batch fails (``"failed"``, ``"lost
        connection"``)."""
        now = self.clock()
        while True:
            started = time.monotonic()
            try:
                with self.turn():
                    worker_connection(self.database, self.bound_seconds)
                    deleted = sweep.batch(now, self.batch_size)
            except DatabaseError as exc:
                logger.warning("Pruning %s failed (%s); will retry", sweep.name, exc)
                return "lost connection"
            except Exception:
                logger.exception("Pruning %s failed unexpectedly; will retry", sweep.name)
                return "failed"
            if deleted:
                self.deleted[sweep.name] = self.deleted.get(sweep.name, 0) + deleted
                logger.debug("Pruned %d %s.", deleted, sweep.name)
            if deleted < self.batch_size:
                return "done"
            rest = (time.monotonic() - started) * REST_PER_BATCH
            if time.monotonic() + rest >= deadline or self.stopping.wait(rest):
                return "more"


def pruner_factory(context: ServiceContext) -> Pruner:
    """The pruner's service factory (registered by ``AppConfig.ready``)."""
    return Pruner(context.settings, clock=context.clock, bound_seconds=context.bound_seconds)
