"""The admin in a real browser: headless Chromium (Debian's, driven by Playwright) against
a live server and a real ``runtasks`` worker.

Three walks. An operator logs in, reads the overview (its SVG charts must be drawn, not
just present in the markup), opens a dead task, redrives it and watches it succeed, and
opens the workers and breakers pages (the task's page shows the run
without a reload: it is live). Then every admin page of the app, with a task in
each state the docs describe, is opened at 1280 px with Django's sidebar open and at
390 px (a phone), in the light and the dark scheme, and held to
layout rules: no page wider than the screen, no list column cut off by the list's
scrolling box, rows a few lines tall with task paths on one line, chart text of at least
10 px, breadcrumbs on their bar and object tools that do not overlap, and each page's
own (the schedules list keeps name, next and last run on screen). One test walks them
all (one login, one seeded database) so the matrix costs seconds, not a test per page.
A third walks the live pages (a task's page, the overview, a queue's list: they refresh
in place, pause, and stop saying why) on Playwright's clock.

Screenshots are saved under ``$DTP_SCREENSHOTS`` (default: the test's tmp dir; the
layout walk saves one per page, size and scheme only with ``DTP_LAYOUT_SHOTS=1``);
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
from typing import Any

import pytest
from django.utils import timezone

from django_tasks_plus import circuits, metrics
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.metrics.catalog import BUCKET_NAMES, sum_name
from django_tasks_plus.models import MetricRecord, TaskRecord
from django_tasks_plus.schedules import Every, api
from tests import tasks
from tests.conftest import worker_row

CHROMIUM = Path("/usr/bin/chromium")
playwright_sync = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (pip install -e .[test])"
)
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does it)",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

ADMIN = "/admin/django_tasks_plus/"
WIDE = {"width": 1280, "height": 900}  # a laptop, with Django's sidebar open
PHONE = {"width": 390, "height": 844}  # a phone during an incident
SCHEMES = ("light", "dark")
# A list row holds a date, its clock and "3 min ago" under it (about 64 px), or the
# longest reason a waiting task gives ("blocked by its ordering key behind 5d19…, due
# 2 min ago"): five short lines at most, where rows used to reach 150 px.
ROW_MAX_PX = 100
# A schedule's last run adds the task's id and its status under its time.
SCHEDULES_ROW_MAX_PX = 110
# The dead letters add the reason and the last error's message (a few lines each).
DEAD_ROW_MAX_PX = 150
CHART_TEXT_MIN_PX = 10
# A task path as long as real projects have, to hold the task column to one line.
LONG_PATH = "acme_billing.integrations.webhooks.tasks.deliver_invoice_webhook"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DTP_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # (setup, polling) are still synchronous and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with playwright_sync.sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


def new_page(browser: Any, viewport: dict[str, int], scheme: str, state: Any = None) -> Any:
    """A page in a fresh context of that size and colour scheme (``state``: the cookies
    of an earlier login)."""
    context = browser.new_context(
        viewport=viewport, color_scheme=scheme, locale="en-US", storage_state=state
    )
    context.set_default_timeout(20_000)
    return context.new_page()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = new_page(browser, WIDE, os.environ.get("DTP_SCREENSHOTS_SCHEME", "light"))
    try:
        yield opened
    finally:
        opened.context.close()


def log_in(page: Any, base: str) -> None:
    page.goto(f"{base}{ADMIN}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}{ADMIN}")


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
    start_worker("--queue", "default", "--concurrency", "2")
    base = live_server.url

    log_in(page, base)
    assert page.locator(".dtp-overview-link a").inner_text() == "Overview"
    page.screenshot(path=shots / "admin-app-index.png")

    # The overview: numbers, and three charts actually laid out with bars drawn.
    page.click(".dtp-overview-link a")
    page.wait_for_selector("#dtp-queues")
    assert page.title().startswith("Tasks overview")
    charts = page.locator("svg.dtp-chart")
    assert charts.count() == 3
    for index in range(3):
        box = charts.nth(index).bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 80, box
    bars = page.locator("#dtp-chart-throughput rect.dtp-chart-ok")
    assert bars.count() >= 59
    tallest = max(bars.nth(i).bounding_box()["height"] for i in range(bars.count()))
    assert tallest > 20
    assert page.locator("#dtp-chart-throughput rect.dtp-chart-failed").count() > 0
    assert page.locator("#dtp-chart-run rect.dtp-chart-primary").first.bounding_box()
    unit = page.locator("#dtp-chart-throughput text.dtp-chart-unit")
    assert unit.text_content() == "attempts / minute"
    assert "open" in page.locator("#dtp-breakers").inner_text()
    page.screenshot(path=shots / "admin-overview.png", full_page=True)

    # The dead task, from the dead letters.
    page.goto(f"{base}{ADMIN}taskrecord/dead-letters/?task_path=tests.tasks.fails_until_redriven")
    page.screenshot(path=shots / "admin-dead-letters.png")
    page.locator("#result_list th.field-short_id a").first.click()
    page.wait_for_selector(".dtp-attempts")
    assert "upstream refused order 7" in page.locator(".dtp-attempts").inner_text()
    page.screenshot(path=shots / "admin-task-dead.png", full_page=True)

    # Redrive it, and watch the worker run it: the live page updates itself, no reload.
    page.get_by_role("button", name="Redrive").click()
    page.wait_for_selector(".messagelist")
    assert "edriven" in page.locator(".messagelist").inner_text()
    page.evaluate("() => { window.dtpMarker = 1; }")
    page.locator(".field-status_line .dtp-badge-successful").wait_for(timeout=45_000)
    assert page.evaluate("() => window.dtpMarker === 1")
    assert "edriven" in page.locator(".messagelist").inner_text()  # the same page
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

    for name in ("admin-overview.png", "admin-task-dead.png", "admin-task-redriven.png"):
        assert (shots / name).stat().st_size > 10_000
    assert time.monotonic() - started < 120


# -- every page, every size, both schemes ---------------------------------------------------

# What the layout rules need from one page, measured in the browser.
MEASURE = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
            width: r.width, height: r.height}; };
  const sidebar = document.querySelector('#nav-sidebar');
  const out = {
    viewport: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    sidebar: !sidebar ? null : getComputedStyle(sidebar).visibility !== 'hidden'
      && sidebar.getBoundingClientRect().width > 100,
    bodyBg: getComputedStyle(document.body).backgroundColor,
    h1: null,
  };
  // The title's text (not its box: Django 5.2 floats the object tools into the title's row).
  const h1 = document.querySelector('#content h1');
  if (h1) {
    const range = document.createRange();
    range.selectNodeContents(h1);
    out.h1 = box(range);
  }
  // What sticks out of the window, outside any box that scrolls sideways (for the message).
  // Its box, or its text running past its box (a long word), past the window's edge.
  const out_ = (el) => Math.max(el.getBoundingClientRect().right,
    el.getBoundingClientRect().left + el.scrollWidth) > window.innerWidth + 1;
  const clipped = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
    if (getComputedStyle(p).overflowX !== 'visible' && !out_(p)) return true; }
    return false; };
  // (Only looked for when the page is too wide: it reads every element's box.)
  const wide = out.scrollWidth > window.innerWidth + 1;
  out.overflowing = !wide ? [] : [...document.body.querySelectorAll('*')]
    .filter(el => out_(el) && !clipped(el))
    .filter(el => ![...el.children].some(c => out_(c) && !clipped(c)))
    .slice(0, 4).map(el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
      + (typeof el.className === 'string' && el.className
         ? '.' + el.className.trim().split(/\\s+/).join('.') : ''));
  const list = document.querySelector('#result_list');
  if (list) {
    const scroller = list.closest('.results') || list.parentElement;
    out.list = {
      box: box(scroller), clientWidth: scroller.clientWidth, scrollWidth: scroller.scrollWidth,
      columns: [...list.querySelectorAll('thead th')].map(th => ({
        text: th.innerText.trim() || th.className, right: th.getBoundingClientRect().right})),
      rows: [...list.querySelectorAll('tbody tr')].map(tr => tr.getBoundingClientRect().height),
      paths: [...list.querySelectorAll('.dtp-path')].map(el => ({
        text: el.innerText,
        lines: new Set([...el.getClientRects()].map(r => Math.round(r.top))).size})),
    };
  }
  out.chartText = [...document.querySelectorAll('svg.dtp-chart text')].map(t => {
    const m = t.getScreenCTM();
    return {text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize) * (m ? m.a : 1),
            fill: getComputedStyle(t).fill};
  });
  const crumbs = document.querySelector('.breadcrumbs');
  if (crumbs) {
    out.crumbs = {box: box(crumbs), bg: getComputedStyle(crumbs).backgroundColor,
                  text: crumbs.innerText.replace(/\\s+/g, ' ').trim()};
  }
  out.tools = [...document.querySelectorAll('.object-tools > li')]
    .filter(li => li.getBoundingClientRect().width > 0)
    .map(li => ({text: li.innerText.trim(), box: box(li)}));
  const primary = document.querySelector('.object-tools .dtp-primary');
  const history = document.querySelector('.object-tools a.historylink');
  out.primaryBg = primary ? getComputedStyle(primary).backgroundColor : null;
  out.historyBg = history ? getComputedStyle(history).backgroundColor : null;
  return out;
}"""


def _rgb(css: str) -> tuple[float, float, float, float]:
    """``rgb(r, g, b)`` / ``rgba(r, g, b, a)`` as numbers (alpha 1 when absent)."""
    inside = css[css.index("(") + 1 : css.rindex(")")].replace("/", ",")
    parts = [float(p) for p in inside.replace(",", " ").split()]
    return (parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else 1.0)


def _luminance(css: str) -> float:
    def channel(value: float) -> float:
        value /= 255
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    r, g, b, _a = _rgb(css)
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def _contrast(one: str, other: str) -> float:
    high, low = sorted((_luminance(one), _luminance(other)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        min(a["right"], b["right"]) - max(a["left"], b["left"]) > 1
        and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 1
    )


def layout_problems(
    found: dict[str, Any], *, wide: bool, scheme: str, row_max: float, crumb: str | None
) -> list[str]:
    """Every layout rule one page breaks (none: it keeps them all)."""
    problems = []
    if found["scrollWidth"] > found["viewport"] + 1:
        problems.append(
            f"page {found['scrollWidth']} px wide in a {found['viewport']} px window "
            f"(sticking out: {found['overflowing']})"
        )
    # Every page has Django's sidebar but the app index (whose content is that list).
    if wide and found["sidebar"] is False:
        problems.append("Django's sidebar is not open")
    if found.get("list") and found["sidebar"] is None:
        problems.append("a list without Django's sidebar")
    listed = found.get("list")
    if listed and wide:
        if listed["scrollWidth"] > listed["clientWidth"] + 1:
            cut = [c["text"] for c in listed["columns"] if c["right"] > listed["box"]["right"] + 1]
            problems.append(
                f"list {listed['scrollWidth']} px in a {listed['clientWidth']} px box: "
                f"cut off {cut}"
            )
        tall = [round(h) for h in listed["rows"] if h > row_max]
        if tall:
            problems.append(f"rows taller than {row_max} px: {tall}")
        wrapped = [p["text"] for p in listed["paths"] if p["lines"] > 1]
        if wrapped:
            problems.append(f"task paths on more than one line: {wrapped}")
    small = sorted({round(t["px"], 1) for t in found["chartText"] if t["px"] < CHART_TEXT_MIN_PX})
    if small:
        problems.append(f"chart text of {small} px (less than {CHART_TEXT_MIN_PX})")
    crumbs = found.get("crumbs")
    if crumbs is None:
        problems.append("no breadcrumbs")
    else:
        if _rgb(crumbs["bg"])[3] == 0:
            problems.append("the breadcrumbs have no bar (transparent background)")
        if crumbs["box"]["left"] > 1:
            problems.append(f"the breadcrumbs' bar starts at {crumbs['box']['left']} px")
        if crumb is not None and not crumbs["text"].endswith(crumb):
            problems.append(f"breadcrumbs {crumbs['text']!r} do not end with {crumb!r}")
    tools = found["tools"]
    for index, one in enumerate(tools):
        for other in tools[index + 1 :]:
            if _overlap(one["box"], other["box"]):
                problems.append(f"object tools overlap: {one['text']!r} and {other['text']!r}")
        if found["h1"] and _overlap(one["box"], found["h1"]):
            problems.append(f"object tool {one['text']!r} overlaps the title")
    if found["primaryBg"] and found["primaryBg"] == found["historyBg"]:
        problems.append("the main action looks like History")
    body = _luminance(found["bodyBg"])
    if (scheme == "dark") != (body < 0.2):
        problems.append(f"{scheme} scheme asked, page background {found['bodyBg']}")
    faint = {t["fill"] for t in found["chartText"] if _contrast(t["fill"], found["bodyBg"]) < 3}
    if faint:
        problems.append(f"chart text {faint} on {found['bodyBg']}: contrast below 3")
    return problems


def page_specific_problems(page: Any, path: str, width: int) -> list[str]:
    """What one page must show besides the shared rules: the schedules list keeps name,
    next and last run (with its task's status) on screen at every size; the overview's
    schedules card counts the active and the paused ones."""
    problems = []
    if path == f"{ADMIN}schedulerecord/":
        for column in ("name", "next_occurrence", "last_run"):
            box = page.locator(f"#result_list th.column-{column}").bounding_box()
            if box is None or box["x"] < 0 or box["x"] + box["width"] > width:
                problems.append(f"column {column} not on screen: {box}")
        status = page.locator("#result_list td.field-last_run .dtp-badge")
        if status.count() != 1 or not status.is_visible():
            problems.append("the last run's status is not shown")
    if "/workerrecord/web-1" in path:
        # The live worker's page: its running task in the in-flight table, linked, on
        # screen (the table scrolls in its own box, never the page).
        link = page.locator(".dtp-in-flight a.dtp-id")
        box = link.bounding_box() if link.count() == 1 else None
        if box is None or box["x"] < 0 or box["x"] + box["width"] > width:
            problems.append(f"the task in flight is not linked on screen: {box}")
    if "/workerrecord/web-" in path:
        # Both seeded workers led at their last heartbeat; the note under a silent
        # one's badge wraps inside the field rather than running off it.
        field = page.locator(".field-leader .readonly")
        if "LEADER" not in field.inner_text():
            problems.append("the leader is not shown as such")
        if field.evaluate("el => el.scrollWidth > el.clientWidth + 1"):
            problems.append("the leader field's text runs past its box")
    if path.endswith("overview/"):
        card = page.locator("#dtp-schedules-card").inner_text()
        if "1 + 1 paused" not in card:
            problems.append(f"schedules card says {card!r}")
    return problems


def seed_every_state(run_worker: Any) -> dict[str, Any]:
    """A task in each state the docs describe (succeeded, dead, blocked by a dead task
    of its ordering key, retrying, scheduled, held by a breaker, running), a long task
    path and a long error, a live and a stale worker, an open circuit and two schedules;
    the ids of the pages that show them."""
    from django_tasks_plus.breaker import scoped_key
    from django_tasks_plus.models import BreakerRecord, ScheduleRecord

    now = timezone.now()
    seed_history(now)
    for n in range(6):
        tasks.add.enqueue(n, n)
    dead = tasks.always_fails.enqueue(
        "the disk is full: /var/lib/postgresql/data has 0 bytes left of 512 GB; "
        "checkpoint and WAL writes are failing for every table"
    )
    blocker = tasks.dies_and_blocks.using(ordering_key="account:acme").enqueue(3)
    blocked = tasks.add.using(ordering_key="account:acme").enqueue(4, 4)
    assert run_worker("--burst", "--queue", "default").returncode == 0
    assert TaskRecord.objects.get(pk=blocker.id).ordering_blocked
    TaskRecord.objects.filter(pk=dead.id).update(task_path=LONG_PATH)
    later = now + timedelta(minutes=30)
    tasks.add.using(run_after=later).enqueue(1, 1)  # scheduled
    retrying = tasks.add.using(run_after=now + timedelta(seconds=40)).enqueue(2, 2)
    TaskRecord.objects.filter(pk=retrying.id).update(attempt=2, task_path=LONG_PATH)
    circuits.force_open("api.example.com", name="http")
    held = tasks.add.using(run_after=later).enqueue(3, 3)
    TaskRecord.objects.filter(pk=held.id).update(
        held_since=now, breaker_key=scoped_key("http", "api.example.com")
    )
    running = tasks.echo.enqueue("waits on the other queue")
    TaskRecord.objects.filter(pk=running.id).update(
        status=TaskResultStatus.RUNNING,
        attempt=1,
        last_attempted_at=now,
        started_at=now,
        worker_ids=["web-1:4242:live"],  # in flight on the live worker's page
        task_path=LONG_PATH,
    )
    for worker_id, beat in (("web-1:4242:live", now), ("web-2:77:stale", now - timedelta(hours=1))):
        worker_row(
            worker_id,
            hostname=worker_id.split(":")[0] + ".prod.example.com",
            pid=int(worker_id.split(":")[1]),
            queues=["default", "emails", "other"],
            concurrency=8,
            started_at=now - timedelta(days=2),
            last_heartbeat_at=beat,
            version="0.1.0",
            tasks_processed=1_284_377,
            tasks_failed=2_911,
            # The stale one as a leader that went silent (its row says so until pruned).
            leader_since=now - timedelta(days=1),
        )
    api.create("nightly-report", tasks.add, "0 3 * * *", args=(1, 2))
    api.run_now("nightly-report")  # a last run, with its task's status, to show
    api.create("every-half-minute", "tests.tasks.add", Every(seconds=30), args=(5, 5), paused=True)
    return {
        "dead": dead.id,
        "blocked": blocked.id,
        "held": held.id,
        "breaker": BreakerRecord.objects.get(key="api.example.com").pk,
        "worker": "web-1:4242:live",
        "schedule": ScheduleRecord.objects.get(name="nightly-report").pk,
    }


def test_every_page_keeps_its_layout_at_each_size_and_scheme(
    live_server, browser, shots, django_user_model, run_worker
):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    ids = seed_every_state(run_worker)
    tasks_url = f"{ADMIN}taskrecord/"
    # (path, the last breadcrumb, the row height bound of its list)
    pages: list[tuple[str, str | None, float]] = [
        (ADMIN, None, ROW_MAX_PX),
        (f"{tasks_url}overview/", "Tasks overview", ROW_MAX_PX),
        # The week's chart: 84 bars labelled with weekday and time, one queue chosen.
        (f"{tasks_url}overview/?range=7d&queue=default", "Tasks overview", ROW_MAX_PX),
        (tasks_url, None, ROW_MAX_PX),
        (f"{tasks_url}?status__exact=READY", None, ROW_MAX_PX),
        # The search box holding JSON terms, its help text under it (docs/admin.md#search).
        (f"{tasks_url}?q=kwarg%3Auser_id%3D42+meta%3Atenant%3D%22acme%22", None, ROW_MAX_PX),
        (f"{tasks_url}dead-letters/", "Dead letters", DEAD_ROW_MAX_PX),
        (f"{tasks_url}dead-letters/redrive-matching/", "Are you sure?", ROW_MAX_PX),
        (f"{tasks_url}?queue=nowhere&bogus=1", None, ROW_MAX_PX),
        (f"{tasks_url}{ids['dead']}/change/", None, ROW_MAX_PX),
        (f"{tasks_url}{ids['blocked']}/change/", None, ROW_MAX_PX),
        (f"{tasks_url}{ids['held']}/change/", None, ROW_MAX_PX),
        (f"{ADMIN}breakerrecord/", None, ROW_MAX_PX),
        (f"{ADMIN}breakerrecord/{ids['breaker']}/change/", None, ROW_MAX_PX),
        (f"{ADMIN}workerrecord/", None, ROW_MAX_PX),
        (f"{ADMIN}workerrecord/{ids['worker']}/change/", None, ROW_MAX_PX),
        (f"{ADMIN}workerrecord/web-2:77:stale/change/", None, ROW_MAX_PX),
        (f"{ADMIN}schedulerecord/", None, SCHEDULES_ROW_MAX_PX),
        (f"{ADMIN}schedulerecord/{ids['schedule']}/change/", None, ROW_MAX_PX),
    ]
    base = live_server.url
    state = None
    problems: list[str] = []
    for size, viewport in (("1280", WIDE), ("390", PHONE)):
        for scheme in SCHEMES:
            page = new_page(browser, viewport, scheme, state)
            try:
                if state is None:
                    log_in(page, base)
                    state = page.context.storage_state()
                for path, crumb, row_max in pages:
                    response = page.goto(f"{base}{path}")
                    assert response is not None and response.status in (200, 400), (
                        path,
                        response and response.status,
                    )
                    found = page.evaluate(MEASURE)
                    problems += [
                        f"{size} px {scheme} {path}: {problem}"
                        for problem in layout_problems(
                            found,
                            wide=viewport is WIDE,
                            scheme=scheme,
                            row_max=row_max,
                            crumb=crumb,
                        )
                    ]
                    problems += [
                        f"{size} px {scheme} {path}: {problem}"
                        for problem in page_specific_problems(page, path, viewport["width"])
                    ]
                    if os.environ.get("DTP_LAYOUT_SHOTS"):
                        name = path.strip("/").replace("/", "_").replace("?", "_")
                        shot = shots / f"layout-{size}-{scheme}-{name}.png"
                        page.screenshot(path=shot, full_page=True)
            finally:
                page.context.close()
    assert not problems, "\n".join(problems)


# -- rows another session holds locked -----------------------------------------------------


def test_a_bulk_action_names_the_tasks_it_left_locked(
    live_server, browser, django_user_model, monkeypatch
):
    """Redrive all on the dead letters while a transaction elsewhere holds 11 of the 13
    rows: the two free ones are redriven, and one error message links the first ten
    locked tasks and counts the last, wrapped inside the window at each size."""
    from django.db import connection

    from django_tasks_plus.admin import actions
    from django_tasks_plus.db.rowlock import LockPatience
    from tests.test_admin import failed_record
    from tests.test_locked_rows import _other_session

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite has no row locks")
    monkeypatch.setattr(actions, "LockPatience", lambda: LockPatience(per_row=0.2, total=0.3))
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    base = live_server.url
    state = None
    for viewport, scheme in ((WIDE, "dark"), (PHONE, "light")):
        TaskRecord.objects.all().delete()
        dead = [failed_record().pk for _ in range(13)]
        locked, free = dead[:11], dead[11:]
        other = _other_session()
        page = new_page(browser, viewport, scheme, state)
        try:
            other.execute("BEGIN")
            other.execute(
                f"SELECT 1 FROM {TaskRecord._meta.db_table} WHERE id = ANY(%s) FOR UPDATE",
                [locked],
            )
            if state is None:
                log_in(page, base)
                state = page.context.storage_state()
            page.goto(f"{base}{ADMIN}taskrecord/dead-letters/")
            page.check("#action-toggle")
            page.select_option("select[name=action]", "redrive_tasks")
            page.click("button[name=index]")
            page.wait_for_selector(".messagelist .error")
            error = page.locator(".messagelist .error")
            assert error.inner_text().startswith(
                "11 tasks were left unchanged: another database session held their rows locked ("
            )
            assert error.inner_text().endswith(
                ", and 1 more). Try again once that transaction ends."
            )
            links = error.locator("a.dtp-id")
            assert links.count() == 10
            assert {links.nth(i).get_attribute("title") for i in range(10)} <= {
                str(pk) for pk in locked
            }
            box = error.bounding_box()
            assert box is not None and box["x"] + box["width"] <= viewport["width"], box
            assert "2 tasks redriven." in page.locator(".messagelist").inner_text()
            problems = layout_problems(
                page.evaluate(MEASURE),
                wide=viewport is WIDE,
                scheme=scheme,
                row_max=DEAD_ROW_MAX_PX,
                crumb=None,
            )
            assert not problems, problems
            links.first.click()  # each link opens the task's page
            page.wait_for_selector(".dtp-attempts")
            other.execute("COMMIT")
        finally:
            page.context.close()
            other.close()
        statuses = dict(TaskRecord.objects.values_list("pk", "status"))
        assert [statuses[pk] for pk in free] == ["READY", "READY"]
        assert [statuses[pk] for pk in locked] == ["FAILED"] * 11


# -- live pages ----------------------------------------------------------------------------


# What a browser does when the tab goes to the background or comes back.
SET_VISIBILITY = """(state) => {
  Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => state});
  document.dispatchEvent(new Event('visibilitychange'));
}"""


def test_live_pages_refresh_in_place_and_pause(live_server, page, django_user_model):
    """The task page, the overview and a queue's list refresh without a reload (a marker
    set in the page survives), the task page stops while paused and resumes from the
    keyboard, a task deleted meanwhile stops its page with the reason and a retry, the
    overview waits while its tab is hidden, and the list's notice leaves the operator's
    selection alone. The page's clock is Playwright's, so five-second polls take no five
    seconds."""
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    later = timezone.now() + timedelta(hours=1)
    watched = tasks.add.using(run_after=later).enqueue(2, 3)
    tasks.add.using(run_after=later).enqueue(4, 5)
    base = live_server.url
    page.clock.install()
    log_in(page, base)
    toggle = page.locator(".dtp-live-toggle")
    status_line = page.locator(".field-status_line")

    def poll_once() -> None:
        page.clock.fast_forward(5_500)

    def refreshed_until(condition: str) -> None:
        """Move the page's clock a poll ahead until ``condition`` (JavaScript) holds: a
        request may still be on its way when the clock jumps (the next one then waits)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            poll_once()
            try:
                page.wait_for_function(condition, timeout=1_000)
                return
            except playwright_sync.TimeoutError:
                continue
        bar = page.locator(".dtp-live").inner_text()
        raise AssertionError(f"not refreshed to {condition} within 30 s; the bar says {bar!r}")

    def still_the_same_document() -> bool:
        return page.evaluate("() => window.dtpMarker === 1")

    # The task page: the worker's progress shows without a reload.
    page.goto(f"{base}{ADMIN}taskrecord/{watched.id}/change/")
    assert toggle.inner_text() == "Live ●" and toggle.get_attribute("aria-pressed") == "true"
    page.evaluate("() => { window.dtpMarker = 1; }")
    # While the operator has the id selected (to copy it), its region waits.
    page.evaluate(
        "() => getSelection().selectAllChildren(document.querySelector('.field-id .readonly'))"
    )
    now = timezone.now()
    TaskRecord.objects.filter(pk=watched.id).update(
        status=TaskResultStatus.RUNNING, attempt=1, started_at=now, last_attempted_at=now
    )
    assert "Run now" in page.locator("#dtp-live-actions").text_content()
    # The buttons refresh (a RUNNING task cannot be run now); the fields wait.
    refreshed_until(
        "() => !document.querySelector('#dtp-live-actions').textContent.includes('Run now')"
    )
    assert status_line.locator(".dtp-badge-ready").count() == 1
    assert page.evaluate("() => getSelection().toString()") == str(watched.id)
    page.evaluate("() => getSelection().removeAllRanges()")
    refreshed_until("() => !!document.querySelector('.field-status_line .dtp-badge-running')")
    assert "Cancel task" in page.locator("#dtp-live-actions").text_content()

    # Paused: the task finishes, the page does not change.
    toggle.click()
    assert toggle.inner_text() == "Paused" and toggle.get_attribute("aria-pressed") == "false"
    TaskRecord.objects.filter(pk=watched.id).update(
        status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now(), return_value=5
    )
    for _round in range(3):
        poll_once()
    page.wait_for_timeout(500)
    assert status_line.locator(".dtp-badge-running").count() == 1
    # Resumed from the keyboard: refreshed at once.
    toggle.focus()
    page.keyboard.press("Enter")
    status_line.locator(".dtp-badge-successful").wait_for()
    assert toggle.get_attribute("aria-pressed") == "true"
    assert "Delete task" in page.locator("#dtp-live-actions").text_content()
    assert still_the_same_document()

    # Deleted meanwhile: updates stop, saying why, with a retry.
    TaskRecord.objects.filter(pk=watched.id).delete()
    stopped = page.locator(".dtp-live [role=alert]")
    refreshed_until("() => document.querySelector('.dtp-live-alert').textContent !== ''")
    assert stopped.inner_text() == "Updates stopped: this task no longer exists"
    assert page.locator(".dtp-live-retry").is_visible()

    # The overview: a card counts the new task, once the tab is shown again.
    page.goto(f"{base}{ADMIN}taskrecord/overview/")
    page.evaluate("() => { window.dtpMarker = 1; }")
    due = page.locator("#dtp-live-cards .dtp-card").first.locator(".dtp-card-value")
    assert due.inner_text() == "0"
    page.evaluate(SET_VISIBILITY, "hidden")  # headless tabs are never hidden: say so
    tasks.add.enqueue(6, 7)
    for _round in range(3):
        poll_once()
    page.wait_for_timeout(500)
    assert due.inner_text() == "0"
    assert "hidden" in page.locator(".dtp-live-status").inner_text()
    page.evaluate(SET_VISIBILITY, "visible")
    page.wait_for_function(
        "() => document.querySelector('#dtp-live-cards .dtp-card-value').textContent === '1'"
    )
    assert still_the_same_document()

    # A queue's list: a notice of the new task; the selected row stays selected.
    page.goto(f"{base}{ADMIN}taskrecord/?queue_name=default")
    page.evaluate("() => { window.dtpMarker = 1; }")
    selected = page.locator("#result_list input.action-select").first
    selected.check()
    assert "1 of 2 selected" in page.locator(".action-counter").inner_text()
    tasks.add.enqueue(8, 9)
    refreshed_until("() => !!document.querySelector('#dtp-live-list .dtp-live-notice')")
    notice = page.locator("#dtp-live-list .dtp-live-notice")
    assert "1 new, 0 changed, 0 no longer on it" in notice.inner_text()
    assert selected.is_checked()
    assert "1 of 2 selected" in page.locator(".action-counter").inner_text()
    assert still_the_same_document()
    notice.get_by_role("link", name="Reload the list").click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 3
