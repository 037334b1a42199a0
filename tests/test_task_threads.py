"""Task threads start the next waiting task themselves (``Worker._start_next``): a busy
worker's claim loop turns once per batch of outcomes, not once per task (a fifth more
drained tasks a second, docs/performance.md). The doers still govern every start, and
after a stop no thread starts another waiting task."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from functools import partial
from typing import Any

import pytest

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.doers import make_doer
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import QueueGroup, Worker
from django_tasks_plus.worker.slots import Slots
from tests import tasks
from tests.conftest import wait_for, worker_log

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


def test_a_finishing_task_thread_starts_the_next_waiting_task(starters):
    results = [tasks.add.enqueue(n, n) for n in range(6)]
    # One thread and room for all six in one claim: the claim loop (this thread) starts
    # the first, and each task's thread starts the one after it.
    worker = Worker(WorkerConfig.from_settings("default", concurrency=1, prefetch=8, burst=True))
    assert worker.run() == 0

    for n, result in enumerate(results):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2 * n
    assert len(starters) == 6
    assert starters[0] == threading.current_thread().name
    assert starters[1:] == ["tasks-slot_0"] * 5


@pytest.mark.parametrize("limit", [1, 2])
def test_a_doers_limit_holds_when_task_threads_start_tasks(limit: int) -> None:
    tasks.Overlap.most = 0
    results = [tasks.overlap_probe.enqueue() for _ in range(12)]
    worker = Worker(WorkerConfig.from_settings("default", concurrency=4, prefetch=8, burst=True))
    worker.groups = [QueueGroup(make_doer({"limit": limit}), ("default",))]
    assert worker.run() == 0

    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert tasks.Overlap.most == limit  # never more, and the threads were used up to it


def test_a_stop_lets_no_task_thread_start_another_waiting_task(start_worker, markers, tmp_path):
    results = [tasks.sleep_then_return.enqueue(0.2 + n / 1000) for n in range(40)]
    worker = start_worker(
        "--worker-id", "stopping", "--queue", "slow", "--concurrency", "4", "--prefetch", "36"
    )
    wait_for(lambda: len(list(markers.glob("sleeping-*"))) >= 6)
    started_before_stop = len(list(markers.glob("sleeping-*")))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker_log(tmp_path)

    statuses: Counter[str] = Counter()
    for result in results:
        result.refresh()
        statuses[result.status] += 1
        if result.status == TaskResultStatus.READY:
            assert TaskRecord.objects.get(pk=result.id).attempt == 0  # handed back unstarted
    assert set(statuses) <= {TaskResultStatus.SUCCESSFUL, TaskResultStatus.READY}, statuses
    # What ran: the tasks started before the stop, and a few more (a thread starts one a
    # fifth of a second at most; these started between the count above and the signal,
    # or were taken from the doer as it arrived). Had the task threads gone on taking
    # from the doers after the stop (Worker._shutdown empties them under the lock the
    # threads take from them under), every claimed task would have run: about 40.
    ran = statuses[TaskResultStatus.SUCCESSFUL]
    assert ran == len(list(markers.glob("sleeping-*")))
    assert started_before_stop <= ran <= started_before_stop + 8, (started_before_stop, ran)
    assert statuses[TaskResultStatus.READY] == 40 - ran
