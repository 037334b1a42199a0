"""Adaptive prefetch: short tasks are claimed in big batches, long ones a few at a time."""

from __future__ import annotations

import pytest

from django_tasks_plus.worker.engine import (
    MAX_ADAPTIVE_PREFETCH,
    PREFETCH_BUFFER_SECONDS,
    adaptive_prefetch,
)


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


@pytest.mark.django_db(transaction=True)
def test_the_banner_says_which_prefetch_runs(run_worker):
    adaptive = run_worker("--burst", "--concurrency", "4")
    assert adaptive.returncode == 0, adaptive.stderr
    assert f"prefetch:    adaptive, 4 to {MAX_ADAPTIVE_PREFETCH}" in adaptive.stdout
    fixed = run_worker("--burst", "--prefetch", "0")
    assert "prefetch:    0\n" in fixed.stdout
