"""Example tasks used by the demo and the test-suite."""

import random
import time
from datetime import timedelta
from urllib.parse import urlsplit

from django_tasks_plus import Breaker, exponential_backoff, task


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


# -- the demo's steady trickle (manage.py enqueue_demo --trickle) --------------------------
# Each shows the admin something different: retries that recover, dead letters, a circuit
# breaker opening and closing, an ordering key blocked by a dead task.

DEMO_RETRY = exponential_backoff(
    initial_delay=timedelta(seconds=2), max_delay=timedelta(seconds=20), max_attempts=4
)


@task(takes_context=True, retry=DEMO_RETRY, queue_name="emails")
def send_receipt(context, order: int) -> str:
    """Fails on its first attempt for one order in three (a mail server hiccup), then sends."""
    if order % 3 == 0 and context.attempt == 1:
        raise ConnectionResetError(f"smtp.example.com reset the connection (order {order})")
    time.sleep(random.uniform(0.05, 0.4))
    return f"receipt for order {order} sent"


@task(takes_context=True, retry=DEMO_RETRY)
def import_feed(context, feed: str) -> int:
    """Always fails: the feed's format changed. Dead-lettered after 4 attempts."""
    raise ValueError(f"{feed}: unexpected element <rss2> at line 1 (attempt {context.attempt})")


def _host(url: str, *args, **kwargs) -> str | None:
    return urlsplit(url).hostname


# Small numbers so the demo shows every state within minutes: open after 3 failures in a
# minute, a probe 20 s later, held tasks dropped (dead-lettered) after 3 minutes.
webhooks = Breaker(
    key=_host,
    name="webhooks",
    failure_threshold=3,
    failure_window=timedelta(minutes=1),
    recovery_delay=timedelta(seconds=20),
    held_ttl=timedelta(minutes=3),
)


@task(breaker=webhooks, retry=DEMO_RETRY)
def deliver_webhook(url: str, event: str) -> int:
    """Deliver ``event`` to ``url``: ``down.example.net`` never answers, ``sometimes.example.net``
    is down during even minutes, every other host answers."""
    host = urlsplit(url).hostname
    if host == "down.example.net" or (host == "sometimes.example.net" and _even_minute()):
        raise ConnectionRefusedError(f"{host}:443 refused the connection")
    time.sleep(random.uniform(0.05, 0.2))
    return 204


def _even_minute() -> bool:
    return time.gmtime().tm_min % 2 == 0


@task(retry=exponential_backoff(max_attempts=1), ordering_failure="block")
def sync_account(account: str, step: int) -> str:
    """Steps of one account run in order (the demo enqueues them with the ordering key
    ``account:<name>``); step 3 of ``acme`` dies and blocks the rest."""
    if account == "acme" and step == 3:
        raise PermissionError(f"{account}: the API token was revoked")
    return f"{account} step {step} synced"


@task(takes_context=True)
def scheduled_report(context, what: str) -> str:
    """Run by the demo's two schedules (``enqueue_demo``): says which occurrence it is."""
    from django_tasks_plus.schedules import occurrence_of

    occurrence = occurrence_of(context)
    if occurrence is None:
        return f"{what}, run by hand"
    return f"{what} for {occurrence.schedule} at {occurrence.at:%H:%M:%S} UTC"
