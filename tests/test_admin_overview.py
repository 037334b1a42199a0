"""The admin overview (admin/overview.py): gauges, throughput, latency, workers and
circuits, with SVG charts, from a real ``runtasks`` run; empty; and who may see it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_tasks_plus import circuits, metrics
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db.metrics import add_metrics, roll_up_minutes
from django_tasks_plus.metrics.catalog import ALL_TIME
from django_tasks_plus.models import TaskRecord
from tests import tasks
from tests.conftest import worker_row

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = "admin:django_tasks_plus_taskrecord_overview"
SVG_RE = re.compile(r'<svg class="dtp-chart".*?</svg>', re.S)


def overview(client: Client, query: str = ""):
    return client.get(reverse(OVERVIEW) + query)


def svgs(response) -> list[ET.Element]:
    return [ET.fromstring(markup) for markup in SVG_RE.findall(response.content.decode())]


def test_empty_overview_shows_zeros_and_empty_charts(admin_client):
    response = overview(admin_client)
    assert response.status_code == 200
    context = response.context
    assert [row["queue"] for row in context["queues"]] == ["default", "emails", "slow", "other"]
    assert all(
        row["running"] == row["dead"] == 0 and all(c.count == 0 for c in row["counts"].values())
        for row in context["queues"]
    )
    totals = context["queue_totals"]
    assert {name: str(count) for name, count in totals.items()} == {
        "due": "0",
        "blocked": "0",
        "held": "0",
        "retrying": "0",
        "scheduled": "0",
        "running": "0",
        "dead": "0",
    }
    assert (context["workers_alive"], context["workers_stale"]) == (0, 0)
    assert context["breakers"] == []
    assert [w.failure_rate for w in context["windows"]] == ["-", "-"]
    assert [(row["p50"], row["p95"]) for row in context["latency"]] == [("-", "-"), ("-", "-")]
    charts = svgs(response)
    assert [c.get("id") for c in charts] == [
        "dtp-chart-throughput",
        "dtp-chart-wait",
        "dtp-chart-run",
    ]
    assert response.content.decode().count("No data in this window") == 3
    assert "Every circuit is closed." in response.content.decode()


def test_overview_with_a_real_worker_run(admin_client, run_worker):
    for n in range(3):
        tasks.add.enqueue(n, 1)
    tasks.always_fails.enqueue("the disk is full")  # 3 attempts (NO_WAIT), then dead
    later = timezone.now() + timedelta(hours=1)
    tasks.add.using(run_after=later).enqueue(9, 9)  # scheduled
    tasks.echo.enqueue("waits")  # queue "other", READY and due: the worker serves "default"
    assert run_worker("--burst", "--queue", "default").returncode == 0
    metrics.flush()  # this process's enqueue counts
    circuits.force_open("api.example.com", name="http")
    worker_row(
        "gone:1:x",
        silent_for=timedelta(minutes=30),
        hostname="gone",
        started_at=timezone.now() - timedelta(hours=1),
    )

    response = overview(admin_client)
    assert response.status_code == 200
    context = response.context
    rows = {row["queue"]: row for row in context["queues"]}
    default = {name: count.count for name, count in rows["default"]["counts"].items()}
    assert default == {"due": 0, "blocked": 0, "held": 0, "retrying": 0, "scheduled": 1}
    assert (rows["default"]["running"], rows["default"]["dead"]) == (0, 1)
    assert rows["other"]["counts"]["due"].count == 1 and rows["other"]["oldest"] != "-"
    assert rows["default"]["oldest"] == "-"
    assert rows["default"]["dead_url"].endswith("dead-letters/?queue_name=default")
    assert "status__exact=READY" in rows["other"]["ready_url"]
    # Each reason's count links to the list filtered to it.
    scheduled = {cell["reason"]: cell["url"] for cell in rows["default"]["waiting"]}["scheduled"]
    assert "waiting=scheduled" in scheduled and "queue_name=default" in scheduled

    hour, day = context["windows"]
    for window in (hour, day):
        assert window.counters["enqueued"] == 6
        assert window.counters["succeeded"] == 3
        assert window.counters["attempt_failed"] == 3
        assert window.counters["retried"] == 2
        assert window.counters["dead_lettered"] == 1
        assert window.failure_rate == "50.0 %"
    assert [row["count"] for row in context["latency"]] == [6, 6]  # wait, run
    assert all(row["p50"] != "-" and row["p95"] != "-" for row in context["latency"])

    assert (context["workers_alive"], context["workers_stale"]) == (0, 1)
    assert [(b.name, b.key, b.state) for b in context["breakers"]] == [
        ("http", "api.example.com", "open")
    ]

    page = response.content.decode()
    assert "No data in this window" not in page
    hour_chart, wait_chart, run_chart = svgs(response)
    ns = "{http://www.w3.org/2000/svg}"
    assert "succeeded 3, failed 3" in hour_chart.find(f"{ns}desc").text
    day_chart = svgs(overview(admin_client, "?range=1d"))[0]
    assert "succeeded 3, failed 3" in day_chart.find(f"{ns}desc").text
    ok = [r for r in hour_chart.iter(f"{ns}rect") if r.get("class") == "dtp-chart-ok"]
    failed = [r for r in hour_chart.iter(f"{ns}rect") if r.get("class") == "dtp-chart-failed"]
    assert ok and failed  # drawn, in the minute(s) the worker ran
    for chart in (wait_chart, run_chart):
        drawn = [r for r in chart.iter(f"{ns}rect") if r.get("class") == "dtp-chart-primary"]
        assert drawn
        assert "6 observations" in chart.find(f"{ns}desc").text
    assert len([t for t in hour_chart.iter(f"{ns}text") if t.get("class") == "dtp-chart-unit"])
    assert 'href="/static/django_tasks_plus/admin.css"' in page
    assert "api.example.com" in page and "dtp-badge-open" in page


def _waiting_row(minutes_ago: float, **columns) -> TaskRecord:
    key = columns.pop("ordering_key", None)
    result = tasks.add.using(**({"ordering_key": key} if key else {})).enqueue(1, 1)
    run_after = timezone.now() - timedelta(minutes=minutes_ago)
    TaskRecord.objects.filter(pk=result.id).update(run_after=run_after, **columns)
    return TaskRecord.objects.get(pk=result.id)


def test_the_overview_splits_waiting_tasks_by_reason_and_links_each(admin_client):
    """A task blocked by its ordering key is counted as blocked, not in the oldest due
    age; held, retrying and scheduled tasks each have their own count and link."""
    _waiting_row(30, ordering_key="acct", status=TaskResultStatus.RUNNING)
    blocked = _waiting_row(20, ordering_key="acct")
    due = _waiting_row(2)
    held = _waiting_row(-5, attempt=1, held_since=timezone.now(), breaker_key="http/api")
    retrying = _waiting_row(-5, attempt=2)
    scheduled = _waiting_row(-60)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = overview(admin_client)
    read_ready = [q["sql"] for q in queries.captured_queries if "'READY'" in q["sql"]]
    row = {r["queue"]: r for r in response.context["queues"]}["default"]
    assert {name: count.count for name, count in row["counts"].items()} == dict.fromkeys(
        ("due", "blocked", "held", "retrying", "scheduled"), 1
    )
    assert row["oldest"].startswith("2 min")  # the blocked task waited 20 min
    links = {cell["reason"]: cell["url"] for cell in row["waiting"]}
    for reason, expected in (
        ("due", due),
        ("blocked", blocked),
        ("held", held),
        ("retrying", retrying),
        ("scheduled", scheduled),
    ):
        listing = admin_client.get(links[reason])
        assert listing.status_code == 200, reason
        shown = [str(r.pk) for r in listing.context["cl"].result_list]
        assert shown == [str(expected.pk)], reason
    page = admin_client.get(links["blocked"]).content.decode()
    assert f"behind {str(blocked.pk)[:8]}" not in page  # it waits behind the running task
    assert "blocked by its ordering key behind" in page
    # The counts read READY rows with a LIMIT, never a whole scan. (A queue's priority
    # levels are one MAX probe of the claim index each; the circuits' held counts read
    # only tasks with a breaker key, through dtp_task_breaker_idx.)
    assert read_ready
    unbounded = [
        sql
        for sql in read_ready
        if "LIMIT" not in sql.upper()
        and "min(queue_name)" not in sql
        and not sql.startswith('SELECT MAX("django_tasks_plus_taskrecord"."priority")')
        and '"breaker_key" IS NOT NULL' not in sql
    ]
    assert not unbounded, unbounded


def test_the_app_index_links_the_overview(admin_client):
    page = admin_client.get(reverse("admin:app_list", args=["django_tasks_plus"]))
    assert page.status_code == 200
    assert reverse(OVERVIEW) in page.content.decode()
    # The site-wide index is the project's own: the app's models are listed as usual.
    index = admin_client.get(reverse("admin:index"))
    assert index.status_code == 200
    assert reverse("admin:django_tasks_plus_taskrecord_changelist") in index.content.decode()


def test_an_unknown_backend_says_what_to_fix(admin_client):
    response = overview(admin_client, "?backend=nope")
    assert response.status_code == 200
    assert "no django-tasks-plus backend named &#x27;nope&#x27; in TASKS" in (
        response.content.decode()
    )


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        ("anonymous", "login"),
        ("non_staff", "login"),
        ("staff_no_perms", 403),
        ("staff_other_view", 403),  # may view workers, not tasks
        ("staff_view_only", 200),
        ("superuser", 200),
    ],
)
def test_who_may_see_the_overview(role, expected, django_user_model):
    client = Client()
    if role != "anonymous":
        user = django_user_model.objects.create_user(
            role, password="pw", is_staff=role != "non_staff", is_superuser=role == "superuser"
        )
        codenames = {
            "non_staff": ["view_taskrecord"],
            "staff_other_view": ["view_workerrecord", "view_breakerrecord"],
            "staff_view_only": ["view_taskrecord"],
        }.get(role, [])
        user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
        client.force_login(user)
    response = overview(client)
    if expected == "login":
        assert response.status_code == 302
        assert "/login/" in response["Location"]
    else:
        assert response.status_code == expected
    assert "dtp-chart" not in response.content.decode() or expected == 200


# -- chart ranges and filters (admin/overview_charts.py) ------------------------------------


def _bars(chart: ET.Element) -> list[str]:
    """Each bar's tooltip (``label: succeeded N, failed M (unit)``), in order."""
    ns = "{http://www.w3.org/2000/svg}"
    return [g.find(f"{ns}title").text for g in chart.iter(f"{ns}g")]


def _counts(queue: str, task_path: str, minute, succeeded: int, failed: int = 0) -> list:
    return [
        ("default", minute, queue, task_path, "succeeded", succeeded),
        ("default", minute, queue, task_path, "attempt_failed", failed),
    ]


@pytest.mark.parametrize(("key", "bars"), [("1h", 60), ("6h", 72), ("1d", 72), ("7d", 84)])
def test_each_range_draws_its_bars_from_minutes_and_hours(admin_client, key, bars):
    """Counts an hour ago, 5 hours ago, and two days ago (rolled up into an hourly row by
    the pruner's rollup): each range draws what lies in its window, in its bars."""
    now = timezone.now().replace(second=0, microsecond=0)
    rows = [
        *_counts("default", "tests.tasks.add", now - timedelta(minutes=10), 1, 1),
        *_counts("default", "tests.tasks.add", now - timedelta(hours=5), 10),
        *_counts("emails", "tests.tasks.echo", now - timedelta(days=2), 100, 7),
    ]
    add_metrics("default", rows)
    assert roll_up_minutes("default", "default", now - timedelta(days=1), ALL_TIME, 100) == 2
    expected = {"1h": (1, 1), "6h": (11, 1), "1d": (11, 1), "7d": (111, 8)}[key]

    response = overview(admin_client, f"?range={key}")
    assert response.status_code == 200
    throughput, wait, run = svgs(response)
    assert run.get("id") == "dtp-chart-run"
    assert throughput.get("id") == "dtp-chart-throughput"
    assert len(_bars(throughput)) == bars
    ns = "{http://www.w3.org/2000/svg}"
    ok, failed = expected
    assert f"succeeded {ok}, failed {failed} attempts" in throughput.find(f"{ns}desc").text
    label = {"1h": "last hour", "6h": "last 6 hours", "1d": "last day", "7d": "last week"}[key]
    assert throughput.find(f"{ns}title").text.endswith(label)
    assert wait.find(f"{ns}title").text == f"Wait from due to start, {label}"
    page = response.content.decode()
    assert f'<strong aria-current="page">{label}</strong>' in page
    assert page.count("data-range=") == 3  # the other ranges are links


def test_the_charts_filter_by_queue_and_task_and_the_links_keep_the_filters(admin_client):
    now = timezone.now().replace(second=0, microsecond=0)
    add_metrics(
        "default",
        [
            *_counts("default", "tests.tasks.add", now - timedelta(minutes=3), 2, 1),
            *_counts("emails", "tests.tasks.echo", now - timedelta(minutes=3), 30),
            *_counts("emails", "tests.tasks.add", now - timedelta(minutes=3), 400),
        ],
    )
    ns = "{http://www.w3.org/2000/svg}"

    def described(query: str) -> str:
        response = overview(admin_client, query)
        assert response.status_code == 200
        return svgs(response)[0].find(f"{ns}desc").text

    assert "succeeded 432, failed 1" in described("")
    assert "succeeded 430, failed 0" in described("?queue=emails")
    assert "succeeded 402, failed 1" in described("?task=tests.tasks.add")
    assert "succeeded 400, failed 0" in described("?queue=emails&task=tests.tasks.add&range=6h")
    assert "succeeded 0, failed 0" in described("?queue=nowhere")  # no data, no error
    page = overview(admin_client, "?queue=emails&task=tests.tasks.add").content.decode()
    assert "Attempts per minute, last hour (queue emails, task tests.tasks.add)" in page
    assert 'href="?range=7d&amp;queue=emails&amp;task=tests.tasks.add"' in page
    assert '<option value="emails" selected>' in page


def test_a_bad_range_or_filter_is_named_and_the_default_drawn(admin_client):
    response = overview(admin_client, "?range=1y&queue=" + "q" * 300)
    assert response.status_code == 200
    page = response.content.decode()
    assert "There is no chart range &#x27;1y&#x27;; choose one of: 1h, 6h, 1d, 7d." in page
    assert "is not one (at most 100 characters" in page
    assert page.count('class="errornote"') == 2
    throughput = svgs(response)[0]
    assert len(_bars(throughput)) == 60  # the last hour's
