"""Schema facts: migrations in sync, claim index present, queue grouping by doer."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from django_tasks_plus.conf import parse_settings
from django_tasks_plus.models import TaskRecord
from django_tasks_plus.worker.doers import AgeDoer, BalancedDoer, UnlimitedDoer
from django_tasks_plus.worker.engine import build_groups


@pytest.mark.django_db
def test_migrations_match_the_models():
    out = io.StringIO()
    call_command("makemigrations", "django_tasks_plus", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_partial_claim_index_exists():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TaskRecord._meta.db_table)
    index = constraints["dtp_task_claim_idx"]
    assert index["index"]
    assert index["columns"] == ["backend_name", "queue_name", "priority", "run_after", "id"]
    assert "dtp_task_ready_idx" not in constraints


def test_queues_share_the_default_doer_unless_configured():
    settings = parse_settings(
        "default",
        {
            "QUEUES": ["a", "b", "c", "d"],
            "OPTIONS": {
                "DOER": "age",
                "QUEUES_CONFIG": {"c": {"doer": "balanced", "limit": 2}, "d": "unlimited"},
            },
        },
    )
    groups = build_groups(settings, ["a", "b", "c", "d"])
    assert [group.queues for group in groups] == [("a", "b"), ("c",), ("d",)]
    assert isinstance(groups[0].doer, AgeDoer)
    assert isinstance(groups[1].doer, BalancedDoer)
    assert groups[1].doer.limit == 2
    assert isinstance(groups[2].doer, UnlimitedDoer)
    assert groups[0].doer is not groups[2].doer
