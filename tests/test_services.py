"""Worker services and leadership, against real databases and real worker processes.

A worker built in-process with ``WorkerConfig.from_settings``; services started in order
and stopped in reverse; a service that cannot start stops the worker with its name; and
leadership: of two ``runtasks`` processes exactly one leads, and when it is killed the
other takes over within a bound.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db.leadership import current_leader
from django_tasks_plus.models import TaskRecord, WorkerRecord
from django_tasks_plus.worker.config import WorkerConfig, WorkerConfigError
from django_tasks_plus.worker.engine import Worker
from django_tasks_plus.worker.services import (
    LoopService,
    Service,
    Services,
    ServiceStartError,
    ThreadService,
)
from tests import tasks
from tests.conftest import wait_for, worker_log, worker_row

pytestmark = pytest.mark.django_db(transaction=True)

LEADER_LINE = "is now the leader of backend 'default'"


# -- WorkerConfig.from_settings and an in-process run ------------------------------------------


def _other_sessions() -> set[int]:
    """The server sessions on the test database besides the test's own (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()}


def test_an_in_process_burst_run_built_from_settings_runs_everything_and_cleans_up():
    results = [tasks.add.enqueue(n, n) for n in range(6)]
    # Sessions an earlier test's threads may still be closing are not this worker's.
    before = _other_sessions() if connection.vendor == "postgresql" else set()
    config = WorkerConfig.from_settings("default", burst=True, concurrency=2)
    worker = Worker(config)
    assert worker.run() == 0
    assert {TaskRecord.objects.get(pk=r.id).status for r in results} == {
        TaskResultStatus.SUCCESSFUL
    }
    assert worker.services.running == []  # every service stopped and joined
    assert not WorkerRecord.objects.filter(worker_id=config.worker_id).exists()
    if connection.vendor == "postgresql":  # the advisory lock's session is gone too
        assert _other_sessions() - before == set()


def test_from_settings_takes_the_settings_for_unset_flags_and_names_a_bad_flag():
    config = WorkerConfig.from_settings("default", worker_id="w1")
    assert (config.concurrency, config.adaptive_prefetch, config.prefetch) == (8, True, 8)
    assert config.queues == ("default", "emails", "other", "slow")
    assert config.visibility_timeout == 60.0 and not config.burst

    config = WorkerConfig.from_settings(
        queues=["emails", "emails"], concurrency=3, prefetch=0, poll_interval=0.5
    )
    assert (config.queues, config.concurrency, config.prefetch) == (("emails",), 3, 0)
    assert (config.adaptive_prefetch, config.poll_interval) == (False, 0.5)

    cases = [
        ({"concurrency": 0}, "concurrency", "concurrency must be a whole number of at least 1"),
        ({"poll_interval": float("inf")}, "poll_interval", "poll_interval must be a positive"),
        ({"prefetch": -1}, "prefetch", "prefetch must be 0 or more."),
        ({"worker_id": "  "}, "worker_id", "worker_id must not be empty or blank"),
        ({"queues": ["nope"]}, None, "Unknown queue(s) 'nope' for backend 'default'"),
    ]
    for flags, option, message in cases:
        with pytest.raises(WorkerConfigError) as info:
            WorkerConfig.from_settings("default", **flags)
        assert info.value.option == option
        assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(WorkerConfigError, match="Unknown task backend 'missing'"):
        WorkerConfig.from_settings("missing")


# -- the service list -------------------------------------------------------------------------


class Recording(LoopService):
    """A real thread service that writes its start and stop into a shared journal."""

    interval = 0.01

    def __init__(self, name: str, journal: list[str], *, singleton: bool = False) -> None:
        super().__init__("default")
        self.name = name
        self.singleton = singleton
        self.journal = journal
        self.ticks = 0

    def start(self) -> None:
        self.journal.append(f"start {self.name}")
        super().start()

    def stop(self) -> None:
        self.journal.append(f"stop {self.name}")
        super().stop()

    def tick(self) -> None:
        self.ticks += 1


def test_services_start_in_order_stop_in_reverse_and_singletons_follow_leadership():
    journal: list[str] = []
    first, second = Recording("first", journal), Recording("second", journal)
    singleton = Recording("singleton", journal, singleton=True)
    services = Services([first, singleton, second])
    assert all(isinstance(s, Service) for s in (first, singleton, second))

    services.start()
    assert services.running == ["first", "second"]  # the singleton waits for leadership
    services.lead()
    wait_for(lambda: singleton.ticks > 0, timeout=5)
    services.follow()
    assert not singleton.is_alive()
    services.lead()  # regained: a stopped singleton starts again
    assert services.running == ["first", "second", "singleton"]

    assert services.stop(timeout=5) == []
    assert not any(s.is_alive() for s in (first, second, singleton))
    assert journal == [
        "start first",
        "start second",
        "start singleton",
        "stop singleton",
        "start singleton",
        "stop singleton",
        "stop second",
        "stop first",
    ]
    services.lead()  # after stop(), leadership news starts nothing
    assert services.running == []


class Broken(ThreadService):
    name = "tasks-broken"

    def start(self) -> None:
        raise OSError("no such device")


class WorkerWithABrokenService(Worker):
    def build_services(self) -> list[Service]:
        services = super().build_services()
        self.before_broken = services[:2]  # the reporter and the heartbeat
        return [*self.before_broken, Broken("default"), *services[2:]]


def test_a_service_that_cannot_start_stops_the_worker_with_its_name():
    kept = tasks.add.enqueue(1, 2)
    config = WorkerConfig.from_settings("default", burst=True, concurrency=1)
    worker = WorkerWithABrokenService(config)
    with pytest.raises(ServiceStartError) as info:
        worker.run()
    assert str(info.value) == (
        "Worker service 'tasks-broken' failed to start: OSError: no such device"
    )
    # The services started before it were stopped, no task was claimed, no row is left.
    assert not any(service.is_alive() for service in worker.before_broken)
    assert worker.services.running == []
    assert TaskRecord.objects.get(pk=kept.id).status == TaskResultStatus.READY
    assert not WorkerRecord.objects.filter(worker_id=config.worker_id).exists()


# -- leadership across processes ----------------------------------------------------------------


def _leaders(tmp_path, count: int) -> list[int]:
    """The workers whose log's last word on leadership is that they lead."""
    leaders = []
    for index in range(count):
        log = worker_log(tmp_path, index)
        if log.rfind(LEADER_LINE) > log.rfind("is no longer the leader"):
            leaders.append(index)
    return leaders


def test_exactly_one_worker_leads_and_another_takes_over_when_it_is_killed(start_worker, tmp_path):
    # A 3 s lease: followers bid every second; a killed leader's table lease lapses in
    # 3 s, its advisory lock (PostgreSQL) at once.
    ids = ["leader-test-a", "leader-test-b"]
    procs = [
        start_worker("--worker-id", worker_id, "--visibility-timeout", "3", "--concurrency", "1")
        for worker_id in ids
    ]
    wait_for(lambda: len(_leaders(tmp_path, 2)) >= 1, timeout=30)
    time.sleep(3.0)  # several election rounds: still exactly one leader
    [leader] = _leaders(tmp_path, 2)
    assert current_leader("default", "default") == ids[leader]

    # Only the leader prunes dead worker rows.
    worker_row("long-dead", silent_for=timedelta(hours=1), hostname="gone")
    wait_for(lambda: not WorkerRecord.objects.filter(worker_id="long-dead").exists(), timeout=15)

    follower = 1 - leader
    os.killpg(procs[leader].pid, signal.SIGKILL)
    procs[leader].wait(timeout=10)
    killed_at = time.monotonic()
    wait_for(lambda: LEADER_LINE in worker_log(tmp_path, follower), timeout=15)
    assert time.monotonic() - killed_at < 10  # lease (3 s) + a bid interval, with slack
    assert current_leader("default", "default") == ids[follower]
    assert procs[follower].poll() is None


def test_a_leader_stepping_down_at_shutdown_lets_the_next_one_lead_at_once(start_worker, tmp_path):
    """A stopped (not killed) leader gives its leadership up on the way out: the other
    worker leads within one bid interval, not after a lease lapses (lease here: 30 s)."""
    procs = [
        start_worker("--worker-id", worker_id, "--visibility-timeout", "30", "--concurrency", "1")
        for worker_id in ("stepdown-a", "stepdown-b")
    ]
    wait_for(lambda: len(_leaders(tmp_path, 2)) == 1, timeout=30)
    [leader] = _leaders(tmp_path, 2)
    follower = 1 - leader
    procs[leader].send_signal(signal.SIGTERM)
    assert procs[leader].wait(timeout=30) == 0
    assert "is no longer the leader" in worker_log(tmp_path, leader)
    # Followers bid every min(5 s, lease / 3): well under the 30 s lease.
    wait_for(lambda: LEADER_LINE in worker_log(tmp_path, follower), timeout=12)


def test_leader_election_threads_are_per_worker_and_stop_with_it():
    config = WorkerConfig.from_settings("default", burst=True, concurrency=1)
    worker = Worker(config)
    names = [service.name for service in worker.services.services]
    # The plugged-in services come first so that they stop last: the metrics flusher's
    # final flush follows the reporter's last batch (docs/metrics.md).
    assert names[:5] == [
        "tasks-metrics-flusher",
        "tasks-pruner",
        "tasks-scheduler",
        "tasks-reporter",
        "tasks-heartbeat",
    ]
    assert names[-1] == "tasks-leadership"
    assert worker.run() == 0
    assert not any(t.name == "tasks-leadership" for t in threading.enumerate())
    assert not any(t.name == "tasks-metrics-flusher" for t in threading.enumerate())
    assert not worker.is_leader


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL only")
def test_a_leader_whose_lock_session_is_cut_steps_down_and_leads_again(start_worker, tmp_path):
    """The advisory lock lives with its session: when the session is terminated, the
    leader notices on its next check, stops its singletons and bids again."""
    start_worker("--worker-id", "cut-leader", "--visibility-timeout", "1.5", "--concurrency", "1")
    wait_for(lambda: LEADER_LINE in worker_log(tmp_path, 0), timeout=30)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'cut-leader' AND datname = current_database()"
        )
        assert cursor.fetchall() == [(True,)]
    wait_for(lambda: "is no longer the leader" in worker_log(tmp_path, 0), timeout=15)
    wait_for(lambda: worker_log(tmp_path, 0).count(LEADER_LINE) == 2, timeout=15)
    assert current_leader("default", "default") == "cut-leader"
