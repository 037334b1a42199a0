"""The worker's background upkeep: renew leases, prove liveness (inserting the worker's
row again if it was deleted meanwhile), return expired leases. (The leader's pruner,
``pruner.py``, forgets the rows of workers that died.)"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ..db import worker_connection
from ..db.store import WorkerStatus, heartbeat_worker, renew_leases
from ..lifecycle import Lease
from ..liveness import STALE_WORKER_FACTOR
from .reaper import reap_expired
from .reapgate import MAX_DEFERRAL, ReapGate, Verdict
from .services import LoopService

if TYPE_CHECKING:
    from ..backend import DatabaseBackend

logger = logging.getLogger("django_tasks_plus.worker")


class Heartbeat(LoopService):
    """Every ``interval`` seconds: renew in-flight leases in one statement, touch the
    worker row (``register`` writes it again if the leader deleted it while this process
    was paused), and reap leases that other (dead) workers let expire. The touch also
    writes ``status()`` (attempts processed and failed, leadership) in the same UPDATE.

    Renewal comes first in each round, so after a stall (a locked table, a paused
    process) this worker's own live leases are extended before any reaping is done; and
    a round that finds this worker held up (late, or a step slow or failed) leaves the
    other workers' leases alone for one visibility timeout, in which their renewals,
    held up by the same stall, land (``reapgate``). A worker never reaps the leases it
    holds (``holding``: the running ones and those whose outcomes are being written),
    expired or not. Reaping runs on every worker, not
    only the leader: it is safe concurrently (each reap is fenced by the lease token)
    and a dead worker's tasks then come back within one heartbeat of a surviving
    worker, even while leadership is changing hands.
    """

    name = "tasks-heartbeat"

    def __init__(
        self,
        backend: DatabaseBackend,
        *,
        worker_id: str,
        register: Callable[[datetime], None],
        leases: Callable[[], Iterable[Lease]],
        holding: Callable[[], Collection[Lease]] = frozenset,
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
        self.holding = holding
        self.on_lost = on_lost
        self.clock = clock
        self.sync_clock = sync_clock
        self.status = status
        self.visibility_timeout = visibility_timeout
        self.interval = heartbeat_interval(visibility_timeout)
        self.gate = ReapGate(visibility_timeout, self.interval)
        self._deferral_told = False

    def start(self) -> None:
        # The first round's lateness counts from here: one that waited through a stall
        # (for its turn on the session, say) knows it was held up, as later rounds do.
        self.gate.began(time.monotonic())
        super().start()

    def tick(self) -> None:
        self.beat()

    def beat(self) -> None:
        """One round of upkeep. Each part's failure is logged and retried next round; a
        touch that fails (a session keeps the worker's row locked, say) does not keep
        the round from reaping, and the renewal it follows has already run."""
        self.gate.round_started(time.monotonic())
        try:
            if not self._step("Heartbeat", self.renew):
                return
            # A touch refused its own row (a session keeps it locked) is no stall of the
            # others: only its wait counts.
            self._step("The heartbeat's touch of the worker row", self.touch, failure_counts=False)
            self._reap()
        finally:
            self.gate.round_ended(time.monotonic())

    def _step(self, what: str, step: Callable[[], object], *, failure_counts: bool = True) -> bool:
        """``_attempted``, timed for the gate: a slow step is a stall, and so is a failed
        one (a lost connection, a statement given up) unless ``failure_counts`` is off."""
        started = time.monotonic()
        succeeded = _attempted(what, step)
        self.gate.step(started, time.monotonic(), succeeded=succeeded or not failure_counts)
        return succeeded

    def _reap(self) -> None:
        """Return other workers' expired leases, unless this worker was held up lately."""
        verdict = self.gate.verdict(time.monotonic())
        if verdict is Verdict.DEFER:
            if not self._deferral_told:
                self._deferral_told = True
                logger.info(
                    "Worker %s was held up (paused, or its statements waited); it returns "
                    "other workers' expired leases again %.0f s after that ended, once "
                    "their heartbeats have had the time to renew them.",
                    self.worker_id,
                    self.visibility_timeout,
                )
            return
        if verdict is Verdict.REAP_DESPITE_STALLS and self._deferral_told:
            logger.warning(
                "Worker %s: every heartbeat for %.0f s was held up; returning expired "
                "leases anyway, so a dead worker's tasks are not kept forever.",
                self.worker_id,
                self.visibility_timeout * MAX_DEFERRAL,
            )
        self._deferral_told = False
        still_prompt = self._prompt_since(
            time.monotonic(), despite_stalls=verdict is Verdict.REAP_DESPITE_STALLS
        )
        # Timed like the other steps: a read of the expired leases that gave up (a lock
        # timeout behind a table lock) held up the holders' renewals as well.
        self._step(
            "Reaping expired leases",
            lambda: reap_expired(
                self.backend, self.clock, still_prompt=still_prompt, spare=self.holding()
            ),
        )

    def reap_at_start(self, starting: float) -> None:
        """Return expired leases before the first claim (it matters for ``--burst``),
        unless the worker's start, since ``starting``, took longer than the slack: a
        stall that held the start up held the holders' renewals up too, so the gate then
        defers this heartbeat's reaping as well, until they have had a lease's time."""
        still_prompt = self._prompt_since(starting, despite_stalls=False)
        if not still_prompt():  # told the gate, expired leases or not
            return
        reap_expired(self.backend, self.clock, still_prompt=still_prompt, spare=self.holding())

    def _prompt_since(self, since: float, *, despite_stalls: bool) -> Callable[[], bool]:
        """``reap_expired``'s question once it has read the expired leases: were they read
        within the slack of ``since``? If not, the read (or the start) waited, and so did
        the holders' renewals: the gate hears of it, and the expired leases are settled
        only if the gate had already given up deferring (``despite_stalls``)."""

        def still_prompt() -> bool:
            if time.monotonic() - since <= self.gate.slack:
                return True
            self.gate.held_up(time.monotonic())
            return despite_stalls

        return still_prompt

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


def heartbeat_interval(visibility_timeout: float) -> float:
    """Seconds between heartbeat rounds: three renewals per lease."""
    return max(0.05, visibility_timeout / 3)


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
