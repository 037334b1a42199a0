"""The worker's background upkeep: renew leases, prove liveness (inserting the worker's
row again if it was deleted meanwhile), return expired leases. (The leader's pruner,
``pruner.py``, forgets the rows of workers that died.)"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ..db import worker_connection
from ..db.store import WorkerStatus, heartbeat_worker, renew_leases
from ..liveness import STALE_WORKER_FACTOR
from .reaper import reap_expired
from .services import LoopService

if TYPE_CHECKING:
    from ..backend import DatabaseBackend

logger = logging.getLogger("django_tasks_plus.worker")

Lease = tuple[str, str]
"""A held lease: (task id, lease token). A task can be claimed again after its lease was
lost, so the id alone does not name one attempt."""


class Heartbeat(LoopService):
    """Every ``interval`` seconds: renew in-flight leases in one statement, touch the
    worker row (``register`` writes it again if the leader deleted it while this process
    was paused), and reap leases that other (dead) workers let expire. The touch also
    writes ``status()`` (attempts processed and failed, leadership) in the same UPDATE.

    Renewal comes first in each round, so after a stall (a locked table, a paused
    process) this worker's own live leases are extended before any reaping is done.
    Reaping runs on every worker, not only the leader: it is safe concurrently (each
    reap is fenced by the lease token) and a dead worker's tasks then come back within
    one heartbeat of a surviving worker, even while leadership is changing hands.
    """

    name = "tasks-heartbeat"

    def __init__(
        self,
        backend: DatabaseBackend,
        *,
        worker_id: str,
        register: Callable[[datetime], None],
        leases: Callable[[], Iterable[Lease]],
        on_lost: Callable[[set[Lease]], None],
        clock: Callable[[], datetime],
        visibility_timeout: float,
        sync_clock: Callable[[], None] | None = None,
        status: Callable[[], WorkerStatus] | None = None,
    ) -> None:
        super().__init__(backend.settings.database)
        self.backend = backend
        self.worker_id = worker_id
        self.register = register
        self.leases = leases
        self.on_lost = on_lost
        self.clock = clock
        self.sync_clock = sync_clock
        self.status = status
        self.visibility_timeout = visibility_timeout
        self.interval = max(0.05, visibility_timeout / 3)

    def tick(self) -> None:
        self.beat()

    def beat(self) -> None:
        """One round of upkeep. Each part's failure is logged and retried next round; a
        touch that fails (a session keeps the worker's row locked, say) does not keep
        the round from reaping, and the renewal it follows has already run."""
        if not _attempted("Heartbeat", self.renew):
            return
        _attempted("The heartbeat's touch of the worker row", self.touch)
        _attempted("Reaping expired leases", lambda: reap_expired(self.backend, self.clock))

    def renew(self) -> None:
        """Extend this worker's leases (reporting those lost) and read the clock."""
        worker_connection(self.database, self.visibility_timeout)
        lost = renew_leases(self.database, self.leases(), self.visibility_timeout)
        if lost:
            self.on_lost(lost)
        if self.sync_clock is not None:
            self.sync_clock()

    def touch(self) -> None:
        """Prove liveness on the worker's row, writing it again if it is gone."""
        now = self.clock()
        status = self.status() if self.status is not None else None
        if not heartbeat_worker(self.database, self.worker_id, now, status):
            self.register(now)
            logger.warning(
                "Worker %s found its row gone (deleted after a silence longer than %d "
                "visibility timeouts: was the process paused?); registered it again.",
                self.worker_id,
                STALE_WORKER_FACTOR,
            )


def _attempted(what: str, step: Callable[[], object]) -> bool:
    """Run one part of a round; log its failure (the next round tries again)."""
    try:
        step()
    except DatabaseError as exc:
        logger.warning("%s failed (%s); will retry", what, exc)
        return False
    except Exception:
        logger.exception("%s failed unexpectedly; will retry", what)
        return False
    return True
