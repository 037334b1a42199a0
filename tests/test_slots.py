"""The worker's task threads: jobs run, failures are logged, shutdown is orderly."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from django_tasks_plus.worker.slots import Slots


def test_jobs_run_on_the_named_threads():
    slots = Slots(3, name_prefix="t-slot")
    seen: list[str] = []
    done = threading.Event()

    def job() -> None:
        seen.append(threading.current_thread().name)
        if len(seen) == 10:
            done.set()

    for _ in range(10):
        slots.submit(job)
    assert done.wait(5)
    slots.shutdown(wait=True)
    assert set(seen) <= {"t-slot_0", "t-slot_1", "t-slot_2"}


def test_a_failing_job_is_logged_and_the_thread_goes_on(caplog):
    slots = Slots(1, name_prefix="t-slot")
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("job failed")

    with caplog.at_level(logging.ERROR, logger="django_tasks_plus.worker"):
        slots.submit(boom)
        slots.submit(ran.set)
        assert ran.wait(5)
        slots.shutdown(wait=True)
    assert "A worker thread job failed" in caplog.text
    assert "RuntimeError: job failed" in caplog.text


def test_shutdown_runs_queued_jobs_unless_told_to_drop_them():
    results: list[int] = []
    gate = threading.Event()
    slots = Slots(1, name_prefix="t-slot")
    slots.submit(lambda: gate.wait(5))
    for n in range(3):
        slots.submit(lambda n=n: results.append(n))
    gate.set()
    slots.shutdown(wait=True)
    assert results == [0, 1, 2]
    with pytest.raises(RuntimeError, match="shutting down"):
        slots.submit(lambda: None)

    dropped: list[int] = []
    gate = threading.Event()
    slots = Slots(1, name_prefix="t-slot")
    slots.submit(lambda: gate.wait(5))
    time.sleep(0.05)  # the thread is inside the first job
    for n in range(3):
        slots.submit(lambda n=n: dropped.append(n))
    slots.shutdown(wait=False, cancel_pending=True)
    gate.set()
    time.sleep(0.1)
    assert dropped == []
