"""Schedules fired by real ``runtasks`` processes (schedules/service.py): exactly one
enqueue per (schedule, occurrence), with several workers at once and across a leader
killed mid-run, and catch-up after an outage in which no worker ran.

Nothing here depends on the machine's speed: the tests count occurrences and their
tasks, and poll with deadlines; they never assert on how long anything took.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise

import pytest

from django_tasks_plus.models import ScheduleOccurrence, ScheduleRecord, TaskRecord
from django_tasks_plus.schedules import Every, api
from tests.conftest import wait_for, worker_log

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = ("--concurrency", "1", "--poll-interval", "0.2")


def fired(name: str) -> list[ScheduleOccurrence]:
    return list(
        ScheduleOccurrence.objects.filter(schedule__name=name, action="fired").order_by("at")
    )


def assert_once_each(name: str, args: list[int]) -> list[ScheduleOccurrence]:
    """Every occurrence fired once, with one task of its own, and no task without one."""
    occurrences = fired(name)
    times = [occurrence.at for occurrence in occurrences]
    assert len(set(times)) == len(times)
    ids = [occurrence.task_id for occurrence in occurrences]
    assert None not in ids and len(set(ids)) == len(ids)
    tasks = TaskRecord.objects.filter(task_path="tests.tasks.add")  # the test's only ones
    assert all(task.args == args for task in tasks)
    assert sorted(str(pk) for pk in tasks.values_list("pk", flat=True)) == sorted(map(str, ids))
    # Epoch-anchored seconds, none left out between the first and the last.
    assert all(at.microsecond == 0 for at in times)
    gaps = Counter(int((b - a).total_seconds()) for a, b in pairwise(times))
    assert set(gaps) <= {1}, gaps
    return occurrences


def test_workers_fire_every_second_exactly_once_per_occurrence(start_worker):
    api.create("each-second", "tests.tasks.add", Every(seconds=1), args=[40, 2])
    for index in range(2):  # only the leader fires; the other stands by
        start_worker(*WORKER, "--worker-id", f"sched-{index}")
    wait_for(lambda: len(fired("each-second")) >= 6, timeout=60)
    occurrences = assert_once_each("each-second", [40, 2])
    # The tasks ran, too (execution is at-least-once, as for every task).
    first = occurrences[0].task_id
    wait_for(lambda: TaskRecord.objects.get(pk=first).status == "SUCCESSFUL", timeout=30)


def test_a_paused_schedule_stops_and_resumes_with_the_next_occurrence(start_worker):
    api.create("pausable", "tests.tasks.add", Every(seconds=1), args=[7, 7])
    start_worker(*WORKER, "--worker-id", "sched-pause")
    wait_for(lambda: len(fired("pausable")) >= 2, timeout=60)
    api.pause("pausable")
    paused_at = datetime.now(UTC)
    before = len(fired("pausable"))
    # At most one occurrence was being fired as the pause landed.
    wait_for(lambda: ScheduleRecord.objects.get(name="pausable").paused)
    settled = len(fired("pausable"))
    assert settled <= before + 1
    api.resume("pausable")
    wait_for(lambda: len(fired("pausable")) >= settled + 2, timeout=60)
    after = [o.at for o in fired("pausable")][settled:]
    assert all(at > paused_at for at in after)  # nothing caught up for the pause


def test_killing_the_leader_mid_run_still_fires_each_occurrence_once(start_worker, tmp_path):
    api.create("survives", "tests.tasks.add", Every(seconds=1), args=[9, 9])
    # A short lease: on SQLite the survivor takes over once the dead leader's lease lapses
    # (PostgreSQL's advisory lock goes with the killed session at once).
    procs = [
        start_worker(*WORKER, "--visibility-timeout", "3", "--worker-id", f"sched-kill-{i}")
        for i in range(2)
    ]
    wait_for(lambda: len(fired("survives")) >= 3, timeout=60)

    def leader() -> int | None:
        for index in range(2):
            if "is now the leader" in worker_log(tmp_path, index):
                return index
        return None

    wait_for(lambda: leader() is not None)
    index = leader()
    assert index is not None
    os.killpg(procs[index].pid, signal.SIGKILL)
    procs[index].wait(timeout=10)
    count = len(fired("survives"))
    wait_for(lambda: len(fired("survives")) >= count + 3, timeout=60)
    # The survivor took over: fired after the kill, each occurrence once. Occurrences
    # while nobody led are caught up (they are within the on-time window), so none is left out.
    assert "is now the leader" in worker_log(tmp_path, 1 - index)
    assert_once_each("survives", [9, 9])


def test_catch_up_after_an_outage_follows_each_schedules_policy(start_worker):
    # Yearly on 1 January, last waited for in 2020: as if no worker ran since. The
    # policies: none fires nothing, latest fires this year's, all the last three.
    for policy in ("none", "latest", "all"):
        api.create(
            f"yearly-{policy}",
            "tests.tasks.add",
            "0 0 1 1 *",
            args=[1, 1],
            catch_up=policy,
            catch_up_cap=3,
            timezone_name="UTC",
        )
    ScheduleRecord.objects.update(next_at=datetime(2020, 1, 1, tzinfo=UTC))
    start_worker(*WORKER, "--worker-id", "sched-catch-up")
    this_year = datetime.now(UTC).year

    def settled() -> bool:
        return not ScheduleRecord.objects.filter(next_at__year__lte=this_year).exists()

    wait_for(settled, timeout=60)
    years = {
        policy: [o.at.year for o in fired(f"yearly-{policy}")]
        for policy in ("none", "latest", "all")
    }
    assert years == {
        "none": [],
        "latest": [this_year],
        "all": [this_year - 2, this_year - 1, this_year],
    }
    assert TaskRecord.objects.filter(task_path="tests.tasks.add").count() == 4


def test_the_leader_syncs_a_settings_schedule_and_fires_it(start_worker):
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings_variants",
        "DTP_SETTINGS_VARIANT": "schedules",
    }
    # A stale runtime row of a schedule this deploy no longer declares in settings.
    stale = api.create("gone-from-settings", "tests.tasks.add", Every(seconds=1), args=[5, 5])
    ScheduleRecord.objects.filter(pk=stale.pk).update(source="settings", paused=True)
    start_worker(*WORKER, "--worker-id", "sched-settings", env=env)
    wait_for(lambda: len(fired("from-settings")) >= 2, timeout=60)
    row = ScheduleRecord.objects.get(name="from-settings")
    assert row.source == "settings" and row.every_seconds == 1
    assert ScheduleRecord.objects.get(pk=stale.pk).enabled is False  # kept, disabled
    assert_once_each("from-settings", [5, 5])
