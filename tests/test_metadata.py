"""Task metadata and enqueue middleware: the open envelope (docs/tasks.md#metadata,
docs/middleware.md#enqueue-middleware).

The tenant feature of tests/tenancy.py is built on them alone (no engine module, no
migration) and runs here through a real worker, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_tasks_plus import (
    EnqueueRefused,
    InvalidTaskArguments,
    InvalidTaskOptions,
    PayloadTooLarge,
    events,
    get_metadata,
    redrive,
)
from django_tasks_plus.compat import TaskResultStatus, task_backends
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.envelope import EnqueueHandler, Envelope
from django_tasks_plus.exceptions import CorruptTaskRecord, InvalidBackendOptions
from django_tasks_plus.limits import METADATA_MAX_BYTES
from django_tasks_plus.metadata import KEYS, MetadataKeys, decode_metadata, register_key
from django_tasks_plus.models import TaskRecord
from tests import tasks, tenancy

BACKEND = "django_tasks_plus.backend.DatabaseBackend"
RUN_KEY = "test.last_run_note"
CALL_KEY = "test.group"


def _stamp(**items: Any):  # type: ignore[no-untyped-def]
    """An enqueue middleware adding ``items`` to the metadata."""

    def factory(call_next: EnqueueHandler) -> EnqueueHandler:
        def middleware(envelope: Envelope) -> Any:
            return call_next(envelope.with_metadata(**items))

        return middleware

    return factory


def _recording(label: str, seen: list[Any]):  # type: ignore[no-untyped-def]
    def factory(call_next: EnqueueHandler) -> EnqueueHandler:
        def middleware(envelope: Envelope) -> Any:
            seen.append((label, dict(envelope.metadata), connection.in_atomic_block))
            results = call_next(envelope.with_metadata(**{label: True}))
            seen.append((f"{label} out", len(results)))
            return results

        return middleware

    return factory


@pytest.fixture
def enqueue_middleware() -> Iterator[Any]:
    """Set the default backend's OPTIONS['ENQUEUE_MIDDLEWARE'] for one test."""
    overrides: list[Any] = []

    def configure(*factories: Any) -> None:
        default = settings.TASKS["default"]
        options = {**default.get("OPTIONS", {}), "ENQUEUE_MIDDLEWARE": list(factories)}
        override = override_settings(TASKS={"default": {**default, "OPTIONS": options}})
        override.enable()
        overrides.append(override)

    yield configure
    for override in reversed(overrides):
        override.disable()


@pytest.fixture
def run_key() -> Iterator[str]:
    register_key(RUN_KEY, lifetime="run")
    yield RUN_KEY
    KEYS.unregister(RUN_KEY)


# -- the tenant feature, through a real worker -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_tenant_stamped_at_enqueue_is_current_while_the_task_runs(run_worker):
    with tenancy.acting_for("acme"):
        acme = tasks.tenant_report.enqueue("sales")
    with tenancy.acting_for("globex"):
        globex = tasks.tenant_report.enqueue("churn")

    assert dict(get_metadata(acme)) == {"tenant": "acme"}  # readable before it runs
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr

    for result, tenant, report in ((acme, "acme", "sales"), (globex, "globex", "churn")):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
        assert result.return_value == {
            "report": report,
            "current_tenant": tenant,  # the execution middleware read it back
            "context_tenant": tenant,  # and TaskContext.metadata shows it
        }
        assert dict(get_metadata(result.id)) == {"tenant": tenant}


@pytest.mark.django_db
def test_an_enqueue_without_a_tenant_is_refused_and_writes_nothing():
    with pytest.raises(EnqueueRefused, match=r"tests\.tasks\.tenant_report needs a current tenant"):
        tasks.tenant_report.enqueue("sales")
    assert not TaskRecord.objects.exists()


# -- metadata ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metadata_follows_the_codec_and_is_read_back_decoded(enqueue_middleware):
    when = dt.datetime(2026, 3, 1, 9, 30, tzinfo=dt.UTC)
    stamp = {"at": when, "amount": Decimal("1.50"), "ids": (1, 2), "run": uuid.UUID(int=7)}
    enqueue_middleware(_stamp(**stamp))
    result = tasks.add.enqueue(1, 2)
    assert dict(get_metadata(result)) == stamp
    assert TaskRecord.objects.get(pk=result.id).metadata["at"] == {
        "__dtp__": "datetime",
        "v": "2026-03-01T09:30:00+00:00",
    }


@pytest.mark.django_db
def test_a_task_without_metadata_stores_an_empty_map():
    result = tasks.add.enqueue(1, 2)
    assert TaskRecord.objects.get(pk=result.id).metadata == {}
    assert dict(get_metadata(result)) == {}


@pytest.mark.parametrize(
    ("items", "error", "message"),
    [
        ({"when": dt.datetime(2026, 1, 1)}, None, None),  # naive datetimes are kept as such
        ({"handle": object()}, InvalidTaskArguments, r"metadata\['handle'\]"),
        ({"bad key": 1}, InvalidTaskArguments, "metadata key 'bad key' may hold only"),
        ({"text": "x\x00y"}, InvalidTaskArguments, "NUL"),
        ({"blob": "x" * METADATA_MAX_BYTES}, PayloadTooLarge, "encoded metadata is"),
    ],
)
@pytest.mark.django_db
def test_bad_metadata_is_refused_with_a_typed_error_and_nothing_written(
    enqueue_middleware, items, error, message
):
    enqueue_middleware(_stamp(**items))
    if error is None:
        tasks.add.enqueue(1, 2)
        return
    with pytest.raises(error, match=message):
        tasks.add.enqueue(1, 2)
    assert not TaskRecord.objects.exists()


@pytest.mark.django_db
def test_a_redrive_clears_per_run_keys_and_keeps_per_call_keys(enqueue_middleware, run_key):
    enqueue_middleware(_stamp(**{run_key: "held 3 times", CALL_KEY: "g-1"}))
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=result.id).update(status=TaskResultStatus.FAILED)

    assert redrive(result)
    assert dict(get_metadata(result)) == {CALL_KEY: "g-1"}
    assert TaskRecord.objects.get(pk=result.id).status == TaskResultStatus.READY


@pytest.mark.django_db
def test_a_redrive_leaves_a_map_that_is_not_an_object_alone(run_key):
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=result.id).update(
        status=TaskResultStatus.FAILED, metadata=["not", "a", "map"]
    )
    assert redrive(result)
    with pytest.raises(CorruptTaskRecord) as info:
        get_metadata(result)
    assert info.value.column == "metadata"


def test_a_key_is_declared_with_one_lifetime():
    keys = MetadataKeys()
    assert keys.register("trace", lifetime="call") == keys.register("trace", lifetime="call")
    with pytest.raises(ValueError, match="already declared with lifetime 'call'"):
        keys.register("trace", lifetime="run")
    with pytest.raises(ValueError, match="lifetime must be 'call'"):
        keys.register("other", lifetime="forever")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="may hold only letters"):
        keys.register("a b")
    keys.register("held", lifetime="run")
    assert keys.run_keys() == ("held",)
    assert keys.get("undeclared").lifetime == "call"


def test_stored_metadata_that_no_enqueue_writes_is_refused():
    assert decode_metadata({}) == {}
    assert decode_metadata(None) == {}
    with pytest.raises(ValueError, match="not an object"):
        decode_metadata([1])
    with pytest.raises(ValueError, match="unknown"):
        decode_metadata({"x": {"__dtp__": "nope", "v": 1}})


@pytest.mark.django_db(transaction=True)
def test_a_row_with_corrupt_metadata_is_dead_lettered_not_run(run_worker):
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=result.id).update(metadata={"x": {"__dtp__": "nope", "v": 1}})
    proc = run_worker("--burst")
    assert proc.returncode == 0, proc.stderr
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskResultStatus.FAILED
    assert "metadata" in row.dead_letter_reason


# -- enqueue middleware ------------------------------------------------------------------------


@pytest.mark.django_db
def test_backend_enqueue_middleware_wraps_the_tasks_own(enqueue_middleware):
    seen: list[Any] = []
    enqueue_middleware(_recording("outer", seen), _recording("inner", seen))
    in_test_transaction = connection.in_atomic_block
    with tenancy.acting_for("acme"):
        result = tasks.tenant_report.enqueue("sales")
    assert seen == [
        ("outer", {}, in_test_transaction),
        ("inner", {"outer": True}, in_test_transaction),
        ("inner out", 1),
        ("outer out", 1),
    ]
    assert dict(get_metadata(result)) == {"outer": True, "inner": True, "tenant": "acme"}


@pytest.mark.django_db(transaction=True)
def test_enqueue_middleware_runs_in_the_callers_transaction_and_opens_none(enqueue_middleware):
    seen: list[Any] = []
    enqueue_middleware(_recording("mw", seen))
    tasks.add.enqueue(1, 2)  # autocommit: one INSERT, no transaction around the middleware
    tasks.add.enqueue_many([((1, 2), {}), ((3, 4), {})])  # its transaction is inside the chain
    with transaction.atomic():
        tasks.add.enqueue(5, 6)
        transaction.set_rollback(True)
    assert [entry[2] for entry in seen if len(entry) == 3] == [False, False, True]
    assert TaskRecord.objects.count() == 3  # the rolled-back call left nothing


@pytest.mark.django_db
def test_enqueue_middleware_may_change_the_calls_options(enqueue_middleware):
    def to_bulk(call_next: EnqueueHandler) -> EnqueueHandler:
        def middleware(envelope: Envelope) -> Any:
            return call_next(envelope.using(priority=7, ordering_key="k"))

        return middleware

    enqueue_middleware(to_bulk)
    results = tasks.add.enqueue_many([((1, 2), {}), ((3, 4), {})])
    rows = TaskRecord.objects.filter(pk__in=[r.id for r in results])
    assert {(row.priority, row.ordering_key) for row in rows} == {(7, "k")}
    assert {result.task.priority for result in results} == {7}


@pytest.mark.django_db
def test_enqueue_middleware_may_not_swap_the_task_or_pass_something_else(enqueue_middleware):
    def swap(call_next: EnqueueHandler) -> EnqueueHandler:
        def middleware(envelope: Envelope) -> Any:
            return call_next(dataclasses.replace(envelope, task=tasks.always_fails))

        return middleware

    enqueue_middleware(swap)
    with pytest.raises(InvalidTaskOptions, match="replaced the task"):
        tasks.add.enqueue(1, 2)

    enqueue_middleware(lambda call_next: lambda envelope: call_next({"not": "an envelope"}))
    with pytest.raises(TypeError, match="not an Envelope"):
        tasks.add.enqueue(1, 2)
    assert not TaskRecord.objects.exists()


@pytest.mark.django_db
def test_enqueue_middleware_that_returns_no_results_is_named(enqueue_middleware):
    enqueue_middleware(lambda call_next: lambda envelope: None)
    with pytest.raises(TypeError, match="not the list of results"):
        tasks.add.enqueue(1, 2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["tests.nowhere.mw"], r"\['ENQUEUE_MIDDLEWARE'\]\[0\] names 'tests.nowhere.mw'"),
        ([42], r"\['ENQUEUE_MIDDLEWARE'\]\[0\] is 42, not a callable.*function of the envelope"),
        ("tests.tenancy.stamp_tenant", "must be a list"),
    ],
)
def test_bad_enqueue_middleware_settings_are_refused(value, message):
    with pytest.raises(InvalidBackendOptions, match=message):
        parse_settings("default", {"BACKEND": BACKEND, "OPTIONS": {"ENQUEUE_MIDDLEWARE": value}})


def test_a_tasks_bad_enqueue_middleware_is_refused_at_definition():
    with pytest.raises(InvalidTaskOptions, match=r"enqueue_middleware\[0\] names 'nope.mw'"):
        dataclasses.replace(tasks.add, enqueue_middleware=["nope.mw"])
    with pytest.raises(InvalidTaskOptions, match="function of the envelope"):
        dataclasses.replace(tasks.add, enqueue_middleware=[42])
    # A list is kept as a tuple, so the definition stays hashable.
    defined = dataclasses.replace(tasks.add, enqueue_middleware=[tenancy.stamp_tenant])
    assert defined.enqueue_middleware == (tenancy.stamp_tenant,)
    assert tasks.tenant_report.enqueue_middleware == ("tests.tenancy.stamp_tenant",)


def test_settings_accept_enqueue_middleware_by_path():
    options = {"ENQUEUE_MIDDLEWARE": ["tests.tenancy.stamp_tenant"]}
    parsed = parse_settings("default", {"BACKEND": BACKEND, "OPTIONS": options})
    assert parsed.enqueue_middleware == (tenancy.stamp_tenant,)
    assert task_backends["default"].settings.enqueue_middleware == ()


# -- names ------------------------------------------------------------------------------------


def test_event_labels_keep_a_deprecated_metadata_alias():
    event = events.Event("task.enqueued", {"count": 1}, {"queue": "default"}, 0.0)
    assert event.labels == {"queue": "default"}
    with pytest.deprecated_call():
        assert event.metadata == {"queue": "default"}


# -- the migration ------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_adding_the_metadata_column_does_not_rewrite_the_table():
    """A constant default is recorded in the catalogue on PostgreSQL 11+: no table rewrite
    (the table's file stays the same) and no lock held for the size of the table."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    from django.core.management import call_command

    tasks.add.enqueue(1, 2)
    before_file = _table_file()
    call_command("migrate", "django_tasks_plus", "0011", verbosity=0)
    try:
        assert not _has_metadata_column()
        dropped_file = _table_file()
        call_command("migrate", "django_tasks_plus", "0012", verbosity=0)
        assert _has_metadata_column()
        assert _table_file() == dropped_file
        assert list(TaskRecord.objects.values_list("metadata", flat=True)) == [{}]
    finally:
        call_command("migrate", "django_tasks_plus", verbosity=0)
    assert before_file is not None


def _table_file() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_filenode('django_tasks_plus_taskrecord')")
        return cursor.fetchone()[0]


def _has_metadata_column() -> bool:
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(
            cursor, "django_tasks_plus_taskrecord"
        )
    return "metadata" in {column.name for column in columns}


# -- the admin ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admin_task_page_shows_the_metadata(admin_client):
    from django.urls import reverse

    with tenancy.acting_for("acme &amp; co"):
        stamped = tasks.tenant_report.enqueue("sales")
    plain = tasks.add.enqueue(1, 2)
    page = admin_client.get(
        reverse("admin:django_tasks_plus_taskrecord_change", args=[stamped.id])
    ).content.decode()
    assert "metadata" in page
    assert "&quot;tenant&quot;: &quot;acme &amp;amp; co&quot;" in page  # escaped, as JSON
    listing = admin_client.get(reverse("admin:django_tasks_plus_taskrecord_changelist"))
    assert listing.status_code == 200
    page = admin_client.get(reverse("admin:django_tasks_plus_taskrecord_change", args=[plain.id]))
    assert page.status_code == 200
