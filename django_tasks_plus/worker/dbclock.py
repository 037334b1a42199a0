"""The worker's clock: the host's clock, corrected to the database's.

Leases and due times are decided in SQL by the database's clock. The times a worker
computes itself (when an attempt started and finished, when a retry or a deferral is
due) use this clock, so that a host whose clock runs fast or slow still writes times on
the database's scale: a retry's backoff means the same on every host.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connections

from ..db import dialect_for

logger = logging.getLogger("django_tasks_plus.worker")

# Hosts kept in step by NTP agree within milliseconds, less than the error of measuring
# the offset over a round trip: below this the host's clock is used as it is, so that a
# retry due "now" is never written a hair after the database's now.
NOTEWORTHY_SKEW = timedelta(seconds=1)


class DatabaseClock:
    """Callable like ``timezone.now``; ``sync()`` measures the offset to the database
    (and ignores one smaller than ``NOTEWORTHY_SKEW``)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.offset = timedelta(0)
        # ``timezone.now()`` reads ``settings.USE_TZ`` through the lazy settings object on
        # every call (two per attempt); the worker reads it once, as it does its options.
        self._zone = UTC if settings.USE_TZ else None

    def __call__(self) -> datetime:
        # Read twice an attempt: an offset below NOTEWORTHY_SKEW is zero, and adding a zero
        # timedelta (a new datetime) is skipped.
        now = self._host_now()
        return now + self.offset if self.offset else now

    def _host_now(self) -> datetime:
        """The host's time as ``timezone.now()`` gives it, read through ``time.time()``:
        what ``bench/skewed_clock.py`` shifts to play a host with a wrong clock."""
        return datetime.fromtimestamp(time.time(), self._zone)

    def sync(self) -> None:
        """Measure the database's clock against this host's, on this thread's connection.

        The database's reading is taken to belong to the middle of the round trip.
        """
        connection = connections[self.database]
        before = self._host_now()
        database_now = dialect_for(connection).current_time(connection)
        after = self._host_now()
        offset = database_now - (before + (after - before) / 2)
        if abs(offset) < NOTEWORTHY_SKEW:
            offset = timedelta(0)
        elif abs(offset - self.offset) >= NOTEWORTHY_SKEW:
            logger.warning(
                "This host's clock is %.1f s %s the database's; the worker uses the "
                "database's time.",
                abs(offset.total_seconds()),
                "behind" if offset > timedelta(0) else "ahead of",
            )
        self.offset = offset
