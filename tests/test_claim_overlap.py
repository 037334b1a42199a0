"""The next claim overlaps the work in hand: a worker's capacity (threads plus prefetch)
bounds the tasks it has not finished, not the finished ones whose outcomes wait for the
outcome writer, and a task thread wakes the claim loop once the waiting tasks fall to
the refill level, so the claim runs while they do. A drain of no-op tasks otherwise
ran each batch, waited for its writes, and only then claimed the next
(docs/performance.md, "The next claim overlaps the outcome writes").

These run a real worker on the test database and stall its outcome writer, as a slow
or locked database would, by holding each batch back before it takes its turn on the
session (the claim loop's turns stay free)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection  # noqa: F401 (a skipif condition reads it)

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import Worker, free_slots, refill_level
from django_tasks_plus.worker.reporter import Reporter
from tests import tasks
from tests.conftest import wait_for


@pytest.mark.parametrize(
    ("capacity", "held", "settling", "expected"),
    [
        (10, 0, 0, 10),  # nothing held
        (10, 10, 0, 0),  # all unfinished: full, as before
        (10, 10, 10, 10),  # all finished, outcomes queued: a whole claim again
        (10, 14, 6, 2),  # 8 unfinished: 2 slots
        (10, 20, 10, 0),  # two capacities held: no more, whatever has finished
        (10, 18, 12, 2),  # close to it: that bound, not the unfinished tasks, binds
        (10, 25, 5, 0),  # more held than both bounds allow (the prefetch has shrunk)
    ],
)
def test_free_slots_count_unfinished_tasks_and_bound_the_outcome_backlog(
    capacity: int, held: int, settling: int, expected: int
) -> None:
    assert free_slots(capacity, held, settling) == expected


@pytest.mark.parametrize(
    ("capacity", "concurrency", "expected"),
    [
        (1032, 8, 508),  # adaptive prefetch at its cap
        (5, 1, 2),
        (16, 8, 0),  # prefetch no larger than the threads: when the last one starts
        (8, 8, 0),
    ],
)
def test_the_refill_level_leaves_half_the_capacity_free_with_every_thread_busy(
    capacity: int, concurrency: int, expected: int
) -> None:
    level = refill_level(capacity, concurrency)
    assert level == expected
    if level:
        # At the level, with every thread running, at least half of the capacity is free.
        assert free_slots(capacity, level + concurrency, 0) >= capacity // 2


@pytest.fixture
def stalled_writer(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The outcome writer holds every batch back until the returned event is set."""
    release = threading.Event()
    original = Reporter._flush

    def flush(self: Reporter, batch: Any) -> None:
        release.wait(60)
        original(self, batch)

    monkeypatch.setattr(Reporter, "_flush", flush)
    return release


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each claim statement of the worker: (tasks waiting in its doers when it was
    made, rows it returned)."""
    made: list[tuple[int, int]] = []
    original = Worker._claim_from

    def claim_from(self: Worker, group: Any, wanted: int) -> Any:
        waiting = sum(each.doer.waiting for each in self.groups)
        claimed = original(self, group, wanted)
        made.append((waiting, len(claimed)))
        return claimed

    monkeypatch.setattr(Worker, "_claim_from", claim_from)
    return made


def _run(config: WorkerConfig) -> tuple[Worker, threading.Thread, list[int]]:
    worker = Worker(config)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(worker.run()), daemon=True)
    thread.start()
    return worker, thread, exit_codes


def _finish(
    thread: threading.Thread,
    exit_codes: list[int],
    results: list[Any],
    writer: threading.Event,
) -> None:
    writer.set()
    thread.join(60)
    assert not thread.is_alive()
    assert exit_codes == [0]
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == result.args[0]


@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_again_while_its_outcomes_wait_for_the_writer(
    stalled_writer: threading.Event, claims: list[tuple[int, int]]
) -> None:
    results = [tasks.sleep_then_return.enqueue(0.05) for _ in range(12)]
    # One thread and a fixed prefetch of 4: a capacity of 5, and at most 10 tasks held.
    config = WorkerConfig.from_settings(
        "default", queues=["slow"], concurrency=1, prefetch=4, burst=True
    )
    worker, thread, exit_codes = _run(config)
    try:
        # No outcome is written, yet the worker claims until it holds two capacities:
        # the first five tasks finished and waiting for the writer, five more.
        wait_for(lambda: len(worker._settling) == 10, timeout=30, seen=lambda: claims)
        time.sleep(0.3)  # a claim beyond the bound would come within milliseconds
        assert sum(rows for _, rows in claims) == 10, claims
    finally:
        _finish(thread, exit_codes, results, stalled_writer)


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="wakes by NOTIFY, not polls")
def test_a_task_thread_wakes_the_claim_loop_before_the_waiting_tasks_run_out(
    stalled_writer: threading.Event, claims: list[tuple[int, int]]
) -> None:
    # Tasks long enough that the claim loop, once woken, claims before they end.
    results = [tasks.sleep_then_return.enqueue(0.2) for _ in range(12)]
    # Capacity 5, refill level 2. With the writer stalled and no poll for 30 s, only a
    # task thread can wake the claim loop: one that ran dry, or one at the refill level.
    config = WorkerConfig.from_settings(
        "default", queues=["slow"], concurrency=1, prefetch=4, burst=True, poll_interval=30.0
    )
    worker, thread, exit_codes = _run(config)
    try:
        wait_for(lambda: len(worker._settling) == 10, timeout=30, seen=lambda: claims)
        # The next claims were made while claimed tasks still waited to start: the
        # thread woke the loop at the refill level, not when it ran dry. (The last one
        # may find none waiting: near the bound of two capacities, a claim waits until
        # half a capacity is free.)
        assert all(waiting > 0 for waiting, _ in claims[1:3]), claims
    finally:
        _finish(thread, exit_codes, results, stalled_writer)
