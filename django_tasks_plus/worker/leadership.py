"""Which worker leads: the per-worker service that bids for, holds and gives up leadership.

Every worker runs one ``LeaderElection``. A follower bids every ``interval`` seconds; the
leader re-checks (PostgreSQL) or renews (table lease) its hold at the same pace. Gaining
leadership starts the singleton services, losing it (or shutting down) stops them. How
leadership is held on each database is in ``db/leadership.py``.

Bids and checks run in turns on the worker's periodic session (``sessions.py``), so on
PostgreSQL the advisory lock lives on that session; the reaction to a change runs after
the turn, since stopping the singletons waits for their own turns to end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

from ..db.leadership import LeaderLock, leader_lock
from .services import ThreadService

logger = logging.getLogger("django_tasks_plus.worker")

# Followers bid at least this often, so a dead leader is replaced within a few seconds on
# PostgreSQL (its lock dies with its session) and within a lease plus this elsewhere.
MAX_ELECTION_INTERVAL = 5.0


class LeaderElection(ThreadService):
    """Holds this worker's bid for the leadership of one backend.

    ``on_change(True)`` is called on this thread when the worker becomes leader,
    ``on_change(False)`` when it stops leading (lost, or at shutdown); ``is_leader`` is
    what was last reported, and ``since`` when it became true (``clock``'s time; None
    while a follower). The heartbeat writes them on the worker's row.
    """

    name = "tasks-leadership"

    def __init__(
        self,
        database: str,
        *,
        backend_name: str,
        worker_id: str,
        lease_seconds: float,
        on_change: Callable[[bool], None],
        lock: LeaderLock | None = None,
        clock: Callable[[], datetime] = timezone.now,
    ) -> None:
        super().__init__(database)
        self.backend_name = backend_name
        self.worker_id = worker_id
        self.interval = min(MAX_ELECTION_INTERVAL, max(0.05, lease_seconds / 3))
        self.on_change = on_change
        self.lock = lock or leader_lock(database, backend_name, worker_id, lease_seconds)
        self.clock = clock
        self.is_leader = False
        self.since: datetime | None = None
        self._failing = False

    def serve(self) -> None:
        try:
            while True:
                with self.turn():
                    leading = self._bid()
                self._set_leader(leading)
                if self.stopping.wait(self.interval):
                    return
        finally:
            with self.turn():
                self.lock.release()
            self._set_leader(False)

    def _bid(self) -> bool:
        try:
            leading = self.lock.try_lead()
        except Exception as exc:  # the database's or the driver's: retried next round
            # Said once per run of failures (a leader's failure means it steps down);
            # then quiet until a check succeeds again.
            level = logging.WARNING if self.is_leader or not self._failing else logging.DEBUG
            self._failing = True
            logger.log(
                level,
                "Leadership check failed (%s: %s); counting as a follower, retrying every %.1f s.",
                type(exc).__name__,
                exc,
                self.interval,
            )
            return False
        self._failing = False
        return leading

    def _set_leader(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.since = self.clock() if leading else None
        self.is_leader = leading
        if leading:
            logger.info(
                "Worker %s is now the leader of backend %r.", self.worker_id, self.backend_name
            )
        else:
            logger.info(
                "Worker %s is no longer the leader of backend %r.",
                self.worker_id,
                self.backend_name,
            )
        try:
            self.on_change(leading)
        except Exception:
            logger.exception("Reacting to a leadership change failed")
