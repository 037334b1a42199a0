"""Circuit breakers through real ``runtasks`` processes (the tasks are in tests/tasks.py).

A remote host is either a fake HTTP server in this process (PostgreSQL, three workers)
or a marker file: ``down-<host>`` makes the marker-file tasks raise ConnectionError, and
each call is logged to ``calls-<host>`` as "n pid start end up|down". Counting calls at
the "host" and comparing them with each row's ``attempt`` shows that a held task never
reached the host and never spent an attempt.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection  # noqa: F401 (the skipif condition reads it)
from django.utils import timezone

from django_tasks_plus import InvalidTaskArguments, enqueue_many
from django_tasks_plus.circuits import BreakerStatus, breaker_states, force_close, force_open
from django_tasks_plus.compat import TaskResultStatus
from django_tasks_plus.db.breakers import database_now
from django_tasks_plus.models import BreakerRecord, TaskRecord, WorkerRecord
from tests import tasks
from tests.conftest import wait_for, worker_log

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="three workers against a fake HTTP host need PostgreSQL (row locks, LISTEN/NOTIFY)",
)

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
FAST = ("--poll-interval", "0.1")  # held tasks become due between NOTIFYs: poll often


# -- helpers ----------------------------------------------------------------------------------


def _circuit(name: str, key: str) -> BreakerRecord | None:
    return BreakerRecord.objects.filter(backend_name="default", name=name, key=key).first()


def _state(name: str, key: str) -> str | None:
    row = _circuit(name, key)
    return None if row is None else row.state


def _status(name: str, key: str) -> BreakerStatus:
    [status] = [s for s in breaker_states() if (s.name, s.key) == (name, key)]
    return status


def _rows(scoped: str) -> list[TaskRecord]:
    return list(TaskRecord.objects.filter(breaker_key=scoped).order_by("enqueued_at", "id"))


def _calls(markers: Path, host: str) -> list[tuple[int, int, float, float, str]]:
    """The calls the pretend host received: (n, pid, start, end, "up"|"down")."""
    path = markers / f"calls-{host}"
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        n, pid, start, end, how = line.split()
        calls.append((int(n), int(pid), float(start), float(end), how))
    return calls


def _events(path: Path, name: str, **metadata: Any) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["name"] == name and all(
            event["metadata"].get(k) == v for k, v in metadata.items()
        ):
            found.append(event)
    return found


def _parked_count(path: Path) -> int:
    """Tasks parked in one statement each time a circuit parked its waiting tasks."""
    return sum(int(event["measurements"]["count"]) for event in _events(path, "breaker.parked"))


def _wait_for_workers(count: int) -> None:
    wait_for(lambda: WorkerRecord.objects.count() >= count, timeout=20)


def _n_of(row: TaskRecord) -> int:
    return int(row.args[1])


def _attempts_match_calls(rows: list[TaskRecord], calls: Counter[int]) -> None:
    """Each row spent exactly one attempt per call the host received for it."""
    spent = {_n_of(row): row.attempt for row in rows}
    expected = {_n_of(row): calls.get(_n_of(row), 0) for row in rows}
    # On a mismatch, show what each differing row recorded of its attempts.
    differing = {
        _n_of(row): (row.worker_ids, row.errors)
        for row in rows
        if spent[_n_of(row)] != expected[_n_of(row)]
    }
    assert spent == expected, differing


@pytest.fixture
def event_log(markers: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Workers started after this write every event as a JSON line (tests/tasks.py)."""
    path = markers / "events.jsonl"
    monkeypatch.setenv("DTP_EVENT_LOG", str(path))
    return path


# -- a flaky HTTP host ------------------------------------------------------------------------


class FlakyHost:
    """An HTTP server on 127.0.0.1: 200 while up, 503 while down; it logs every request."""

    def __init__(self) -> None:
        self.up = False
        self.lock = threading.Lock()
        self.requests: list[tuple[float, int, int]] = []  # (time, n, status answered)
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                status = 200 if host.up else 503
                with host.lock:
                    host.requests.append((time.time(), int(query["n"][0]), status))
                body = b"delivered" if status == 200 else b"down for maintenance"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            # A connection the kernel's accept queue drops (socketserver's default backlog
            # is 5) fails in the task without reaching the handler: an attempt spent that
            # the host never logged. Six task threads may connect at the same instant.
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def netloc(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.netloc}/hook"

    def snapshot(self) -> list[tuple[float, int, int]]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flaky_host() -> Iterator[FlakyHost]:
    host = FlakyHost()
    yield host
    host.close()


# -- 1. PostgreSQL: three workers, a real HTTP host going down and up ----------------------


@postgres_only
def test_http_host_down_then_up_through_three_workers(
    start_worker, markers, event_log, flaky_host: FlakyHost
):
    scoped = f"http/{flaky_host.netloc}"
    for index in range(3):
        start_worker("--concurrency", "2", *FAST, "--worker-id", f"breaker-http-{index}")
    _wait_for_workers(3)

    # The host is down: the circuit opens after 3 failures (a few more calls may have
    # been in flight when it did).
    first = enqueue_many(tasks.deliver, [((flaky_host.url, n), {}) for n in range(10)])
    wait_for(lambda: _state("http", flaky_host.netloc) == "open", timeout=15)
    wait_for(lambda: not TaskRecord.objects.filter(breaker_key=scoped, status=RUNNING).exists())
    settled = len(flaky_host.snapshot())
    before_open = Counter(n for _, n, _ in flaky_host.snapshot())
    assert 3 <= settled <= 3 + 6, flaky_host.snapshot()

    # Tasks enqueued while it is open are held: no attempt spent, held_since set, due at
    # the probe time.
    second = enqueue_many(tasks.deliver, [((flaky_host.url, n), {}) for n in range(10, 20)])
    second_ids = [result.id for result in second]
    wait_for(
        lambda: (
            TaskRecord.objects.filter(
                pk__in=second_ids, status=READY, held_since__isnull=False
            ).count()
            == 10
        ),
        timeout=5,
    )
    circuit = _circuit("http", flaky_host.netloc)
    assert circuit is not None and circuit.opened_at is not None
    probe_at = circuit.opened_at + dt.timedelta(seconds=2)
    for row in TaskRecord.objects.filter(pk__in=second_ids):
        assert row.attempt == 0 and row.errors == [] and row.worker_ids == []
        assert row.run_after == probe_at
    assert len(flaky_host.snapshot()) == settled  # nothing reached the host

    # After the recovery delay one probe reaches the (still down) host and fails: open again.
    # (A slow run may see more probes, one per recovery delay: only probes reach the host.)
    wait_for(lambda: len(flaky_host.snapshot()) > settled, timeout=10)
    wait_for(lambda: _state("http", flaky_host.netloc) == "open", timeout=5)
    wait_for(lambda: not TaskRecord.objects.filter(breaker_key=scoped, status=RUNNING).exists())
    while_open = flaky_host.snapshot()[settled:]
    assert all(status == 503 for _, _, status in while_open)

    # The host is back: the next probe succeeds, the circuit closes, everything delivers.
    flaky_host.up = True
    up_at = time.time()
    every = [*first, *second]
    wait_for(
        lambda: TaskRecord.objects.filter(breaker_key=scoped, status=SUCCESSFUL).count() == 20,
        timeout=15,
    )
    requests = flaky_host.snapshot()
    assert _state("http", flaky_host.netloc) == "closed"
    probes = _events(event_log, "breaker.probe_started", key=flaky_host.netloc)
    # Every request after the circuit opened was a probe's, and each probe made one:
    # the ones that found the host down, then the one that found it up.
    while_open = [(at, n, status) for at, n, status in requests[settled:] if status == 503]
    assert while_open
    assert len(probes) == len(while_open) + 1, (probes, while_open)
    delivered = [(at, n) for at, n, status in requests if status == 200]
    # Nothing lost, nothing twice: each task delivered exactly once.
    assert sorted(n for _, n in delivered) == list(range(20))
    # The first request after the host came back was the probe, alone.
    after_up = [(at, n, status) for at, n, status in requests if at >= up_at]
    probe_row = TaskRecord.objects.get(pk=probes[-1]["metadata"]["task_id"])
    assert after_up[0][1] == _n_of(probe_row)
    assert all(status == 200 for _, _, status in after_up)
    rows = _rows(scoped)
    assert [row.status for row in rows] == [SUCCESSFUL] * 20
    assert all(row.held_since is None for row in rows)
    # Attempts: one per request the host saw for that task, none for the holds.
    _attempts_match_calls(rows, Counter(n for _, n, _ in requests))
    for result in every:
        result.refresh()
        assert result.status == SUCCESSFUL

    probe_ok_at = after_up[0][0]
    last_at = max(at for at, _ in delivered)
    measured = {
        "failures_before_open": settled,
        "tasks_failed_before_open": len(before_open),
        "requests_while_open": len(while_open),
        "probes_while_open": len(probes) - 1,
        "requests_while_open_beyond_probes": len(while_open) - (len(probes) - 1),
        "probe_success_to_all_delivered_s": round(last_at - probe_ok_at, 3),
        "host_up_to_probe_s": round(probe_ok_at - up_at, 3),
    }
    (markers / "measured.json").write_text(json.dumps(measured))
    print("breaker delivery measured:", json.dumps(measured))
    assert measured["requests_while_open_beyond_probes"] == 0


# -- 2. the basic open / hold / close path with one worker (any database) -------------------


def test_open_hold_close_with_one_worker(start_worker, markers, event_log):
    down = markers / "down-flaky"
    down.touch()
    first = [tasks.call_host.enqueue("flaky", n) for n in range(2)]
    start_worker("--concurrency", "1", *FAST)
    wait_for(lambda: _state("local", "flaky") == "open", timeout=20)

    more = [tasks.call_host.enqueue("flaky", n) for n in range(2, 5)]
    more_ids = [result.id for result in more]
    wait_for(
        lambda: (
            TaskRecord.objects.filter(
                pk__in=more_ids, status=READY, held_since__isnull=False
            ).count()
            == 3
        ),
        timeout=10,
    )
    calls_while_open = len(_calls(markers, "flaky"))
    # Held, not run: only a probe reaches the host while the circuit is not closed (a
    # slow run may pass the 1 s recovery delay here, and probe with one of them).
    probes = len(_events(event_log, "breaker.probe_started", key="flaky"))
    reached = [n for n, *_ in _calls(markers, "flaky") if n in {2, 3, 4}]
    assert len(reached) <= probes, (reached, probes)
    for row in TaskRecord.objects.filter(pk__in=more_ids):
        if _n_of(row) not in reached:
            assert row.attempt == 0 and row.errors == []

    down.unlink()
    wait_for(
        lambda: (
            TaskRecord.objects.filter(breaker_key="local/flaky", status=SUCCESSFUL).count() == 5
        ),
        timeout=20,
    )
    assert _state("local", "flaky") == "closed"
    calls = _calls(markers, "flaky")
    assert sorted(n for n, *_, how in calls if how == "up") == [0, 1, 2, 3, 4]
    assert len(calls) >= calls_while_open
    _attempts_match_calls(_rows("local/flaky"), Counter(n for n, *_ in calls))
    for result in [*first, *more]:
        result.refresh()
        assert result.status == SUCCESSFUL
    log = worker_log(markers)
    assert "Circuit breaker local/flaky: closed -> open" in log
    assert "Circuit breaker local/flaky: half-open -> closed" in log


# -- 3. the probe is chosen atomically among workers ------------------------------------------


def test_exactly_one_probe_among_racing_workers(start_worker, markers, event_log):
    # Open since before its recovery delay (30 s): the first task claimed probes, and the
    # probe cannot go stale while a slow machine runs it.
    now = database_now("default")
    BreakerRecord.objects.create(
        backend_name="default",
        name="probe",
        key="solo",
        state="open",
        failures="[]",
        opened_at=now - dt.timedelta(minutes=1),
        updated_at=now,
    )
    for index in range(3):
        start_worker(
            "--concurrency", "2", "--prefetch", "0", *FAST, "--worker-id", f"probe-{index}"
        )
    _wait_for_workers(3)

    results = enqueue_many(tasks.call_probed_host, [(("solo", n, 0.5), {}) for n in range(6)])
    wait_for(
        lambda: TaskRecord.objects.filter(breaker_key="probe/solo", status=SUCCESSFUL).count() == 6,
        timeout=20,
    )
    calls = sorted(_calls(markers, "solo"), key=lambda call: call[2])
    assert sorted(n for n, *_ in calls) == list(range(6))  # each ran once
    probe, *others = calls
    # The probe ran alone: every other call started after it ended.
    assert all(start >= probe[3] for _, _, start, _, _ in others), calls
    probes = _events(event_log, "breaker.probe_started", key="solo")
    assert len(probes) == 1
    assert TaskRecord.objects.get(pk=probes[0]["metadata"]["task_id"]).args[1] == probe[0]
    # A task claimed while the probe ran was held until the probe ended, once. (How many
    # were claimed meanwhile depends on the machine's speed, so it is not counted.)
    held = _events(event_log, "task.held")
    assert all("half-open" in event["metadata"]["reason"] for event in held)
    assert len(held) == len({event["metadata"]["task_id"] for event in held}) <= 5
    assert _state("probe", "solo") == "closed"
    _attempts_match_calls(_rows("probe/solo"), Counter(n for n, *_ in calls))
    for result in results:
        result.refresh()
        assert result.status == SUCCESSFUL


# -- 4. held past the TTL: dead-lettered, on_drop told; raising hooks do not hurt ------------


def test_a_task_held_past_its_ttl_is_dead_lettered(start_worker, markers):
    proc = start_worker("--concurrency", "1", *FAST)
    opener = tasks.held_past_ttl.enqueue(0)
    wait_for(lambda: _state("ttl", "ttl-host") == "open", timeout=20)
    # One at a time: a task enqueued beside a held one would be parked until the probe
    # time (a minute away), not dropped when its held TTL (1 s) ends.
    victims = []
    for n in (1, 2):
        victims.append(tasks.held_past_ttl.enqueue(n))
        wait_for(lambda v=victims[-1].id: TaskRecord.objects.get(pk=v).status == FAILED, timeout=15)
    ids = [result.id for result in victims]

    for row in TaskRecord.objects.filter(pk__in=ids):
        assert "breaker held too long" in row.dead_letter_reason
        assert row.errors[-1]["exception_class_path"] == (
            "django_tasks_plus.exceptions.BreakerHeldTooLong"
        )
        assert len(row.errors) == 1  # never ran: the one error is the drop
    assert not (markers / "ttl-ran").exists()
    drops = [json.loads(line) for line in (markers / "ttl-drops").read_text().splitlines()]
    assert sorted(drop["task_id"] for drop in drops) == sorted(ids)
    assert {drop["key"] for drop in drops} == {"ttl-host"}
    assert sorted(drop["args"] for drop in drops) == [[1], [2]]
    assert all(drop["task_path"] == "tests.tasks.held_past_ttl" for drop in drops)
    assert (markers / "ttl-state-changes").read_text().splitlines() == ["ttl-host closed open"]
    opener.refresh()
    assert opener.status == FAILED  # it failed for real (one attempt), it was not dropped

    # Both hooks raised; each was logged and the worker went on working.
    done = tasks.add.enqueue(2, 3)
    wait_for(lambda: TaskRecord.objects.get(pk=done.id).status == SUCCESSFUL, timeout=10)
    assert proc.poll() is None
    log = worker_log(markers)
    assert "on_state_change hook" in log and "on_drop hook" in log
    assert "RuntimeError: state hook exploded" in log
    assert "RuntimeError: drop hook exploded" in log
    assert log.count("past the held TTL") == 2


# -- 5. a corrupt stored circuit counts as closed ---------------------------------------------


def test_a_corrupt_circuit_is_treated_as_closed(run_worker, markers):
    now = timezone.now()
    BreakerRecord.objects.create(
        backend_name="default", name="local", key="bogus", state="bogus", updated_at=now
    )
    BreakerRecord.objects.create(
        backend_name="default",
        name="local",
        key="garbled",
        state="open",
        failures="not json",
        opened_at=now,
        updated_at=now,
    )
    results = [tasks.call_host.enqueue(host, n) for n, host in enumerate(["bogus", "garbled"])]
    proc = run_worker("--burst", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    for result in results:
        result.refresh()
        assert result.status == SUCCESSFUL
    output = proc.stdout + proc.stderr
    assert "Circuit breaker local/bogus: the stored state is corrupt (unknown state 'bogus')" in (
        output
    )
    assert "Circuit breaker local/garbled: the stored state is corrupt (unreadable failure" in (
        output
    )
    assert _status("local", "bogus").state == "corrupt"
    assert "unknown state" in _status("local", "bogus").problem

    # The next change overwrites the corrupt row with a good one.
    (markers / "down-garbled").touch()
    failing = tasks.call_host.enqueue("garbled", 7)
    proc = run_worker("--burst", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    status = _status("local", "garbled")
    row = TaskRecord.objects.get(pk=failing.id)
    # Two failures open it; a slow run may reach the recovery delay (1 s) and probe once
    # more (failing again): each call spent one attempt and is remembered.
    assert row.status == READY and row.attempt >= 2 and row.held_since is not None
    assert (status.state, status.failures, status.problem) == ("open", row.attempt, "")
    assert sum(1 for n, *_ in _calls(markers, "garbled") if n == 7) == row.attempt


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="lock_timeout by PGOPTIONS")
def test_a_circuit_the_database_cannot_answer_for_holds_without_spending_an_attempt(
    start_worker, markers, tmp_path
):
    """An operator's transaction holds the circuit's row lock while the circuit is open;
    the worker's task threads give up waiting after lock_timeout (set for the worker's
    sessions through libpq's PGOPTIONS). The task is held, its attempt not spent; once the
    lock is gone it probes and runs."""
    from django.db import transaction

    now = timezone.now()
    BreakerRecord.objects.create(
        backend_name="default",
        name="local",
        key="locked",
        state="open",
        failures=json.dumps([now.isoformat()]),
        opened_at=now - dt.timedelta(seconds=5),  # past recovery_delay: a probe may run
        updated_at=now,
    )
    result = tasks.call_host.enqueue("locked", 1)
    with transaction.atomic():
        BreakerRecord.objects.select_for_update().get(name="local", key="locked")
        proc = start_worker(
            "--burst", "--concurrency", "1", env={"PGOPTIONS": "-c lock_timeout=200"}
        )
        assert proc.wait(timeout=60) == 0
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.attempt) == (READY, 0)
    assert row.held_since is not None and row.run_after > timezone.now()
    assert "Circuit breaker local/locked: its state could not be read (OperationalError" in (
        worker_log(tmp_path)
    )
    assert _calls(markers, "locked") == []

    TaskRecord.objects.filter(pk=result.id).update(run_after=timezone.now())
    proc = start_worker("--burst", "--concurrency", "1")
    assert proc.wait(timeout=60) == 0
    result.refresh()
    assert result.status == SUCCESSFUL
    assert TaskRecord.objects.get(pk=result.id).attempt == 1
    assert _state("local", "locked") == "closed"


# -- 6. the key function at enqueue ----------------------------------------------------------


def test_enqueue_refuses_a_bad_key_function_and_none_means_no_breaker(run_worker, markers):
    with pytest.raises(InvalidTaskArguments, match="key function raised LookupError"):
        tasks.call_host.enqueue("raises", 1)
    with pytest.raises(InvalidTaskArguments, match="got 42"):
        tasks.call_host.enqueue("number", 2)
    with pytest.raises(InvalidTaskArguments):
        enqueue_many(tasks.call_host, [(("fine", 3), {}), (("raises", 4), {})])
    assert TaskRecord.objects.count() == 0

    unguarded = tasks.call_host.enqueue("none", 5)
    guarded = tasks.call_host.enqueue("fine", 6)
    assert TaskRecord.objects.get(pk=unguarded.id).breaker_key is None
    assert TaskRecord.objects.get(pk=guarded.id).breaker_key == "local/fine"
    (markers / "down-none").touch()  # a failing call without a breaker: plain retries
    proc = run_worker("--burst", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    unguarded.refresh()
    guarded.refresh()
    assert guarded.status == SUCCESSFUL
    assert unguarded.status == FAILED
    assert TaskRecord.objects.get(pk=unguarded.id).attempt == 50  # never held
    assert [call[0] for call in _calls(markers, "none")] == [5] * 50
    assert not BreakerRecord.objects.filter(key="none").exists()


# -- 7. a thousand held tasks are parked, and do not starve another host ------------------


def test_held_tasks_are_parked_and_do_not_starve_other_hosts(start_worker, markers, event_log):
    """Counts what the design promises, not what a fast machine does: each task of the
    dead host is claimed and held at most once before the probe time; the tasks held one
    by one are those the workers had claimed when the park (done under the circuit's row
    lock) landed, at most what their slots and prefetch buffers hold, plus the retries of
    the calls that failed before the circuit opened; and the other host's tasks all run
    while the dead host's circuit is still open."""
    (markers / "down-dead").touch()
    dead = enqueue_many(tasks.call_parked_host, [(("dead", n), {}) for n in range(1000)])
    alive = enqueue_many(tasks.call_parked_host, [(("alive", n), {}) for n in range(5)])
    for index in range(2):
        start_worker("--concurrency", "4", *FAST, "--worker-id", f"park-{index}")

    wait_for(lambda: _state("park", "dead") == "open", timeout=20)
    alive_ids = [result.id for result in alive]
    wait_for(
        lambda: TaskRecord.objects.filter(pk__in=alive_ids, status=SUCCESSFUL).count() == 5,
        timeout=30,
    )
    circuit = _circuit("park", "dead")
    assert circuit is not None and circuit.opened_at is not None
    probe_at = circuit.opened_at + dt.timedelta(seconds=30)
    finished = max(
        TaskRecord.objects.filter(pk__in=alive_ids).values_list("finished_at", flat=True)
    )
    # The other host did not wait for the dead one: done before its probe could start.
    assert finished < probe_at, (finished, probe_at)

    # Every task of the dead host is held until the probe time: none is due before it,
    # so none can be claimed again before it.
    wait_for(
        lambda: (
            TaskRecord.objects.filter(
                breaker_key="park/dead", status=READY, held_since__isnull=False, run_after=probe_at
            ).count()
            == 1000
        ),
        timeout=30,
    )
    # Each task was parked in one statement or held one by one (task.held is written to
    # the log just after the row, so wait for the last ones).
    wait_for(lambda: _parked_count(event_log) + len(_events(event_log, "task.held")) >= 1000)
    held = _events(event_log, "task.held")
    print(f"parking: {len(held)} held claims for 1000 held tasks")
    assert max(Counter(event["metadata"]["task_id"] for event in held).values()) == 1
    calls = _calls(markers, "dead")
    assert len(calls) <= 3 + 2 * 4, calls  # the threshold, plus calls already in flight
    # Two workers, each with 4 slots and an adaptive prefetch of up to 256.
    assert len(held) <= 2 * (256 + 4) + len(calls), len(held)

    assert all(how == "down" for *_, how in calls)
    rows = _rows("park/dead")
    assert len(rows) == 1000
    _attempts_match_calls(rows, Counter(n for n, *_ in calls))
    assert _status("park", "dead").held == 1000
    assert len(dead) == 1000


# -- 7b. while a probe runs, the tasks held one by one join the park ------------------------


@pytest.mark.parametrize("waiting", [30, 90])
def test_tasks_held_while_the_probe_runs_join_the_park(start_worker, markers, event_log, waiting):
    """Half-open: the probe's batch-mates and the tasks enqueued after the park are held
    once each, until the probe would be stale, however many tasks wait and however long
    the probe runs. (They used to be held for the release interval, 50 ms here, and
    claimed again each time, each claim taking the circuit row's lock and writing.)"""
    now = database_now("default")
    BreakerRecord.objects.create(
        backend_name="default",
        name="halfopen",
        key="slow",
        state="open",
        failures="[]",
        opened_at=now - dt.timedelta(hours=1),  # past the recovery delay: the next one probes
        updated_at=now,
    )
    first = enqueue_many(tasks.call_slow_host, [(("slow", n), {}) for n in range(waiting)])
    start_worker("--concurrency", "4", "--prefetch", "0", *FAST)
    wait_for(lambda: _state("halfopen", "slow") == "half-open", timeout=20)
    circuit = _circuit("halfopen", "slow")
    assert circuit is not None and circuit.probe_started_at is not None
    stale_at = circuit.probe_started_at + dt.timedelta(seconds=60)

    def parked() -> int:
        return TaskRecord.objects.filter(
            breaker_key="halfopen/slow", status=READY, held_since__isnull=False, run_after=stale_at
        ).count()

    # Every task but the probe waits in the park, the probe's batch-mates included.
    wait_for(lambda: parked() == waiting - 1, timeout=20)
    # Tasks enqueued after the park join it when they are claimed.
    later = enqueue_many(tasks.call_slow_host, [(("slow", n), {}) for n in range(100, 103)])
    wait_for(lambda: parked() == waiting - 1 + 3, timeout=20)

    # Each was parked in one statement or held one by one (task.held is logged just
    # after the row is written).
    total = waiting - 1 + 3
    wait_for(lambda: _parked_count(event_log) + len(_events(event_log, "task.held")) == total)
    held = _events(event_log, "task.held")
    # Held one by one: at most the probe's 3 batch-mates (4 slots, no prefetch) and the 3
    # tasks enqueued later, each once; the others were parked in one statement.
    assert len(held) <= 3 + 3, held
    assert max(Counter(event["metadata"]["task_id"] for event in held).values()) == 1
    assert len(_events(event_log, "breaker.parked")) == 1
    assert len(_calls(markers, "slow")) == 0  # the probe still waits for the host
    # Nothing of the key is due, so nothing can be claimed again before the probe ends.
    assert not TaskRecord.objects.filter(
        breaker_key="halfopen/slow", status=READY, run_after__lt=stale_at
    ).exists()

    (markers / "up-slow").touch()
    everything = [*first, *later]
    ids = [result.id for result in everything]
    wait_for(
        lambda: TaskRecord.objects.filter(pk__in=ids, status=SUCCESSFUL).count() == waiting + 3,
        timeout=30,
    )
    assert _state("halfopen", "slow") == "closed"
    calls = Counter(n for n, *_ in _calls(markers, "slow"))
    assert sorted(calls) == [*range(waiting), 100, 101, 102]
    assert set(calls.values()) == {1}
    assert len(_events(event_log, "breaker.probe_started")) == 1
    # Held once each at most over the whole probe: the count does not grow with time.
    assert len(_events(event_log, "task.held")) == len(held)


# -- 8. force_close releases the held tasks --------------------------------------------------


def test_force_close_releases_held_tasks(run_worker, markers):
    force_open("ops", name="park")
    results = [tasks.call_parked_host.enqueue("ops", n) for n in range(5)]
    proc = run_worker("--burst", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    status = _status("park", "ops")
    assert (status.state, status.held, status.failures) == ("open", 5, 0)
    assert status.opened_at is not None
    for row in _rows("park/ops"):
        assert row.status == READY and row.attempt == 0
        assert row.run_after == status.opened_at + dt.timedelta(seconds=30)

    assert force_close("ops", name="park") == 5
    now = database_now("default")
    assert all(row.run_after <= now for row in _rows("park/ops"))
    assert _status("park", "ops").state == "closed"

    proc = run_worker("--burst", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    for result in results:
        result.refresh()
        assert result.status == SUCCESSFUL
    status = _status("park", "ops")
    assert (status.state, status.held, status.failures) == ("closed", 0, 0)
    assert sorted(n for n, *_ in _calls(markers, "ops")) == list(range(5))
