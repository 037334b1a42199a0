"""The claim loop asks the database again at once only when more may be due: after a
claim that took all it asked for. After one that took less, the due rows were
exhausted; a new task's NOTIFY (PostgreSQL) or the poll wakes the loop instead, so an
idle worker does not pay one empty claim per task it starts (measured with
``bench/latency_trace.py``: 3 empty claims per task at 50 tasks/s before, 2 after)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection  # noqa: F401 (the skipif condition reads it)

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db import postgresql
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import Worker
from django_tasks_plus.worker.wakeup import NotifyListener
from tests import tasks
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    # Without NOTIFY (SQLite) the loop polls, at growing intervals from 20 ms, by design.
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="wakes by NOTIFY"),
]


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each claim of this process returned, in order."""
    counted: list[int] = []
    original = postgresql.PostgreSQLDialect.claim

    def claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        claimed = original(self, *args, **kwargs)
        counted.append(len(claimed))
        return claimed

    monkeypatch.setattr(postgresql.PostgreSQLDialect, "claim", claim)
    return counted


def _start(**flags: Any) -> tuple[Worker, threading.Thread]:
    worker = Worker(WorkerConfig.from_settings("default", poll_interval=30.0, **flags))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread


def _stop(worker: Worker, thread: threading.Thread) -> None:
    tasks.GATE.set()
    worker.stopping.set()
    worker.wakeup.set()
    thread.join(30)
    assert not thread.is_alive()


def test_a_claim_that_took_less_than_it_asked_for_is_not_repeated_at_once(claims):
    tasks.GATE.clear()
    worker, thread = _start(concurrency=2, prefetch=0)
    try:
        [listener] = [s for s in worker.services.services if isinstance(s, NotifyListener)]
        assert listener.connected.wait(10)
        # Once connected, the listener wakes the loop to look once (a NOTIFY may have been
        # missed): let that claim, and the one at start, pass before the task arrives.
        time.sleep(0.3)
        result = tasks.wait_at_gate.enqueue()  # its NOTIFY wakes the loop
        wait_for(lambda: 1 in claims, timeout=10)
        time.sleep(1.0)  # a repeated claim would come within microseconds
        after = claims[claims.index(1) + 1 :]
        # The task is still running (the gate is shut): nothing finished, nothing was
        # enqueued, so nothing may wake the loop, and it asks for nothing more.
        assert after == [], claims
    finally:
        _stop(worker, thread)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
