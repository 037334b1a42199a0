"""Live pages (admin/live.py): the JSON views ``live.js`` polls for the overview, a task's
page and the task lists. Who may read them, that they are never cached, that they follow
the database between two calls, that a region is the HTML the page itself draws, and the
clear error each bad request gets. The browser half is in tests/test_browser.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus.admin import live
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import admin_client_for

pytestmark = pytest.mark.django_db

PREFIX = "admin:django_tasks_plus_taskrecord_"
CHANGELIST = PREFIX + "changelist"


def overview_live() -> str:
    return reverse(PREFIX + "overview_live")


def task_live(pk: object) -> str:
    return reverse(PREFIX + "live", args=[pk])


def list_live(query: str = "") -> str:
    return reverse(PREFIX + "live_changelist") + query


def regions(response) -> dict[str, str]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["interval"] == live.INTERVAL
    return body["regions"]


def client_for(role: str, django_user_model) -> Client:
    return admin_client_for(role, django_user_model, view=("view_taskrecord",), actions=())


def card(cards: str, label: str) -> str:
    """The number on one of the overview's cards."""
    found = re.search(
        rf'<span class="dtp-card-value">([^<]*)</span><span class="dtp-card-label">{label}<',
        cards,
    )
    assert found, cards
    return found.group(1)


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("anonymous", "login"),
        ("non_staff", "login"),
        ("staff_no_perms", 403),
        ("staff_view_only", 200),
    ],
)
@pytest.mark.parametrize("page", ["overview", "task", "list", "dead letters"])
def test_who_may_read_the_live_views(role, expected, page, django_user_model):
    record = tasks.add.enqueue(1, 2)
    url: Callable[[], str] = {
        "overview": overview_live,
        "task": lambda: task_live(record.id),
        "list": lambda: list_live("?queue_name=default"),
        "dead letters": lambda: reverse(PREFIX + "live_deadletters"),
    }[page]
    response = client_for(role, django_user_model).get(url())
    if expected == "login":
        assert response.status_code == 302 and "/login/" in response["Location"]
    else:
        assert response.status_code == expected
    if expected == 200:
        assert regions(response)
        cache = response["Cache-Control"]
        assert "no-cache" in cache and "no-store" in cache and "max-age=0" in cache


def test_the_overview_counts_again_at_each_call(admin_client):
    tasks.add.enqueue(1, 2)
    first = regions(admin_client.get(overview_live()))
    assert set(first) == {"dtp-live-cards", "dtp-queues", "dtp-breakers"}
    assert card(first["dtp-live-cards"], "due now") == "1"
    assert card(first["dtp-live-cards"], "dead") == "0"

    tasks.add.enqueue(3, 4)
    TaskRecord.objects.filter(pk=tasks.always_fails.enqueue("x").id).update(
        status=TaskResultStatus.FAILED, finished_at=timezone.now()
    )
    second = regions(admin_client.get(overview_live()))
    assert card(second["dtp-live-cards"], "due now") == "2"
    assert card(second["dtp-live-cards"], "dead") == "1"
    assert "dtp-bad" in second["dtp-queues"]  # the queue's dead count, linked


def test_a_region_is_the_html_the_page_draws(admin_client):
    """One source: the page includes the template the JSON view renders. (A scheduled
    task: a due one's age would differ between the two reads.)"""
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    page = admin_client.get(reverse(PREFIX + "overview")).content.decode()
    found = regions(admin_client.get(overview_live()))
    for region_id in ("dtp-live-cards", "dtp-queues", "dtp-breakers"):
        assert f'id="{region_id}" data-dtp-live-region>' in page
        assert found[region_id] in page, region_id
    assert 'class="dtp-live" data-dtp-live-url="/admin/' in page
    assert "django_tasks_plus/live.js" in page
    assert "<script>" not in page  # no inline script for a strict CSP to block


def test_the_task_page_follows_its_task(admin_client):
    record = tasks.add.enqueue(1, 2)
    page = admin_client.get(reverse(PREFIX + "change", args=[record.id])).content.decode()
    assert f'data-dtp-live-url="{task_live(record.id)}"' in page
    before = regions(admin_client.get(task_live(record.id)))
    assert set(before) == {
        "dtp-live-subtitle",
        "dtp-live-actions",
        "dtp-live-callouts",
        "dtp-live-fields",
        "dtp-live-attempts",
    }
    assert "dtp-badge-ready" in before["dtp-live-fields"]
    assert "[READY]" in before["dtp-live-subtitle"]
    # The page's heading is the same region, so it follows the task too.
    assert (
        f'<h2 id="dtp-live-subtitle" data-dtp-live-region>{before["dtp-live-subtitle"]}</h2>'
        in page
    )
    assert "Cancel task" in before["dtp-live-actions"]
    assert "csrfmiddlewaretoken" in before["dtp-live-actions"]  # the buttons still POST
    assert "No attempt yet." in before["dtp-live-attempts"]

    now = timezone.now()
    TaskRecord.objects.filter(pk=record.id).update(
        status=TaskResultStatus.SUCCESSFUL,
        attempt=1,
        started_at=now,
        last_attempted_at=now,
        finished_at=now,
        return_value=3,
        worker_ids=["web-1:42:abc"],
    )
    after = regions(admin_client.get(task_live(record.id)))
    assert "dtp-badge-successful" in after["dtp-live-fields"]
    assert "[SUCCESSFUL]" in after["dtp-live-subtitle"]
    assert "dtp-badge-ready" not in after["dtp-live-fields"]
    assert "field-return_json" in after["dtp-live-fields"]
    assert "Cancel task" not in after["dtp-live-actions"]
    assert "Delete task" in after["dtp-live-actions"]
    assert "web-1:42:abc" in after["dtp-live-attempts"]


def test_the_live_views_only_answer_gets(admin_client):
    record = tasks.add.enqueue(1, 2)
    for url in (overview_live(), task_live(record.id), list_live()):
        assert admin_client.post(url).status_code == 405, url


def test_a_deleted_task_stops_its_page_with_a_reason(admin_client):
    record = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=record.id).delete()
    response = admin_client.get(task_live(record.id))
    assert response.status_code == 404
    assert response.json() == {"error": "this task no longer exists"}


def live_url_of_list(client: Client, query: str) -> str:
    """The JSON view a list page names, with the rows it drew."""
    page = client.get(reverse(CHANGELIST) + query)
    assert page.status_code == 200
    return page.context["live_url"]


def test_the_queue_list_says_what_is_new_or_changed(admin_client):
    kept = tasks.add.enqueue(1, 1)
    finishing = tasks.add.enqueue(2, 2)
    leaving = tasks.add.enqueue(3, 3)
    tasks.echo.enqueue("another queue: never on this list")
    url = live_url_of_list(admin_client, "?queue_name=default")
    shown = parse_qs(urlsplit(url).query)
    assert shown["queue_name"] == ["default"]
    assert len(shown[live.ROWS_PARAM][0].split(",")) == 3

    unchanged = regions(admin_client.get(url))
    assert unchanged == {"dtp-live-list": unchanged["dtp-live-list"]}
    assert "dtp-live-notice" not in unchanged["dtp-live-list"]

    tasks.add.enqueue(4, 4)
    TaskRecord.objects.filter(pk=finishing.id).update(
        status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now()
    )
    TaskRecord.objects.filter(pk=leaving.id).delete()
    notice = regions(admin_client.get(url))["dtp-live-list"]
    assert "1 new, 1 changed, 1 no longer on it" in notice
    assert 'href="/admin/django_tasks_plus/taskrecord/?queue_name=default"' in notice
    assert TaskRecord.objects.filter(pk=kept.id).exists()


def test_the_dead_letters_say_when_a_redriven_task_leaves(admin_client):
    dead = tasks.always_fails.enqueue("x")
    TaskRecord.objects.filter(pk=dead.id).update(
        status=TaskResultStatus.FAILED, finished_at=timezone.now()
    )
    page = admin_client.get(reverse(PREFIX + "deadletters"))
    url = page.context["live_url"]
    assert url.startswith(reverse(PREFIX + "live_deadletters"))
    assert "dtp-live-notice" not in regions(admin_client.get(url))["dtp-live-list"]
    TaskRecord.objects.filter(pk=dead.id).update(status=TaskResultStatus.READY)
    notice = regions(admin_client.get(url))["dtp-live-list"]
    assert "0 new, 0 changed, 1 no longer on it" in notice


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (f"?{live.ROWS_PARAM}=zzz", "live_rows must be tokens like 'a1b2c3d4.0f1e2d'"),
        (f"?{live.ROWS_PARAM}=" + ",".join(["a1b2c3d4.0f1e2d"] * 1001), "at most 1000"),
        ("?queue=nowhere&bogus=1", "bogus"),
        ("?status__exact=NOPE", "NOPE"),
    ],
)
def test_a_list_request_it_cannot_answer_gets_a_clear_error(admin_client, query, message):
    response = admin_client.get(list_live(query))
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_an_unknown_backend_on_the_overview_gets_a_clear_error(admin_client):
    response = admin_client.get(overview_live() + "?backend=nope")
    assert response.status_code == 400
    assert "no django-tasks-plus backend named 'nope'" in response.json()["error"]


def test_rows_compare_by_id_and_state():
    one, two, three = (live.row_token(pk, "READY", 0) for pk in ("a" * 8, "b" * 8, "c" * 8))
    assert live.compare([one, two], [one, two]) == live.Changes(0, 0, 0)
    assert not live.compare([one], [one]).any
    moved = live.row_token("b" * 8, "RUNNING", 1)
    assert live.compare([one, two], [three, one, moved]) == live.Changes(new=1, changed=1, gone=0)
    assert live.compare([one, two, three], [one]) == live.Changes(new=0, changed=0, gone=2)
    assert live.parse_rows("") == []
    assert live.parse_rows(f"{one},{two}") == [one, two]
