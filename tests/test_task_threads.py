"""Task threads start the next waiting task themselves (``Worker._start_next``): a busy
worker's claim loop turns once per batch of outcomes, not once per task (a fifth more
drained tasks a second, docs/performance.md). The doers still govern every start."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.doers import make_doer
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import QueueGroup, Worker
from django_tasks_plus.worker.slots import Slots
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def starters(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread that queued each task run, in order."""
    names: list[str] = []
    original = Slots.submit

    def submit(self: Slots, job: Any) -> None:
        if isinstance(job, partial) and getattr(job.func, "__name__", "") == "_run_on_slot":
            names.append(threading.current_thread().name)
        original(self, job)

    monkeypatch.setattr(Slots, "submit", submit)
    return names


def _drain(worker: Worker) -> None:
    thread = threading.Thread(target=worker.run, name="claim-loop", daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()


def test_a_finishing_task_thread_starts_the_next_waiting_task(starters):
    results = [tasks.add.enqueue(n, n) for n in range(6)]
    # One thread and room for all six in one claim: the claim loop starts the first, and
    # each task's thread starts the one after it.
    _drain(Worker(WorkerConfig.from_settings("default", concurrency=1, prefetch=8, burst=True)))

    for n, result in enumerate(results):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2 * n
    assert len(starters) == 6
    assert starters[0] == "claim-loop"
    assert starters[1:] == ["tasks-slot_0"] * 5


@pytest.mark.parametrize("limit", [1, 2])
def test_a_doers_limit_holds_when_task_threads_start_tasks(limit: int) -> None:
    tasks.Overlap.most = 0
    results = [tasks.overlap_probe.enqueue() for _ in range(12)]
    worker = Worker(WorkerConfig.from_settings("default", concurrency=4, prefetch=8, burst=True))
    worker.groups = [QueueGroup(make_doer({"limit": limit}), ("default",))]
    _drain(worker)

    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert tasks.Overlap.most == limit  # never more, and the threads were used up to it
