"""Fixtures that start real ``runtasks`` processes against the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
from django.db import connection
from django.test import Client

if TYPE_CHECKING:
    from django_tasks_plus.models import WorkerRecord
    from django_tasks_plus.worker.heartbeat import Heartbeat

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"


def database_url() -> str:
    """A DATABASE_URL naming the *test* database, for worker subprocesses."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    if connection.vendor == "postgresql":
        user = quote(settings.get("USER") or "")
        password = settings.get("PASSWORD") or ""
        auth = f"{user}:{quote(password)}@" if password else (f"{user}@" if user else "")
        host = settings.get("HOST") or "localhost"
        port = settings.get("PORT") or 5432
        return f"postgres://{auth}{host}:{port}/{settings['NAME']}"
    raise RuntimeError(f"no subprocess URL for {connection.vendor}")


def worker_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "testproject")])
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    env["DTP_TEST_MARKERS"] = str(tmp_path)
    env["DTP_SIGNAL_LOG"] = str(tmp_path / "signals.log")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def runtasks_command(*args: str) -> list[str]:
    return [sys.executable, str(MANAGE), "runtasks", *args]


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def run_worker(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``runtasks ARGS`` to completion (normally with --burst) and return its output;
    ``env`` adds to (or overrides) the worker's environment."""

    def run(
        *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            runtasks_command(*args),
            env={**worker_env(tmp_path), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return proc

    return run


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``runtasks ARGS`` in the background; every process is killed at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """``env``: variables set for this worker only, over ``worker_env()``."""
        log = open(tmp_path / f"worker-{len(started)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            runtasks_command(*args),
            env={**worker_env(tmp_path), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def assert_index_migration_runs_concurrently(
    migration: str, built: str, *, constraint: bool = False
) -> None:
    """``migration`` (of this app) is non-atomic, made of the concurrent index operations
    only (``constraint``: of a unique constraint with a condition), and the index
    ``built`` it left is valid (PostgreSQL: an interrupted ``CREATE INDEX CONCURRENTLY``
    leaves an invalid one behind)."""
    from importlib import import_module

    from django_tasks_plus.db.migration_operations import (
        AddConstraintConcurrently,
        AddIndexConcurrently,
        RemoveConstraintConcurrently,
        RemoveIndexConcurrently,
    )

    module = import_module(f"django_tasks_plus.migrations.{migration}")
    assert module.Migration.atomic is False
    expected = (
        [AddConstraintConcurrently, RemoveConstraintConcurrently]
        if constraint
        else [AddIndexConcurrently, RemoveIndexConcurrently]
    )
    assert [type(operation) for operation in module.Migration.operations] == expected
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [built]
            )
            assert cursor.fetchone() == (True,)


def claim_tasks(
    limit: int = 16,
    *,
    queues: Sequence[str] = ("default",),
    worker_id: str = "in-process",
    visibility_timeout: float = 300,
    synchronous: bool = True,
) -> list[Any]:
    """Claim up to ``limit`` due tasks of ``queues`` as ``worker_id``, as a worker would,
    on this test's connection (a negative ``visibility_timeout`` hands out leases that
    have already expired; ``synchronous=False``: as a worker with the default
    ``SYNCHRONOUS_CLAIMS``)."""
    import uuid

    from django_tasks_plus.db import dialect_for

    return dialect_for(connection).claim(
        connection,
        backend_name="default",
        queues=list(queues),
        limit=limit,
        worker_id=worker_id,
        lease_token=uuid.uuid4().hex,
        visibility_timeout=visibility_timeout,
        synchronous=synchronous,
    )


def claim_one(worker_id: str = "in-process", visibility_timeout: float = 300) -> Any:
    """Claim the next task of the default queue (``claim_tasks``); fails if there is none."""
    [claimed] = claim_tasks(1, worker_id=worker_id, visibility_timeout=visibility_timeout)
    return claimed


def idle_claim_parameters(visibility_timeout: float = 300.0) -> list[Any]:
    """The worker's claim statement's parameters for up to 16 tasks of the default queue
    (``db/postgresql.claim_parameters``), as a test EXPLAINs it."""
    from django_tasks_plus.db.postgresql import claim_parameters

    return claim_parameters(
        backend_name="default",
        queues=["default"],
        filter_params=[],
        limit=16,
        lease_token="token",
        visibility_timeout=visibility_timeout,
        worker_id="worker",
    )


def worker_row(
    worker_id: str = "w-1", *, silent_for: timedelta = timedelta(0), **fields: Any
) -> WorkerRecord:
    """A worker's row as ``runtasks`` registers it, whose last heartbeat came
    ``silent_for`` ago (and which started then too); ``fields`` set any other column.

    For the states a test cannot wait for cheaply: a worker long silent, a leader gone.
    """
    from django.utils import timezone

    from django_tasks_plus.models import WorkerRecord

    beat = timezone.now() - silent_for
    values: dict[str, Any] = {
        "backend_name": "default",
        "hostname": "h",
        "pid": 1,
        "queues": ["default"],
        "concurrency": 1,
        "started_at": beat,
        "last_heartbeat_at": beat,
    }
    return WorkerRecord.objects.create(worker_id=worker_id, **{**values, **fields})


def heartbeat_of(worker_id: str, *, visibility_timeout: float, **options: Any) -> Heartbeat:
    """The default backend's ``Heartbeat`` for ``worker_id``, whose row the test made
    (``worker_row``): it holds no leases, loses none, and reads the host's clock;
    ``options`` pass the heartbeat's other keywords (``status=``, ``holding=``)."""
    from django.utils import timezone

    from django_tasks_plus.compat import task_backends
    from django_tasks_plus.worker.heartbeat import Heartbeat

    return Heartbeat(
        task_backends["default"],
        worker_id=worker_id,
        register=lambda at: pytest.fail("the row exists: nothing to register"),
        leases=list,
        on_lost=lambda lost: None,
        clock=timezone.now,
        visibility_timeout=visibility_timeout,
        **options,
    )


# A PostgreSQL URL nothing listens on (port 1): psycopg is installed in every test
# environment, so workers pointed at it fail to start beside SQLite too.
REFUSED_DATABASE = "postgres://root@127.0.0.1:1/nowhere"


def wait_for(
    condition: Callable[[], bool],
    timeout: float = 30,
    interval: float = 0.05,
    seen: Callable[[], object] | None = None,
) -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds, naming
    what ``seen()`` reads then (when given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    found = f"; found {seen()!r}" if seen is not None else ""
    raise AssertionError(f"condition not met within {timeout} s{found}")


def admin_client_for(
    role: str,
    user_model: Any,
    *,
    view: Sequence[str],
    actions: Sequence[str],
    enforce_csrf: bool = False,
) -> Client:
    """A test client for one role of the admin's permission matrix: ``anonymous``,
    ``non_staff``, ``staff_no_perms``, ``staff_view_only`` (the ``view`` permissions),
    ``operator`` (``view`` and ``actions``) or ``superuser``."""
    from django.contrib.auth.models import Permission  # needs the app registry

    client = Client(enforce_csrf_checks=enforce_csrf)
    if role == "anonymous":
        return client
    user = user_model.objects.create_user(
        role, password="pw", is_staff=role != "non_staff", is_superuser=role == "superuser"
    )
    codenames = {
        # A non-staff user holding every permission still may not use the admin.
        "non_staff": (*view, *actions),
        "staff_view_only": tuple(view),
        "operator": (*view, *actions),
    }.get(role, ())
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def worker_log(tmp_path: Path, index: int = 0) -> str:
    return (tmp_path / f"worker-{index}.log").read_text()


# Django's default hasher (PBKDF2) spends ~0.3 s on each test user's password; the tests
# never need a strong hash. Test runs only: the settings module stays as the demo uses it.
FAST_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    settings.PASSWORD_HASHERS = FAST_PASSWORD_HASHERS


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the metrics this process counted (docs/metrics.md): its exit-time flush would
    otherwise write them to the development database after the test one is gone."""
    from django_tasks_plus import registries

    if registries.installed_app() is not None:
        registries.app().aggregator.reset()


@pytest.fixture(autouse=True)
def _fresh_registries() -> Iterator[None]:
    """Each test starts from the app's own registries (``registries.reset()``): no
    subscriber, event name, counter or extension a previous test left, nothing counted in
    this process (a previous test's counts must not be flushed into this test's
    database), and as if it had just flushed: an enqueue-side event flushes on emit only
    when the last flush is FLUSH_INTERVAL old, so otherwise whether it does would depend
    on how slow the run is. A test of that flush sets ``aggregator().last_flush`` back."""
    from django_tasks_plus import registries

    registries.reset()
    yield


postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL only")


@pytest.fixture
def ledger() -> Iterator[str]:
    """The scratch table that ledger-writing test tasks insert into, dropped afterwards."""
    from tests.tasks import LEDGER_TABLE

    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {LEDGER_TABLE} (n integer NOT NULL, pid integer)")
    yield LEDGER_TABLE
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {LEDGER_TABLE}")
