"""Tasks the test suite enqueues; worker subprocesses import this module by path."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

from django_tasks_plus import Abort, Cancelled, TaskDeferred, exponential_backoff, task
from django_tasks_plus.compat import task_finished, task_started

# No waiting between attempts, so retries run within one --burst.
NO_WAIT = exponential_backoff(initial_delay=0, max_delay=0, max_attempts=3, jitter=False)
LEDGER_TABLE = "dtp_test_ledger"


def _marker(name: str) -> Path | None:
    folder = os.environ.get("DTP_TEST_MARKERS")
    return Path(folder) / name if folder else None


def _signal_log(line: str) -> None:
    path = os.environ.get("DTP_SIGNAL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def _on_started(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
    _signal_log(f"started {task_result.id} {task_result.status} attempt={task_result.attempts}")


def _on_finished(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
    in_except = sys.exc_info()[0] is not None
    line = f"finished {task_result.id} {task_result.status} in_except={in_except}"
    if task_result.status == "SUCCESSFUL":
        line += f" returned={type(task_result.return_value).__name__}"
    _signal_log(line)


task_started.connect(_on_started, dispatch_uid="dtp-tests-started")
task_finished.connect(_on_finished, dispatch_uid="dtp-tests-finished")


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=5, queue_name="other")
def echo(*args, **kwargs):  # type: ignore[no-untyped-def]
    return {"args": list(args), "kwargs": kwargs}


@task(retry=NO_WAIT)
def always_fails(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True, retry=NO_WAIT)
def succeeds_on_third(context) -> list[int]:  # type: ignore[no-untyped-def]
    if context.attempt < 3:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return [context.attempt, len(context.task_result.worker_ids), len(context.task_result.errors)]


@task(takes_context=True, retry=NO_WAIT)
def defers_once(context) -> int:  # type: ignore[no-untyped-def]
    marker = _marker(f"deferred-{context.task_result.id}")
    if marker is not None and not marker.exists():
        marker.touch()
        raise TaskDeferred(delay=0)
    return context.attempt


@task(retry=NO_WAIT)
def aborts() -> None:
    raise Abort("this payload can never work")


@task(retry=NO_WAIT)
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(retry=exponential_backoff(max_attempts=1), timeout=0.5)
def spins_forever() -> None:
    while True:
        time.sleep(0.01)


@task(retry=NO_WAIT)
def returns_unstorable() -> object:
    return object()


@task(retry=NO_WAIT)
def raises_system_exit() -> None:
    raise SystemExit(3)


@task(takes_context=True, retry=NO_WAIT, queue_name="slow")
def slow_first_attempt(context, seconds: float) -> int:  # type: ignore[no-untyped-def]
    """Sleeps on attempt 1 only (after leaving a marker), so a killed attempt can be retried."""
    if context.attempt == 1:
        marker = _marker(f"started-{context.task_result.id}")
        if marker is not None:
            marker.touch()
        time.sleep(seconds)
    return context.attempt


@task(queue_name="slow")
def sleep_then_return(seconds: float) -> float:
    marker = _marker(f"sleeping-{seconds}")
    if marker is not None:
        marker.touch()
    time.sleep(seconds)
    return seconds


@task(retry=NO_WAIT)
def record(n: int) -> int:
    """Append one line to the ledger table: how often each task body really ran."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {LEDGER_TABLE} (n, pid) VALUES (%s, %s)", [n, os.getpid()])
    return n


def not_a_task() -> str:
    """A plain function: a row naming it must be refused, never run."""
    marker = _marker("not-a-task-ran")
    if marker is not None:
        marker.touch()
    return "ran"


# -- delivery semantics ------------------------------------------------------------------


STEPS_TABLE = "dtp_test_steps"


@task(retry=NO_WAIT)
def step(key: str, n: int) -> int:
    """A short task for ordering tests; logs when its body ran, so overlaps would show."""
    started = time.time()
    time.sleep(0.002)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {STEPS_TABLE} (key, n, started, finished) VALUES (%s, %s, %s, %s)",
            [key, n, started, time.time()],
        )
    return n


@task(takes_context=True, retry=NO_WAIT)
def fails_first_attempt(context, n: int) -> int:  # type: ignore[no-untyped-def]
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return n


@task(retry=exponential_backoff(max_attempts=1), ordering_failure="block")
def dies_and_blocks(n: int) -> None:
    raise RuntimeError(f"task {n} dies")


@task(retry=exponential_backoff(max_attempts=1))
def dies_and_continues(n: int) -> None:
    raise RuntimeError(f"task {n} dies")


@dataclass
class Welcome:
    user_id: int
    lang: str = "en"
    tags: list[str] | None = None


@task(schema=Welcome)
def send_welcome(user_id: int, lang: str = "en", tags: list[str] | None = None) -> str:
    return f"{user_id}:{lang}:{','.join(tags or [])}"


@task
def round_trip(value):  # type: ignore[no-untyped-def]
    """Returns what it got, so tests can compare types across the database."""
    return {"value": value, "type": type(value).__name__}


@task(takes_context=True, queue_name="slow")
def waits_for_cancel(context) -> str:  # type: ignore[no-untyped-def]
    marker = _marker(f"waiting-{context.task_result.id}")
    if marker is not None:
        marker.touch()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if context.cancel_requested():
            raise Cancelled("stopped on request")
        time.sleep(0.05)
    return "never cancelled"


@task
def today() -> dt.date:
    return dt.date(2026, 1, 2)


@task(takes_context=True, retry=NO_WAIT, queue_name="slow", ordering_failure="block")
def fails_once_cancelled(context) -> None:  # type: ignore[no-untyped-def]
    marker = _marker(f"waiting-{context.task_result.id}")
    if marker is not None:
        marker.touch()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not context.cancel_requested():
        time.sleep(0.05)
    raise RuntimeError("noticed the cancel request, then crashed")


# -- bad input catalogue ------------------------------------------------------------------


class NotAnException(BaseException):
    """Derives from BaseException only, like GeneratorExit: still just a failed attempt."""


@task(retry=NO_WAIT)
def raises_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("from task code")


@task(retry=NO_WAIT)
def raises_base_exception() -> None:
    raise NotAnException("from task code")


def negative_delay(attempt: int, elapsed: dt.timedelta, exc: BaseException) -> dt.timedelta:
    """A broken retry policy: a delay can never be negative."""
    return dt.timedelta(seconds=-5)


@task(retry=negative_delay)
def fails_with_broken_policy() -> None:
    raise RuntimeError("first failure")


# -- data hardening: unstorable text, deep nesting ------------------------------------------


@task(retry=NO_WAIT)
def returns_lone_surrogate() -> dict[str, str]:
    # A file name that is not UTF-8, decoded as os.listdir() would: 'caf\udce9'.
    return {"name": os.fsdecode(b"caf\xe9")}


@task
def nesting_depth(value):  # type: ignore[no-untyped-def]
    """How many lists/tuples deep ``value`` goes along its first items."""
    depth = 0
    while isinstance(value, list | tuple) and value:
        depth += 1
        value = value[0]
    return depth


# -- faults: stalls, skewed clocks, task code that misuses its connection ---------------


@task(retry=NO_WAIT, queue_name="slow")
def counts_runs(tag: str, seconds: float) -> int:
    """Sleeps, and appends a line per run to the marker ``runs-<tag>``: runs are countable."""
    marker = _marker(f"runs-{tag}")
    if marker is not None:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return len(marker.read_text().splitlines()) if marker is not None else 0


@task(retry=exponential_backoff(max_attempts=1))
def leaks_transaction(n: int) -> int:
    """Writes a ledger row inside a transaction it never closes (a bug in task code)."""
    from django.db import transaction

    transaction.atomic().__enter__()
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {LEDGER_TABLE} (n, pid) VALUES (%s, %s)", [n, os.getpid()])
    return n


@task(retry=exponential_backoff(max_attempts=1))
def leaks_autocommit_off(n: int) -> int:
    """Turns autocommit off, writes, and leaves (another way to leak a transaction)."""
    from django.db import transaction

    transaction.set_autocommit(False)
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {LEDGER_TABLE} (n, pid) VALUES (%s, %s)", [n, os.getpid()])
    return n


# -- connections under faults (tests/test_task_connections.py) ----------------------------


@task(retry=exponential_backoff(max_attempts=1), timeout=0.02, priority=10)
def times_out_in_atomic() -> None:
    """Enters and leaves empty atomic blocks until its timeout: the TaskTimeout lands in
    Django's transaction bookkeeping as often as not."""
    from django.db import transaction

    while True:
        with transaction.atomic():
            pass


@task(retry=exponential_backoff(max_attempts=1))
def leaks_driver_transaction(n: int) -> int:
    """A raw BEGIN: Django's flags stay at "autocommit, no transaction" while the driver
    has one open (the state a timeout inside atomic() can leave)."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(f"INSERT INTO {LEDGER_TABLE} (n, pid) VALUES (%s, %s)", [n, os.getpid()])
    return n


RECEIPTS_TABLE = "dtp_test_receipts"


def _touch(name: str) -> None:
    marker = _marker(name)
    if marker is not None:
        marker.touch()


def _wait_for_marker(name: str, seconds: float = 30) -> None:
    marker = _marker(name)
    deadline = time.monotonic() + seconds
    while marker is not None and not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


@task(takes_context=True)
def gated(context, gate: str) -> str:  # type: ignore[no-untyped-def]
    """Waits (up to 30 s) for the marker ``gate``; its task_finished writes a receipt."""
    task_id = context.task_result.id
    _touch(f"waiting-{task_id}")
    _wait_for_marker(gate)
    _touch(f"done-{task_id}")
    return gate


@task(takes_context=True)
def gated_pausing_receiver(context, gate: str) -> str:  # type: ignore[no-untyped-def]
    """As ``gated``; its receipt receiver then pauses until the marker ``resume``."""
    return gated.func(context, gate)


def _write_receipt(sender, task_result, **kwargs):  # type: ignore[no-untyped-def]
    """Writes one receipt row per finished gated task, on the task thread's connection,
    and logs whether it could (``receipts.log``): what a receiver that writes does."""
    path = getattr(task_result.task, "module_path", "")
    if path not in (gated.module_path, gated_pausing_receiver.module_path):
        return
    log = _marker("receipts.log")
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {RECEIPTS_TABLE} (task_id, backend_pid) "
                "VALUES (%s, pg_backend_pid()) RETURNING backend_pid",
                [str(task_result.id)],
            )
            (backend_pid,) = cursor.fetchone()
    except Exception as exc:
        if log is not None:
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(f"failed {task_result.id} {type(exc).__name__}\n")
        raise
    if log is not None:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"wrote {task_result.id} {backend_pid}\n")
    if path == gated_pausing_receiver.module_path:
        _touch(f"paused-{backend_pid}")
        _wait_for_marker("resume")


task_finished.connect(_write_receipt, dispatch_uid="dtp-tests-receipts")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class UnprintableAbort(Abort):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@task(retry=exponential_backoff(max_attempts=1))
def raises_unprintable() -> None:
    marker = _marker("unprintable-runs")
    if marker is not None:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write("run\n")
    raise UnprintableError()


@task(retry=NO_WAIT)
def aborts_unprintably() -> None:
    marker = _marker("unprintable-abort-runs")
    if marker is not None:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write("run\n")
    raise UnprintableAbort()


@task(retry=NO_WAIT)
def raises_with_surrogate() -> None:
    raise ValueError("bad file name " + os.fsdecode(b"\xff"))


@task(takes_context=True, retry=exponential_backoff(initial_delay=30, jitter=False))
def fails_with_backoff(context) -> None:  # type: ignore[no-untyped-def]
    """Fails on its first attempt; the retry is due 30 s later by the database's clock."""
    if context.attempt == 1:
        raise ValueError("first attempt fails")


@task(takes_context=True)
def reports_run_after(context) -> str | None:  # type: ignore[no-untyped-def]
    """What the worker's result says the caller asked for: Django's ``task.run_after``."""
    run_after = context.task_result.task.run_after
    return None if run_after is None else run_after.isoformat()


# -- execution middleware (tests/test_middleware.py; the middlewares are tests/middlewares.py)


@task(middleware=["tests.middlewares.task_own", "tests.middlewares.tenfold_second_argument"])
def add_through_middleware(a: int, b: int) -> int:
    marker = _marker("middleware.log")
    if marker is not None:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write(f"task body a={a} b={b}\n")
    return a + b


@task(middleware=["tests.middlewares.slow_start"], timeout=0.3)
def quick_behind_slow_middleware() -> str:
    return "done"


@task(middleware=["tests.middlewares.hold_until_file"], retry=NO_WAIT)
def held_by_middleware(value: int) -> int:
    marker = _marker(f"held-ran-{value}")
    if marker is not None:
        marker.touch()
    return value


@task(middleware=["tests.middlewares.refuses"], retry=NO_WAIT)
def refused_by_middleware() -> None:
    marker = _marker("refused-ran")
    if marker is not None:
        marker.touch()


# -- events (tests/test_events.py): subscribers installed in the worker process ----------
def _install_event_subscribers() -> None:
    """With ``DTP_EVENT_LOG`` set, log every event as a JSON line; with ``DTP_EVENT_RAISE``
    also set, subscribe first a handler that raises on every event."""
    import json
    import threading

    from django_tasks_plus import events

    path = os.environ.get("DTP_EVENT_LOG")
    if not path:
        return
    if os.environ.get("DTP_EVENT_RAISE"):

        def explode(event: events.Event) -> None:
            raise RuntimeError(f"subscriber exploded on {event.name}")

        events.subscribe(explode)
    lock = threading.Lock()

    def record(event: events.Event) -> None:
        line = json.dumps(
            {
                "name": event.name,
                "measurements": dict(event.measurements),
                "metadata": dict(event.labels),
                "thread": threading.current_thread().name,
            },
            default=str,
        )
        with lock, open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    events.subscribe(record)


_install_event_subscribers()


# -- circuit breakers (tests/test_breakers.py) ---------------------------------------------
import json  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from django_tasks_plus import Breaker, DroppedTask  # noqa: E402

# Retried at once, many times: a probe that fails while the host is down spends an attempt.
BREAKER_RETRY = exponential_backoff(initial_delay=0, max_delay=0, max_attempts=50, jitter=False)
# The delivery test's retry: short waits between attempts, never giving up within a test.
DELIVERY_RETRY = exponential_backoff(
    initial_delay=0.2, max_delay=0.5, max_attempts=50, jitter=False
)


def _append(name: str, line: str) -> None:
    marker = _marker(name)
    if marker is not None:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def _host_of(url: str, n: int) -> str:
    return urlsplit(url).netloc


@task(
    retry=DELIVERY_RETRY,
    breaker=Breaker(
        key=_host_of,
        name="http",
        failure_threshold=3,
        failure_window=60,
        recovery_delay=2,
        release_interval=0.2,
        failures=(ConnectionError, OSError, urllib.error.URLError),
    ),
)
def deliver(url: str, n: int) -> int:
    """A webhook delivery: GET ``url?n=N``; anything but 200 raises (503 raises HTTPError)."""
    # The fake host answers at once; the timeout only has to outlast a loaded CI machine.
    with urllib.request.urlopen(f"{url}?n={n}", timeout=10) as response:
        response.read()
        if response.status != 200:
            raise ConnectionError(f"{url} answered {response.status}")
    return n


def _named_host(host: str, n: int, seconds: float = 0.0) -> str | None:
    """The key of the marker-file tasks: ``host``, or a misbehaving key for test hosts."""
    if host == "raises":
        raise LookupError("no route to that host")
    if host == "number":
        return 42  # type: ignore[return-value]
    if host == "none":
        return None
    return host


def _call_host(host: str, n: int, seconds: float) -> int:
    """A call to a pretend remote host: logged to ``calls-<host>`` ("n pid start end");
    raises ConnectionError while the marker ``down-<host>`` exists."""
    started = time.time()
    down = _marker(f"down-{host}")
    if down is not None and down.exists():
        _append(f"calls-{host}", f"{n} {os.getpid()} {started} {time.time()} down")
        raise ConnectionError(f"{host} is down")
    time.sleep(seconds)
    _append(f"calls-{host}", f"{n} {os.getpid()} {started} {time.time()} up")
    return n


@task(
    retry=BREAKER_RETRY,
    breaker=Breaker(
        key=_named_host,
        name="local",
        failure_threshold=2,
        failure_window=60,
        recovery_delay=1,
        release_interval=0.2,
        failures=(ConnectionError,),
    ),
)
def call_host(host: str, n: int, seconds: float = 0.0) -> int:
    return _call_host(host, n, seconds)


@task(
    retry=BREAKER_RETRY,
    breaker=Breaker(
        key=_named_host,
        name="park",
        failure_threshold=3,
        failure_window=60,
        recovery_delay=30,
        release_interval=0.2,
        failures=(ConnectionError,),
    ),
)
def call_parked_host(host: str, n: int, seconds: float = 0.0) -> int:
    """Like call_host, but its circuit waits 30 s before probing: held tasks stay held."""
    return _call_host(host, n, seconds)


@task(
    retry=BREAKER_RETRY,
    breaker=Breaker(
        key=_named_host,
        name="probe",
        failure_threshold=3,
        failure_window=60,
        recovery_delay=30,  # a probe on a slow machine must not go stale
        release_interval=0.2,
        failures=(ConnectionError,),
    ),
)
def call_probed_host(host: str, n: int, seconds: float = 0.0) -> int:
    return _call_host(host, n, seconds)


@task(
    retry=BREAKER_RETRY,
    breaker=Breaker(
        key=_named_host,
        name="halfopen",
        failure_threshold=3,
        failure_window=60,
        recovery_delay=60,
        release_interval=0.05,
        failures=(ConnectionError,),
    ),
)
def call_slow_host(host: str, n: int, seconds: float = 0.0) -> int:
    """Waits until the marker ``up-<host>`` exists (at most a minute), then calls: the
    half-open circuit's probe stays live for as long as a test wants. Its release
    interval is short, so that a task held one by one would be claimed again often."""
    up = _marker(f"up-{host}")
    deadline = time.monotonic() + 60
    while up is not None and not up.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return _call_host(host, n, seconds)


def _state_hook_raises(key: str, old: object, new: object) -> None:
    _append("ttl-state-changes", f"{key} {old} {new}")
    raise RuntimeError("state hook exploded")


def _drop_hook_raises(key: str, dropped: DroppedTask) -> None:
    line = {
        "key": key,
        "task_id": dropped.task_id,
        "task_path": dropped.task_path,
        "args": list(dropped.args),
        "held_since": dropped.held_since.isoformat(),
    }
    _append("ttl-drops", json.dumps(line))
    raise RuntimeError("drop hook exploded")


@task(
    retry=exponential_backoff(max_attempts=1),
    breaker=Breaker(
        key=lambda n: "ttl-host",
        name="ttl",
        failure_threshold=1,
        failure_window=60,
        recovery_delay=60,  # no probe: the held tasks are dropped first, however slow
        held_ttl=1,
        release_interval=0.2,
        failures=(ConnectionError,),
        on_state_change=_state_hook_raises,
        on_drop=_drop_hook_raises,
    ),
)
def held_past_ttl(n: int) -> int:
    """Task 0 fails (opening the circuit); the others are held past their 1 s TTL."""
    if n == 0:
        raise ConnectionError("ttl-host refused the connection")
    _append("ttl-ran", str(n))
    return n


@task(retry=exponential_backoff(max_attempts=1))
def fails_until_redriven(n: int) -> int:
    """Dies on its first run (and leaves a marker); after a redrive it succeeds
    (tests/test_browser.py)."""
    marker = _marker(f"redrive-{n}")
    if marker is not None and not marker.exists():
        marker.touch()
        raise RuntimeError(f"upstream refused order {n}; redrive me once it is back")
    return n


@task(retry=NO_WAIT)
def session_timeouts(until_marker: str | None = None, seconds: float = 60) -> list[list[str]]:
    """The distinct (statement_timeout, lock_timeout) of the sessions this thread got.

    One read; or, with ``until_marker``, reads until that marker exists, closing the
    connection between them: behind a connection pool each read then takes the pool's
    next idle session, so every session the pool hands out meanwhile is looked at."""
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + seconds
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
            )
            seen.add(tuple(cursor.fetchone()))
        marker = _marker(until_marker) if until_marker else None
        if marker is None or marker.exists() or time.monotonic() > deadline:
            return sorted(list(pair) for pair in seen)
        connection.close()
        time.sleep(0.005)


@task(retry=NO_WAIT)
def sleeps_in_database(seconds: float) -> float:
    """One statement that runs ``seconds`` on the database: longer than the worker's
    own statement timeout, which must not apply to it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
    return seconds


# -- times beyond the horizon (tests/test_time_bounds.py) ---------------------------------

LAST_MOMENT = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
ONCE = exponential_backoff(max_attempts=1)


def _count_run(name: str) -> None:
    marker = _marker(f"runs-{name}")
    if marker is not None:
        with open(marker, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")


@task(retry=ONCE)
def defers_to_the_last_moment() -> None:
    """Defers to 9999-12-31 23:59:59.999999 UTC: far past the horizon."""
    _count_run("defers-to-the-last-moment")
    raise TaskDeferred(run_after=LAST_MOMENT)


@task(retry=ONCE)
def defers_for_ever() -> None:
    _count_run("defers-for-ever")
    raise TaskDeferred(delay=dt.timedelta.max)


@task(middleware=["tests.middlewares.holds_past_the_horizon"], retry=ONCE)
def held_past_the_horizon(how: str) -> None:
    _count_run(f"held-past-the-horizon-{how}")


class UnprintableTime(dt.datetime):
    """A time whose text cannot be made: formatting it for a log line raises."""

    def strftime(self, fmt: str) -> str:
        raise RuntimeError("no text for this time")

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        raise RuntimeError("no text for this time")

    def __format__(self, spec: str) -> str:
        raise RuntimeError("no text for this time")


@task(retry=ONCE)
def defers_to_an_unprintable_time() -> None:
    _count_run("defers-to-an-unprintable-time")
    raise TaskDeferred(run_after=UnprintableTime.fromtimestamp(time.time() + 3600, dt.UTC))


from tests import tenancy  # noqa: E402


@task(
    takes_context=True,
    enqueue_middleware=["tests.tenancy.stamp_tenant"],
    middleware=["tests.tenancy.run_as_tenant"],
)
def tenant_report(context: Any, report: str) -> dict[str, Any]:
    """Runs for the tenant its enqueue middleware stamped (tests/tenancy.py)."""
    return {
        "report": report,
        "current_tenant": tenancy.current_tenant.get(),
        "context_tenant": context.metadata.get("tenant"),
    }


@task(takes_context=True)
def reports_occurrence(context) -> list[str]:  # type: ignore[no-untyped-def]
    """The schedule name and occurrence its metadata carries (tests/test_schedules.py)."""
    from django_tasks_plus.schedules import occurrence_of

    found = occurrence_of(context)
    return [] if found is None else [found.schedule, found.at.isoformat()]


GATE = threading.Event()  # tests in this process open it (test_claim_pacing)


@task
def wait_at_gate() -> bool:
    """Block until a test in this process opens ``GATE`` (at most 30 s)."""
    return GATE.wait(30)


class Overlap:
    """How many ``overlap_probe`` attempts ran at once in this process, at most."""

    lock = threading.Lock()
    running = 0
    most = 0


@task
def overlap_probe() -> int:
    """Count itself running for 20 ms (tests/test_task_threads.py reads ``Overlap``)."""
    with Overlap.lock:
        Overlap.running += 1
        Overlap.most = max(Overlap.most, Overlap.running)
    time.sleep(0.02)
    with Overlap.lock:
        Overlap.running -= 1
    return threading.get_ident()
