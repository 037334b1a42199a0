"""Adaptive prefetch: short tasks are claimed in big batches, long ones a few at a time."""

from __future__ import annotations

import pytest

from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import (
    MAX_ADAPTIVE_PREFETCH,
    PREFETCH_BUFFER_SECONDS,
    PREFETCH_PAYLOAD_BUDGET,
    Worker,
    adaptive_prefetch,
    payload_average,
)
from tests import tasks
from tests.conftest import claim_tasks


def test_floor_until_a_run_time_is_known():
    assert adaptive_prefetch(8, 8, None) == 8


@pytest.mark.parametrize(
    ("run_seconds", "expected"),
    [
        (0.00003, MAX_ADAPTIVE_PREFETCH),  # no-op tasks: as many as allowed
        (0.01, int(8 * PREFETCH_BUFFER_SECONDS / 0.01)),  # 10 ms tasks: ~0.1 s of work
        (0.5, 8),  # slow tasks: never below the floor
        (0.0, MAX_ADAPTIVE_PREFETCH),  # a zero average does not divide by zero
    ],
)
def test_sized_by_run_time(run_seconds, expected):
    assert adaptive_prefetch(8, 8, run_seconds) == expected


def test_the_floor_is_respected_and_the_cap_holds():
    assert adaptive_prefetch(4, 100, 0.002) == 200  # between the floor and the cap
    assert adaptive_prefetch(64, 100, 1.0) == 100
    assert adaptive_prefetch(1000, 0, 0.0001) == MAX_ADAPTIVE_PREFETCH


@pytest.mark.parametrize(
    ("payload_size", "expected"),
    [
        (None, MAX_ADAPTIVE_PREFETCH),  # no size known yet: by run time alone
        (0, MAX_ADAPTIVE_PREFETCH),  # sizes the driver did not report
        (100, MAX_ADAPTIVE_PREFETCH),  # small arguments: the budget does not bind
        (1024 * 1024, PREFETCH_PAYLOAD_BUDGET // (1024 * 1024)),  # megabyte arguments
        (PREFETCH_PAYLOAD_BUDGET * 2, 8),  # never below the floor
    ],
)
def test_sized_by_the_stored_arguments_too(payload_size, expected):
    assert adaptive_prefetch(8, 8, 0.00003, payload_size) == expected


def test_the_argument_size_follows_a_bigger_claim_at_once_and_a_smaller_one_slowly():
    assert payload_average(None, 200.0) == 200.0
    # Big tasks after small ones: the next claim is sized by them, not by the old average.
    assert payload_average(200.0, 1_000_000.0) == 1_000_000.0
    smaller = payload_average(1_000_000.0, 200.0)
    assert 800_000 < smaller < 1_000_000  # one small claim does not undo the bound


@pytest.mark.django_db(transaction=True)
def test_a_claimed_task_knows_the_size_of_its_stored_arguments():
    tasks.echo.using(queue_name="default").enqueue("x" * 1000, key="y" * 500)
    [claimed] = claim_tasks()
    # The stored text: the argument and key, their quotes and the JSON around them.
    assert 1_500 < claimed.stored_size < 1_540, claimed.stored_size


@pytest.mark.django_db(transaction=True)
def test_a_worker_holds_fewer_tasks_with_big_arguments():
    """After claiming tasks with 1 MB of arguments each, the worker's adaptive prefetch
    holds no more than the budget's worth of them (it allowed the full cap before)."""
    big = "x" * (1024 * 1024 - 100)
    for _ in range(3):
        tasks.echo.using(queue_name="default").enqueue(big)
    worker = Worker(WorkerConfig.from_settings("default", concurrency=2, burst=True))
    worker._run_seconds = 0.00003  # as after no-op tasks: by run time, the full cap
    assert worker._prefetch() == MAX_ADAPTIVE_PREFETCH
    assert worker.run() == 0
    worker._run_seconds = 0.00003
    assert worker._payload_size is not None
    assert worker._payload_size == pytest.approx(1024 * 1024, rel=0.01)
    assert worker._prefetch() == PREFETCH_PAYLOAD_BUDGET // (1024 * 1024)


@pytest.mark.django_db(transaction=True)
def test_the_banner_says_which_prefetch_runs(run_worker):
    adaptive = run_worker("--burst", "--concurrency", "4")
    assert adaptive.returncode == 0, adaptive.stderr
    assert f"prefetch:    adaptive, 4 to {MAX_ADAPTIVE_PREFETCH}" in adaptive.stdout
    fixed = run_worker("--burst", "--prefetch", "0")
    assert "prefetch:    0\n" in fixed.stdout


@pytest.mark.django_db(transaction=True)
def test_the_tasks_of_one_claim_share_the_values_their_rows_repeat():
    """Held by the thousand, claimed tasks keep one copy of what their rows repeat
    (PostgreSQL's claim; the values themselves are as stored)."""
    from django.db import connection

    for number in range(3):
        tasks.add.enqueue(number, number)
    claimed = claim_tasks()
    assert len(claimed) == 3
    assert {task.task_path for task in claimed} == {tasks.add.module_path}
    assert all(task.started_at == task.claimed_at for task in claimed)  # first attempts
    if connection.vendor != "postgresql":
        return
    for name in ("task_path", "queue_name", "lease_token", "backend_name", "claimed_at"):
        assert len({id(getattr(task, name)) for task in claimed}) == 1, name
    assert all(task.started_at is task.claimed_at for task in claimed)
