"""How an idle worker learns there is work: NOTIFY on PostgreSQL, adaptive polling elsewhere."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from ..db.base import NOTIFY_CHANNEL
from ..db.dedicated import dedicated_connection
from .services import ThreadService

logger = logging.getLogger("django_tasks_plus.worker")

# How often a waiting listener looks at its stop flag: waking is a local select() call.
STOP_CHECK = 0.2
MIN_POLL = 0.02
GROWTH = 1.5  # gentle: a queue fed every few tens of ms should not drift to long waits


class PollBackoff:
    """Wait briefly after work was found, growing up to ``maximum`` while there is none.

    Keeps a busy queue's latency low without hammering the database when it is idle.
    """

    def __init__(self, maximum: float, minimum: float = MIN_POLL) -> None:
        self.minimum = min(minimum, maximum)
        self.maximum = maximum
        self.current = self.minimum / GROWTH  # the first next() returns the minimum

    def reset(self) -> None:
        """Work was found: the next wait is the shortest."""
        self.current = self.minimum / GROWTH

    def next(self) -> float:
        """The wait before the next poll: a little longer than the last, up to the maximum."""
        self.current = min(self.maximum, max(self.minimum, self.current * GROWTH))
        return self.current


class NotifyListener(ThreadService):
    """Holds a LISTEN connection and sets ``wakeup`` when one of ``queues`` gets a task.

    It has its own psycopg connection (not Django's, which is thread-bound), reconnects
    after failures, and stops within ``STOP_CHECK`` seconds of ``stop()`` (a --burst
    run, or a test running the worker in-process, waits for that at exit).
    """

    name = "tasks-notify-listener"

    def __init__(self, database: str, queues: Iterable[str], wakeup: threading.Event) -> None:
        super().__init__(database)
        self.queues = frozenset(queues)
        self.wakeup = wakeup
        self.connected = threading.Event()

    def _connect(self):
        conn = dedicated_connection(self.database)
        conn.execute(f'LISTEN "{NOTIFY_CHANNEL}"')
        return conn

    def serve(self) -> None:
        delay = 0.5
        while not self.stopping.is_set():
            try:
                conn = self._connect()
            except Exception as exc:
                logger.warning("LISTEN connection failed (%s); retrying in %.1f s", exc, delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, 10.0)
                continue
            delay = 0.5
            self.connected.set()
            # A notification may have been missed while disconnected: look once.
            self.wakeup.set()
            try:
                with conn:
                    while not self.stopping.is_set():
                        for notify in conn.notifies(timeout=STOP_CHECK):
                            if notify.payload in self.queues:
                                self.wakeup.set()
            except Exception as exc:
                if not self.stopping.is_set():
                    logger.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                self.connected.clear()
