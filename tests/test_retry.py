"""Retry policies are pure: tested with no database and no sleeping."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from django_tasks_plus import InvalidRetryPolicy, exponential_backoff, no_retry
from django_tasks_plus.retry import next_delay, validate_policy

ELAPSED = timedelta(0)
ERROR = RuntimeError("x")


def test_defaults_follow_fedify():
    policy = exponential_backoff()
    assert policy.initial_delay == timedelta(seconds=1)
    assert policy.max_delay == timedelta(hours=12)
    assert policy.max_attempts == 10
    assert policy.factor == 2
    assert policy.jitter is True


def test_delays_double_until_the_cap_then_give_up():
    policy = exponential_backoff(max_delay=timedelta(seconds=10), max_attempts=6, jitter=False)
    delays = [policy(attempt, ELAPSED, ERROR) for attempt in range(1, 7)]
    assert delays == [
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=4),
        timedelta(seconds=8),
        timedelta(seconds=10),
        None,
    ]


def test_jitter_stays_between_half_and_full_delay():
    policy = exponential_backoff(initial_delay=8, jitter=True)
    object.__setattr__(policy, "rng", random.Random(7))
    for attempt in range(1, 5):
        full = policy.base_delay(attempt)
        delay = policy(attempt, ELAPSED, ERROR)
        assert full / 2 <= delay <= full


def test_huge_attempt_numbers_do_not_overflow():
    policy = exponential_backoff(max_attempts=10**6, jitter=False)
    assert policy(5000, ELAPSED, ERROR) == timedelta(hours=12)


def test_single_attempt_never_retries():
    assert exponential_backoff(max_attempts=1)(1, ELAPSED, ERROR) is None
    assert no_retry(1, ELAPSED, ERROR) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be at least 1"),
        ({"max_attempts": 2.5}, "max_attempts must be an int"),
        ({"factor": 0.5}, "factor must be at least 1"),
        ({"initial_delay": -1}, "initial_delay must not be negative"),
        ({"initial_delay": "1s"}, "initial_delay must be a timedelta or seconds"),
        ({"initial_delay": 10, "max_delay": 5}, "max_delay .* must not be shorter"),
    ],
)
def test_bad_policy_arguments(kwargs, message):
    with pytest.raises(InvalidRetryPolicy, match=message):
        exponential_backoff(**kwargs)


def test_next_delay_accepts_numbers_and_refuses_nonsense():
    assert next_delay(lambda a, e, x: 1.5, 1, ELAPSED, ERROR) == timedelta(seconds=1.5)
    assert next_delay(lambda a, e, x: None, 1, ELAPSED, ERROR) is None
    with pytest.raises(InvalidRetryPolicy, match="negative delay"):
        next_delay(lambda a, e, x: timedelta(seconds=-1), 1, ELAPSED, ERROR)
    with pytest.raises(InvalidRetryPolicy, match="expected a timedelta or None"):
        next_delay(lambda a, e, x: "soon", 1, ELAPSED, ERROR)


def test_policy_receives_attempt_elapsed_and_exception():
    seen = []

    def policy(attempt, elapsed, exc):
        seen.append((attempt, elapsed, exc))
        return timedelta(seconds=attempt)

    assert next_delay(policy, 3, timedelta(minutes=2), ERROR) == timedelta(seconds=3)
    assert seen == [(3, timedelta(minutes=2), ERROR)]


def test_validate_policy():
    assert validate_policy(no_retry, "here") is no_retry
    with pytest.raises(InvalidRetryPolicy, match="here must be a callable policy"):
        validate_policy(42, "here")
