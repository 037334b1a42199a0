"""The threads that run tasks: a fixed set of threads taking jobs from one queue.

``concurrent.futures.ThreadPoolExecutor`` builds a ``Future`` (a lock and a condition)
for every job, and the worker never reads them: at thousands of tasks a second that was
the largest single cost in a worker's own code. Here a job is a plain callable in a
``SimpleQueue``, and a job that raises is logged, never lost silently.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger("django_tasks_plus.worker")

Job = Callable[[], None]
_STOP = None


class Slots:
    """``count`` threads named ``<prefix>_<n>``, started at once; each calls ``on_exit``
    (if given) as it ends, to release what it held (its database connections)."""

    def __init__(self, count: int, *, name_prefix: str, on_exit: Job | None = None) -> None:
        self._on_exit = on_exit
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name_prefix}_{n}", daemon=True)
            for n in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises ``RuntimeError`` once ``shutdown()`` has begun."""
        if self._closed:
            raise RuntimeError("the task threads are shutting down")
        self._jobs.put(job)

    def shutdown(self, *, wait: bool, cancel_pending: bool = False) -> None:
        """Stop taking jobs; with ``cancel_pending`` drop queued ones; with ``wait`` join."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if cancel_pending:
            while True:
                try:
                    self._jobs.get_nowait()
                except queue.Empty:
                    break
        for _ in self._threads:
            self._jobs.put(_STOP)  # after every queued job: those still run first
        if wait:
            for thread in self._threads:
                thread.join()

    def _serve(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                try:
                    job()
                except BaseException:  # a job must never take its thread down
                    logger.exception("A worker thread job failed")
        finally:
            if self._on_exit is not None:
                try:
                    self._on_exit()
                except Exception:
                    logger.exception("A worker thread failed to clean up as it ended")
