"""Example tasks used by the demo and the test-suite."""

import time
from datetime import timedelta

from django_tasks_plus import exponential_backoff, task


@task
def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b


@task(
    takes_context=True,
    retry=exponential_backoff(initial_delay=timedelta(seconds=1), max_attempts=5),
)
def flaky(context, fail_times: int) -> int:
    """Fail on the first ``fail_times`` attempts, then return the attempt number."""
    if context.attempt <= fail_times:
        raise RuntimeError(f"flaky: attempt {context.attempt} of {fail_times} planned failures")
    return context.attempt


@task(queue_name="slow")
def slow(seconds: float) -> float:
    """Sleep for ``seconds`` and return it."""
    time.sleep(seconds)
    return seconds
