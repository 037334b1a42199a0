"""``OPTIONS["SYNCHRONOUS_CLAIMS"]``: by default a claim's own transaction commits without
waiting for the WAL flush (PostgreSQL's ``synchronous_commit = off``, transaction-local);
with ``True`` it waits. The session's setting, and so every other write of the shared
session (outcomes), is never changed."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.db.postgresql import PostgreSQLDialect
from django_tasks_plus.exceptions import InvalidBackendOptions
from tests import tasks
from tests.conftest import claim_tasks, postgres_only

BACKEND = "django_tasks_plus.backend.DatabaseBackend"


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def test_claims_skip_the_flush_unless_the_option_says_otherwise():
    assert parse_settings("default", {"BACKEND": BACKEND}).synchronous_claims is False
    options = {"SYNCHRONOUS_CLAIMS": True}
    assert parse_settings("default", {"BACKEND": BACKEND, "OPTIONS": options}).synchronous_claims
    for bad in ("yes", 1, None):
        with pytest.raises(InvalidBackendOptions, match=r"\['SYNCHRONOUS_CLAIMS'\] must be True"):
            parse_settings("default", {"BACKEND": BACKEND, "OPTIONS": {"SYNCHRONOUS_CLAIMS": bad}})


@pytest.mark.parametrize(("synchronous", "inside"), [(False, "off"), (True, "on")])
@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
@postgres_only
def test_the_claim_sets_its_own_transaction_s_commit_and_nothing_else(
    synchronous: bool, inside: str
):
    """Seen from inside the claim's transaction (an explicit one here; a worker's claim
    is a transaction of its own): the claim turned synchronous_commit off for it, or
    left it; once it ends, the session has its own value back."""
    result = tasks.add.enqueue(1, 2)
    session = _synchronous_commit()
    with transaction.atomic():
        [claimed] = claim_tasks(1, synchronous=synchronous)
        assert claimed.id == result.id
        assert _synchronous_commit() == inside
    assert _synchronous_commit() == session == "on"
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING  # the claim committed all the same
    # Autocommit, as the worker runs it: the claim lands and the session is untouched.
    second = tasks.add.enqueue(3, 4)
    [claimed] = claim_tasks(1, synchronous=synchronous)
    assert claimed.id == second.id and _synchronous_commit() == "on"


@pytest.mark.parametrize("option", [None, True])
@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
@postgres_only
def test_a_worker_claims_as_its_backend_s_option_says(option: bool | None, settings, monkeypatch):
    """A burst worker in this process: its claims ask for the commit the backend's
    option gives (the dialect's own claim runs; the wrapper only notes the argument)."""
    from django_tasks_plus.worker.config import WorkerConfig
    from django_tasks_plus.worker.engine import Worker

    if option is not None:
        default = settings.TASKS["default"]
        options = {**default.get("OPTIONS", {}), "SYNCHRONOUS_CLAIMS": option}
        settings.TASKS = {**settings.TASKS, "default": {**default, "OPTIONS": options}}
    asked: list[bool] = []
    claim = PostgreSQLDialect.claim

    def noting(self: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["synchronous"])
        return claim(self, *args, **kwargs)

    monkeypatch.setattr(PostgreSQLDialect, "claim", noting)
    results = [tasks.add.enqueue(n, n) for n in range(3)]
    assert Worker(WorkerConfig.from_settings("default", burst=True)).run() == 0
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert asked and set(asked) == {option is True}
