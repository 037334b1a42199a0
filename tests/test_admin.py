"""The read-only admin pages for tasks and workers."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_tasks_plus.models import TaskRecord
from tests import tasks

pytestmark = pytest.mark.django_db


def test_anonymous_users_are_sent_to_login(client):
    response = client.get(reverse("admin:django_tasks_plus_taskrecord_changelist"))
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_staff_without_permission_is_refused(client, django_user_model):
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    response = client.get(reverse("admin:django_tasks_plus_taskrecord_changelist"))
    assert response.status_code == 403


def test_superuser_sees_tasks_read_only(admin_client):
    result = tasks.add.enqueue(1, 2)
    changelist = admin_client.get(reverse("admin:django_tasks_plus_taskrecord_changelist"))
    assert changelist.status_code == 200
    assert "tests.tasks.add" in changelist.content.decode()
    assert "Add task" not in changelist.content.decode()

    detail = admin_client.get(
        reverse("admin:django_tasks_plus_taskrecord_change", args=[result.id])
    )
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()

    filtered = admin_client.get(
        reverse("admin:django_tasks_plus_taskrecord_changelist") + "?status__exact=FAILED"
    )
    assert "tests.tasks.add" not in filtered.content.decode()

    post = admin_client.post(
        reverse("admin:django_tasks_plus_taskrecord_delete", args=[result.id]), {"post": "yes"}
    )
    assert post.status_code == 403
    assert TaskRecord.objects.filter(pk=result.id).exists()


def test_workers_page(admin_client):
    response = admin_client.get(reverse("admin:django_tasks_plus_workerrecord_changelist"))
    assert response.status_code == 200
