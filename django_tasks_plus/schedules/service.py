"""The scheduler: a leader-only worker service that fires the backend's due schedules.

Registered by ``AppConfig.ready`` in ``extensions.service_factories``; as a singleton it
runs on the elected leader only, and moves with leadership. When it starts it syncs the
schedules declared in code and settings into the table (the leader's version wins during
a rolling deploy), then every tick (``INTERVAL``, at most a second) it fires what is due,
by the database's clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError

from ..conf import BackendSettings
from ..db import worker_connection
from ..worker.plugins import ServiceContext
from ..worker.services import LoopService
from .declared import declared
from .errors import InvalidSchedule
from .store import fire_due, sync

logger = logging.getLogger("django_tasks_plus.schedules")

INTERVAL = 0.5
"""Seconds between ticks: an occurrence is enqueued within this of its time."""


class Scheduler(LoopService):
    name = "tasks-scheduler"
    singleton = True
    first_round_at_start = True
    interval = INTERVAL

    def __init__(
        self,
        settings: BackendSettings,
        *,
        clock: Callable[[], datetime],
        bound_seconds: float,
    ) -> None:
        super().__init__(settings.database)
        self.settings = settings
        self.clock = clock
        self.bound_seconds = bound_seconds
        self.synced = False

    def start(self) -> None:
        self.synced = False  # sync again each time this worker becomes leader
        super().start()

    def tick(self) -> None:
        try:
            worker_connection(self.database, self.bound_seconds)
        except DatabaseError as exc:
            logger.warning("Scheduler: database error (%s); will retry", exc)
            return
        if not self.synced:
            try:
                self.sync()
            except DatabaseError as exc:  # a schedule row kept locked, say: fire what is stored
                logger.warning("Scheduler: schedules not synced (%s); will retry", exc)
        try:
            fire_due(self.settings, self.clock)
        except DatabaseError as exc:
            logger.warning("Scheduler: database error (%s); will retry", exc)

    def sync(self) -> None:
        try:
            definitions = declared(self.settings)
        except InvalidSchedule as exc:  # `manage.py check` names it too; fire what is stored
            logger.error("Schedules not synced: %s", exc)
            self.synced = True
            return
        report = sync(self.settings, definitions, self.clock())
        self.synced = True
        if report.created or report.updated or report.disabled:
            logger.info(
                "Schedules synced: created %s, updated %s, disabled %s",
                list(report.created),
                list(report.updated),
                list(report.disabled),
            )


def scheduler_factory(context: ServiceContext) -> Scheduler:
    """The schedules feature's service factory (registered by ``AppConfig.ready``)."""
    return Scheduler(context.settings, clock=context.clock, bound_seconds=context.bound_seconds)
