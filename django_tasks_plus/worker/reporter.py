"""The worker's single writer of attempt outcomes: group commit for the task threads.

Task threads hand their outcome to the reporter and move on; the reporter writes
whatever has accumulated in one transaction. Under load many outcomes share one commit;
when idle a lone outcome is written at once, so latency stays low. Each outcome comes
with a callback, called on this thread once the batch is written with whether its row
landed (False when the lease was lost or the write failed); ``after_batch`` runs after
each batch's callbacks, so follow-up work can be handed on once per batch. A row the
database refuses is settled alone (dead-lettered with ``OutcomeNotStorable``), and a
callback that raises is logged with its task's id: nothing one task holds can end this
thread.

A row another session holds locked (task code's or an operator's open transaction) is
skipped by the write after a short wait at most (``Dialect.write_outcomes``): its
outcome is set aside and written again shortly, alone or with later outcomes, until it
lands, its lease is found gone, or ``persist_deadline`` passes (then its lease expires
and the task is retried). So one locked row never holds up the outcomes behind it, nor
the claims that share the session.

A batch the database cannot take at all (it is gone, or a table lock stalls it) is
tried again, with pauses, for ``persist_deadline``; past it, for as long as the batch's
leases cannot be renewed either, so an outage or a stall longer than a lease does not
drop the outcomes of tasks that ran (``_stalled_for_all``). Once the worker is stopping,
the deadline holds.

Each write is one turn on ``session``, the session the worker's claim loop takes turns
on too (``sessions.py``): the two latency-critical writers share one session, and no
periodic duty ever stands between them and it. Callbacks and retry pauses run between
turns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError, connections

from .. import events
from ..db import worker_connection
from ..db.completions import apply_transitions
from ..db.store import leases_still_held, renew_leases
from ..db.unpooled import outside_the_pool
from ..lifecycle import ClaimedTask, Transition, unstorable_outcome
from .sessions import SharedSession

logger = logging.getLogger("django_tasks_plus.worker")

MAX_BATCH = 500
_STOP = object()

# Pauses before an outcome whose row was locked is written again: short at first (the
# lock is usually a moment's, such as a lease renewal's), then up to a second apart.
FIRST_RETRY_PAUSE = 0.05
LAST_RETRY_PAUSE = 1.0


Written = Callable[[bool], None]
"""Called with whether the outcome's row landed; must be quick, and should not raise (if
it does, the error is logged with the task's id and the reporter goes on)."""

# A lost connection (or a statement bounded by the worker's timeouts): worth retrying
# the whole batch. Anything else is about the batch's content: find the row it is in.
_TRANSIENT = (OperationalError, InterfaceError)


@dataclass(eq=False)
class _Submitted:
    """One outcome waiting to be written, and whether its submitter has been told."""

    claimed: ClaimedTask
    outcome: Transition
    written: Written
    settled: bool = False
    # Set when a write first skipped its locked row: the monotonic time to land by.
    give_up_at: float | None = None
    # While set aside (parked): when to write it again, after a pause that doubles.
    parked: bool = False
    due_at: float = 0.0
    pause: float = 0.0

    def settle(self, landed: bool) -> None:
        """Tell the submitter once whether the row landed, never raising: one task's
        follow-up (its log line, its events) must not end the thread that writes every
        task's outcome."""
        if self.settled:
            return
        self.settled = True
        try:
            self.written(landed)
        except BaseException:  # even SystemExit from a task's value: this thread goes on
            logger.exception(
                "Task %s: the follow-up of its outcome (%s, %s) failed; the writer goes on.",
                self.claimed.id,
                self.outcome.status,
                "written" if landed else "not written",
            )


class Reporter(threading.Thread):
    """A worker service (per-worker; see ``services.py``): a thread with ``stop()``, which
    lets it write what was submitted before and then end."""

    singleton = False

    def __init__(
        self,
        database: str,
        *,
        persist_deadline: float,
        clock: Callable[[], datetime],
        session: SharedSession | None = None,
    ) -> None:
        super().__init__(name="tasks-reporter", daemon=True)
        self.database = database
        # Shared with the claim loop in a worker; a reporter run alone has its own.
        self._own_session = session is None
        self.session = session or SharedSession(database, "tasks-reporter")
        self.persist_deadline = persist_deadline
        self.clock = clock
        self.after_batch: Callable[[], None] | None = None
        self._stopping = threading.Event()
        self._told_kept = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._parked: list[_Submitted] = []  # outcomes whose row was locked: written again

    def submit(self, claimed: ClaimedTask, outcome: Transition, written: Written) -> None:
        """Queue one outcome; ``written`` is called once it is written (or refused)."""
        self._inbox.put(_Submitted(claimed, outcome, written))

    def stop_soon(self) -> None:
        """The worker is shutting down: outcomes are no longer kept past
        ``persist_deadline`` through a stall, so shutdown keeps its bound."""
        self._stopping.set()

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(_STOP)

    def run(self) -> None:
        with outside_the_pool(self.database):
            self._serve()

    def _serve(self) -> None:
        try:
            stopping = False
            while not stopping:
                item = self._wait_next()
                if item is _STOP:
                    stopping = True
                    item = None
                batch: list[_Submitted] = [] if item is None else [item]
                while not stopping and len(batch) < MAX_BATCH:
                    try:  # inline: once per outcome
                        more = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stopping = True
                        break
                    batch.append(more)
                if self._parked:
                    batch = self._take_due() + batch
                if batch:
                    self._write_batch(batch)
            # Outcomes set aside for a locked row get their remaining chances (each is
            # bounded by its give_up_at) before the thread ends.
            while self._parked:
                time.sleep(self._until_due())
                due = self._take_due()
                if due:
                    self._write_batch(due)
        finally:
            connections[self.database].close()
            if self._own_session:
                self.session.close()

    def _wait_next(self) -> Any:
        """The next submitted item (or ``_STOP``); None when none came by the time an
        outcome set aside is due to be written again."""
        try:
            if not self._parked:
                return self._inbox.get()
            return self._inbox.get(timeout=self._until_due())
        except queue.Empty:
            return None

    def _until_due(self) -> float:
        """Seconds until the first outcome set aside is due to be written again."""
        return max(0.0, min(item.due_at for item in self._parked) - time.monotonic())

    def _take_due(self) -> list[_Submitted]:
        """The outcomes set aside that are due to be written again, no longer parked."""
        if not self._parked:
            return []
        now = time.monotonic()
        due = [item for item in self._parked if item.due_at <= now]
        if due:
            self._parked = [item for item in self._parked if item.due_at > now]
            for item in due:
                item.parked = False
        return due

    def _park(self, item: _Submitted) -> None:
        """Set aside an outcome whose row another session held locked, to be written
        again after a pause that doubles each time its row is found locked."""
        item.pause = FIRST_RETRY_PAUSE if not item.pause else min(item.pause * 2, LAST_RETRY_PAUSE)
        item.due_at = time.monotonic() + item.pause
        item.parked = True
        self._parked.append(item)

    def _write_batch(self, batch: list[_Submitted]) -> None:
        """Write one batch and run its follow-ups; whatever goes wrong is logged and the
        thread goes on to the next batch (a bookkeeping thread never dies of one task)."""
        try:
            self._flush(batch)
        except BaseException:
            logger.exception(
                "Writing %d outcome(s) failed unexpectedly (tasks %s); those not written "
                "will be retried when their leases expire.",
                len(batch),
                ", ".join(item.claimed.id for item in batch[:10]),
            )
        for item in batch:
            if not item.parked:
                item.settle(False)  # only those the flush could neither settle nor set aside
        if self.after_batch is not None:
            try:
                self.after_batch()
            except BaseException:
                logger.exception("Handing on the follow-ups of a batch of outcomes failed")

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """A turn on the session, its statements bounded as a worker's."""
        with self.session.turn():
            worker_connection(self.database, self.persist_deadline)
            yield

    def _write(
        self, completions: list[tuple[ClaimedTask, Transition]], *, expect_locks: bool = False
    ) -> list[bool]:
        with self._turn():
            return apply_transitions(self.database, completions, expect_locks=expect_locks)

    def _flush(self, batch: list[_Submitted]) -> None:
        deadline = time.monotonic() + self.persist_deadline
        delay = 0.2
        extended = False  # the database answered past the deadline: one more deadline
        while True:
            try:
                landed = self._write(
                    [(item.claimed, item.outcome) for item in batch],
                    # Outcomes set aside for a locked row: skip it at once if still locked.
                    expect_locks=any(item.give_up_at is not None for item in batch),
                )
            except _TRANSIENT as exc:
                if time.monotonic() + delay > deadline:
                    if self._stalled_for_all(batch):
                        # The deadline counts again from when the database answers.
                        deadline = time.monotonic() + self.persist_deadline
                    elif not extended and not self._stopping.is_set():
                        # It answers: the stall may have ended just now.
                        extended = True
                        deadline = time.monotonic() + self.persist_deadline
                    else:
                        logger.error(
                            "Could not write %d outcome(s) (%s); their leases will expire "
                            "and the tasks will be retried.",
                            len(batch),
                            exc,
                        )
                        self._told_kept = False
                        for item in batch:
                            item.settle(False)
                        return
                logger.warning("Database unavailable writing outcomes (%s); retrying", exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except Exception:
                # One bad row (a value the database or the driver refuses) must not sink
                # its neighbours: write them one by one.
                logger.warning(
                    "Writing %d outcome(s) together failed; writing them one by one.",
                    len(batch),
                    exc_info=True,
                )
                self._flush_one_by_one(batch)
                return
            self._told_kept = False
            self._settle_written(batch, landed)
            return

    def _stalled_for_all(self, batch: list[_Submitted]) -> bool:
        """Past the deadline, whether the database is stalled for every write, not only
        for this batch's: asked by renewing the batch's leases, a write to the same rows.
        If that fails too (a table lock, a database gone), the outcomes are kept: a
        reaper held up by the same stall waits a lease's time after it (``reapgate``),
        so they land once the database answers, and a reaper that did take a lease is
        fenced out by its token (the outcome then does not land, as before). Never
        while the worker is stopping."""
        if self._stopping.is_set():
            return False
        leases = [(item.claimed.id, item.claimed.lease_token) for item in batch]
        try:
            with self._turn():
                renew_leases(self.database, leases, self.persist_deadline)
        except _TRANSIENT:
            if not self._told_kept:
                self._told_kept = True
                logger.warning(
                    "Keeping %d outcome(s) past %.0f s: their leases cannot be renewed "
                    "either, so the database is stalled or gone; they are written when "
                    "it answers.",
                    len(batch),
                    self.persist_deadline,
                )
            return True
        except Exception:
            logger.exception("Could not renew the leases of %d outcome(s)", len(batch))
        return False

    def _flush_one_by_one(self, batch: list[_Submitted]) -> None:
        for item in batch:
            claimed, outcome = item.claimed, item.outcome
            try:
                [ok] = self._write([(claimed, outcome)], expect_locks=True)
            except _TRANSIENT:
                logger.exception("Could not write the outcome of task %s", claimed.id)
                item.settle(False)
                continue
            except Exception as exc:
                self._record_unstorable(claimed, outcome, exc)
                item.settle(False)  # the intended outcome did not land: nothing announced
                continue
            self._settle_written([item], [ok])

    def _settle_written(self, batch: list[_Submitted], landed: list[bool]) -> None:
        """Tell each submitter whether its row landed, except where the write skipped a
        row another session held locked: that outcome is set aside and written again."""
        missed = []
        for item, ok in zip(batch, landed, strict=True):
            if ok:
                item.settle(True)
            else:
                missed.append(item)
        if not missed:
            return
        held = self._still_held(missed)
        now = time.monotonic()
        for item in missed:
            if (item.claimed.id, item.claimed.lease_token) not in held:
                item.settle(False)
                continue
            if item.give_up_at is None:
                item.give_up_at = now + self.persist_deadline
            if now < item.give_up_at:
                self._park(item)
                continue
            logger.error(
                "Task %s: another session held its row locked for %.0f s; its outcome (%s) "
                "is not written, so its lease will expire and the task will be retried.",
                item.claimed.id,
                self.persist_deadline,
                item.outcome.status,
            )
            item.settle(False)

    def _still_held(self, missed: list[_Submitted]) -> set[tuple[str, str]]:
        """Which of the outcomes that did not land still hold their lease: their rows
        were locked, not taken over. Unknown (the question failed) counts as held:
        writing again is fenced, and ``give_up_at`` bounds it."""
        leases = [(item.claimed.id, item.claimed.lease_token) for item in missed]
        try:
            with self._turn():
                return leases_still_held(self.database, leases)
        except Exception as exc:
            logger.warning(
                "Could not tell whether %d lease(s) are still held (%s); their outcomes "
                "will be written again.",
                len(leases),
                exc,
            )
            return set(leases)

    def _record_unstorable(self, claimed: ClaimedTask, outcome: Transition, exc: Exception) -> bool:
        """Dead-letter the task with ``OutcomeNotStorable`` in place of an outcome the
        database refused; False if even that cannot be written (the lease then expires)."""
        logger.error(
            "Task %s: its outcome (%s) cannot be stored (%s); dead-lettering it instead.",
            claimed.id,
            outcome.status,
            type(exc).__name__,
        )
        try:
            fallback = unstorable_outcome(claimed, outcome, exc, now=self.clock())
            [ok] = self._write([(claimed, fallback)])
        except Exception:
            logger.exception("Task %s: could not record the failure either", claimed.id)
            return False
        if ok:  # the dead letter is what happened to the task: subscribers hear of it
            events.emit_outcome(claimed, fallback, None, self.clock)
        return ok
