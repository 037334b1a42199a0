"""Adaptive polling: short waits while work flows, doubling up to the maximum when idle."""

from __future__ import annotations

import pytest

from django_tasks_plus.worker.wakeup import PollBackoff


def test_waits_grow_up_to_the_maximum():
    backoff = PollBackoff(maximum=0.1, minimum=0.02)
    assert [backoff.next() for _ in range(6)] == pytest.approx(
        [0.02, 0.03, 0.045, 0.0675, 0.1, 0.1]
    )


def test_finding_work_resets_to_the_shortest_wait():
    backoff = PollBackoff(maximum=1.0, minimum=0.02)
    for _ in range(10):
        backoff.next()
    assert backoff.next() == 1.0
    backoff.reset()
    assert backoff.next() == pytest.approx(0.02)
    assert backoff.next() == pytest.approx(0.03)


def test_minimum_never_exceeds_maximum():
    backoff = PollBackoff(maximum=0.01, minimum=0.02)
    assert backoff.next() == 0.01
    assert backoff.next() == 0.01


def test_with_notify_the_wait_is_constant():
    """With LISTEN/NOTIFY the worker polls only for due deferred tasks: a fixed interval."""
    backoff = PollBackoff(maximum=1.0, minimum=1.0)
    backoff.reset()
    assert [backoff.next() for _ in range(3)] == [1.0, 1.0, 1.0]
