"""The worker's single writer of attempt outcomes: group commit for the task threads.

Task threads hand their outcome to the reporter and wait for it to be written; the
reporter writes whatever has accumulated in one transaction. Under load many outcomes
share one commit; when idle a lone outcome is written at once, so latency stays low.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from ..db.completions import apply_transitions
from ..lifecycle import ClaimedTask, Transition

logger = logging.getLogger("django_tasks_plus.worker")

MAX_BATCH = 500
_STOP = object()


class Reporter(threading.Thread):
    def __init__(self, database: str, *, persist_deadline: float) -> None:
        super().__init__(name="tasks-reporter", daemon=True)
        self.database = database
        self.persist_deadline = persist_deadline
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, claimed: ClaimedTask, outcome: Transition) -> Future[bool]:
        """Queue one outcome; the future says whether it landed once it is written."""
        done: Future[bool] = Future()
        self._inbox.put((claimed, outcome, done))
        return done

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
            except BaseException as exc:  # never strand the waiting task threads
                for _, _, done in batch:
                    done.set_exception(exc)
                return
            for (_, _, done), ok in zip(batch, landed, strict=True):
                done.set_result(ok)
            return

    def _flush_one_by_one(self, batch: list) -> None:  # type: ignore[type-arg]
        for claimed, outcome, done in batch:
            try:
                [ok] = apply_transitions(self.database, [(claimed, outcome)])
            except BaseException as exc:
                logger.exception("Could not write the outcome of task %s", claimed.id)
                done.set_exception(exc)
            else:
                done.set_result(ok)
