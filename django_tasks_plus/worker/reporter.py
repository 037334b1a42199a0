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

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from ..db.completions import apply_transitions
from ..lifecycle import ClaimedTask, Transition

logger = logging.getLogger("django_tasks_plus.worker")

MAX_BATCH = 500
_STOP = object()


Written = Callable[[bool], None]
"""Called with whether the outcome's row landed; must be quick and must not raise."""


class Reporter(threading.Thread):
    def __init__(self, database: str, *, persist_deadline: float) -> None:
        super().__init__(name="tasks-reporter", daemon=True)
        self.database = database
        self.persist_deadline = persist_deadline
        self.after_batch: Callable[[], None] | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, claimed: ClaimedTask, outcome: Transition, written: Written) -> None:
        """Queue one outcome; ``written`` is called once it is written (or refused)."""
        self._inbox.put((claimed, outcome, written))

    def stop(self) -> None:
        self._inbox.put(_STOP)

    def run(self) -> None:
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

    def _flush(self, batch: list) -> None:  # type: ignore[type-arg]
        deadline = time.monotonic() + self.persist_deadline
        delay = 0.2
        while True:
            try:
                landed = apply_transitions(
                    self.database, [(claimed, outcome) for claimed, outcome, _ in batch]
                )
            except (OperationalError, InterfaceError) as exc:
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
            except DatabaseError:
                # One bad row must not sink its neighbours: write them one by one.
                self._flush_one_by_one(batch)
                return
            except Exception:  # never strand the tasks: their leases will expire
                logger.exception("Could not write %d outcome(s)", len(batch))
                landed = [False] * len(batch)
            for (_, _, written), ok in zip(batch, landed, strict=True):
                written(ok)
            return

    def _flush_one_by_one(self, batch: list) -> None:  # type: ignore[type-arg]
        for claimed, outcome, written in batch:
            try:
                [ok] = apply_transitions(self.database, [(claimed, outcome)])
            except Exception:
                logger.exception("Could not write the outcome of task %s", claimed.id)
                ok = False
            written(ok)
