"""The admin in a real browser: headless Chromium (Debian's, driven by Playwright) against
a live server and a real ``runtasks`` worker.

An operator logs in, reads the overview (its SVG charts must be drawn, not just present
in the markup), opens a dead task, redrives it and watches it succeed, and opens the
workers, breakers and schedules pages (the schedules page at 1280 and 390 px, light
and dark: no sideways scrolling, name, next and last run on screen). Screenshots are
saved under ``$DTP_SCREENSHOTS`` (default: the test's tmp dir);
``DTP_SCREENSHOTS=docs/images`` regenerates the ones in the docs (light mode;
``DTP_SCREENSHOTS_SCHEME=dark`` takes them in the dark theme).

The module is skipped when the ``playwright`` package or ``/usr/bin/chromium`` is
missing; ``.ci/run`` installs Chromium (``playwright install`` cannot download here).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_tasks_plus import circuits, metrics
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.metrics.catalog import BUCKET_NAMES, sum_name
from django_tasks_plus.models import MetricRecord, TaskRecord
from django_tasks_plus.schedules import Every, api
from tests import tasks
from tests.conftest import wait_for

CHROMIUM = Path("/usr/bin/chromium")
playwright_sync = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (pip install -e .[test])"
)
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does it)",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

WIDTH = 1400
ADMIN = "/admin/django_tasks_plus/"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DTP_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # (setup, polling) are still synchronous and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright_sync.sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(
            viewport={"width": WIDTH, "height": 900},
            color_scheme=os.environ.get("DTP_SCREENSHOTS_SCHEME", "light"),
            locale="en-US",
        )
        context.set_default_timeout(20_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def seed_history(now) -> None:
    """An hour of per-minute counts before this minute, as workers' flushes would have
    left them: a test cannot wait an hour, and a chart of one bar shows little."""
    start = now.replace(second=0, microsecond=0)
    rows = []
    for back in range(1, 60):
        minute = start - timedelta(minutes=back)
        done = 30 + int(12 * math.sin(back / 6))
        failed = 3 if back % 9 == 0 else (1 if back % 4 == 0 else 0)
        values = {"succeeded": done, "started": done + failed, "attempt_failed": failed}
        values[BUCKET_NAMES["wait"][3 + back % 4]] = done + failed
        values[sum_name("wait")] = (done + failed) * 8_000
        values[BUCKET_NAMES["run"][6 + back % 3]] = done + failed
        values[sum_name("run")] = (done + failed) * 60_000
        rows += [
            MetricRecord(
                backend_name="default",
                minute=minute,
                queue_name="default",
                task_path="tests.tasks.add",
                name=name,
                value=value,
            )
            for name, value in values.items()
            if value
        ]
    MetricRecord.objects.bulk_create(rows)


def test_operator_redrives_a_dead_task_in_the_browser(
    live_server, page, shots, django_user_model, run_worker, start_worker
):
    started = time.monotonic()
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    seed_history(timezone.now())
    for n in range(12):
        tasks.add.enqueue(n, n)
    tasks.always_fails.enqueue("the disk is full")
    dead = tasks.fails_until_redriven.enqueue(7)
    tasks.add.using(run_after=timezone.now() + timedelta(minutes=30)).enqueue(1, 1)
    tasks.echo.enqueue("waits on the other queue")
    assert run_worker("--burst", "--queue", "default").returncode == 0
    assert TaskRecord.objects.get(pk=dead.id).status == TaskResultStatus.FAILED
    metrics.flush()
    circuits.force_open("api.example.com", name="http")
    # Two schedules that do not fire during the test: one run now (a last run to show),
    # one paused.
    api.create("nightly-report", "tests.tasks.add", "0 3 * * *", args=[1, 2])
    api.run_now("nightly-report")
    api.create("heartbeat", "tests.tasks.add", Every(seconds=30), args=[0, 0], paused=True)
    start_worker("--queue", "default", "--concurrency", "2")
    base = live_server.url

    # Log in.
    page.goto(f"{base}{ADMIN}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}{ADMIN}")
    assert page.locator(".dtp-overview-link a").inner_text() == "Overview"
    page.screenshot(path=shots / "admin-app-index.png")

    # The overview: numbers, and four charts actually laid out with bars drawn.
    page.click(".dtp-overview-link a")
    page.wait_for_selector("#dtp-queues")
    assert page.title().startswith("Tasks overview")
    charts = page.locator("svg.dtp-chart")
    assert charts.count() == 4
    for index in range(4):
        box = charts.nth(index).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 80, box
    bars = page.locator("#dtp-chart-hour rect.dtp-chart-ok")
    assert bars.count() >= 59
    tallest = max(bars.nth(i).bounding_box()["height"] for i in range(bars.count()))
    assert tallest > 20
    assert page.locator("#dtp-chart-hour rect.dtp-chart-failed").count() > 0
    assert page.locator("#dtp-chart-run rect.dtp-chart-primary").first.bounding_box()
    unit = page.locator("#dtp-chart-hour text.dtp-chart-unit")
    assert unit.text_content() == "attempts / minute"
    assert "open" in page.locator("#dtp-breakers").inner_text()
    assert "1 + 1 paused" in page.locator("#dtp-schedules-card").inner_text()
    page.screenshot(path=shots / "admin-overview.png", full_page=True)

    # The dead task, from the dead letters.
    page.goto(f"{base}{ADMIN}taskrecord/dead-letters/?task_path=tests.tasks.fails_until_redriven")
    page.screenshot(path=shots / "admin-dead-letters.png")
    page.locator("#result_list th.field-short_id a").first.click()
    page.wait_for_selector(".dtp-attempts")
    assert "upstream refused order 7" in page.locator(".dtp-attempts").inner_text()
    page.screenshot(path=shots / "admin-task-dead.png", full_page=True)

    # Redrive it, and reload until the worker has run it.
    page.get_by_role("button", name="Redrive").click()
    page.wait_for_selector(".messagelist")
    assert "edriven" in page.locator(".messagelist").inner_text()

    def successful() -> bool:
        page.reload()
        return page.locator(".field-status_line .dtp-badge-successful").count() == 1

    wait_for(successful, timeout=45, interval=0.5)
    assert TaskRecord.objects.get(pk=dead.id).return_value == 7
    page.screenshot(path=shots / "admin-task-redriven.png", full_page=True)

    # Workers and breakers.
    page.goto(f"{base}{ADMIN}workerrecord/")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list .dtp-badge-alive").count() >= 1
    page.screenshot(path=shots / "admin-workers.png")
    page.goto(f"{base}{ADMIN}breakerrecord/")
    page.wait_for_selector("#result_list")
    assert "api.example.com" in page.locator("#result_list").inner_text()
    page.screenshot(path=shots / "admin-breakers.png")

    # Schedules: on a wide screen with the sidebar open and on a phone, light and dark,
    # the page never scrolls sideways and name, next and last run are on screen.
    for width, scheme in ((1280, "light"), (1280, "dark"), (390, "light"), (390, "dark")):
        page.set_viewport_size({"width": width, "height": 900})
        page.emulate_media(color_scheme=scheme)
        page.goto(f"{base}{ADMIN}schedulerecord/")
        page.wait_for_selector("#result_list")
        view = f"{width} px, {scheme}"
        if width >= 1024:
            assert page.locator("#nav-sidebar").is_visible(), view
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert (background == "rgb(255, 255, 255)") == (scheme == "light"), (view, background)
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, (view, overflow)
        for column in ("name", "next_occurrence", "last_run"):
            box = page.locator(f"#result_list th.column-{column}").bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (
                view,
                column,
                box,
            )
        last_run = page.locator("#result_list td.field-last_run .dtp-badge")
        assert last_run.count() == 1 and last_run.is_visible(), view
        page.screenshot(path=shots / f"admin-schedules-{width}-{scheme}.png", full_page=True)

    for name in ("admin-overview.png", "admin-task-dead.png", "admin-task-redriven.png"):
        assert (shots / name).stat().st_size > 10_000
    assert time.monotonic() - started < 120
