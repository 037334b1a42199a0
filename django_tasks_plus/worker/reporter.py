"""The worker's single writer of attempt outcomes: group commit for the task threads.

Task threads hand their outcome to the reporter and move on; the reporter writes
whatever has accumulated in one transaction. Under load many outcomes share one commit;
when idle a lone outcome is written at once, so latency stays low. Each outcome comes
with a callback, called on this thread once the batch is written with whether its row
landed (False when the lease was lost or the write failed); ``after_batch`` runs after
each batch's callbacks, so follow-up work can be handed on once per batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.db import InterfaceError, OperationalError, connections

from .. import events
from ..db import worker_connection
from ..db.completions import apply_transitions
from ..db.unpooled import outside_the_pool
from ..lifecycle import ClaimedTask, Transition, unstorable_outcome

logger = logging.getLogger("django_tasks_plus.worker")

MAX_BATCH = 500
_STOP = object()


Written = Callable[[bool], None]
"""Called with whether the outcome's row landed; must be quick and must not raise."""

# A lost connection (or a statement bounded by the worker's timeouts): worth retrying
# the whole batch. Anything else is about the batch's content: find the row it is in.
_TRANSIENT = (OperationalError, InterfaceError)


class Reporter(threading.Thread):
    """A worker service (per-worker; see ``services.py``): a thread with ``stop()``, which
    lets it write what was submitted before and then end."""

    singleton = False

    def __init__(
        self, database: str, *, persist_deadline: float, clock: Callable[[], datetime]
    ) -> None:
        super().__init__(name="tasks-reporter", daemon=True)
        self.database = database
        self.persist_deadline = persist_deadline
        self.clock = clock
        self.after_batch: Callable[[], None] | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, claimed: ClaimedTask, outcome: Transition, written: Written) -> None:
        """Queue one outcome; ``written`` is called once it is written (or refused)."""
        self._inbox.put((claimed, outcome, written))

    def stop(self) -> None:
        self._inbox.put(_STOP)

    def run(self) -> None:
        with outside_the_pool(self.database):
            self._serve()

    def _serve(self) -> None:
        try:
            while True:
                item = self._inbox.get()
                if item is _STOP:
                    return
                batch = [item]
                stopping = False
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stopping = True
                        break
                    batch.append(more)
                self._flush(batch)
                if self.after_batch is not None:
                    self.after_batch()
                if stopping:
                    return
        finally:
            connections[self.database].close()

    def _write(self, completions: list[tuple[ClaimedTask, Transition]]) -> list[bool]:
        worker_connection(self.database, self.persist_deadline)
        return apply_transitions(self.database, completions)

    def _flush(self, batch: list) -> None:
        deadline = time.monotonic() + self.persist_deadline
        delay = 0.2
        while True:
            try:
                landed = self._write([(claimed, outcome) for claimed, outcome, _ in batch])
            except _TRANSIENT as exc:
                connections[self.database].close()
                if time.monotonic() + delay > deadline:
                    logger.error(
                        "Could not write %d outcome(s) (%s); their leases will expire and "
                        "the tasks will be retried.",
                        len(batch),
                        exc,
                    )
                    landed = [False] * len(batch)
                else:
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
            for (_, _, written), ok in zip(batch, landed, strict=True):
                written(ok)
            return

    def _flush_one_by_one(self, batch: list) -> None:
        for claimed, outcome, written in batch:
            try:
                [ok] = self._write([(claimed, outcome)])
            except _TRANSIENT:
                logger.exception("Could not write the outcome of task %s", claimed.id)
                connections[self.database].close()
                ok = False
            except Exception as exc:
                self._record_unstorable(claimed, outcome, exc)
                ok = False  # the intended outcome did not land: nothing is announced for it
            written(ok)

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
            connections[self.database].close()
            return False
        if ok:  # the dead letter is what happened to the task: subscribers hear of it
            events.emit_outcome(claimed, fallback, None, self.clock)
        return ok
