"""The ``runtasks`` engine: claim batches, hand them to doers, run them on threads.

One main thread claims and dispatches; ``concurrency`` threads run tasks. Everything else
runs as worker services (``services.py``), started from one list by ``run()`` and stopped
by ``_shutdown()``: the reporter writes outcomes in batches (group commit), the heartbeat
renews leases and reaps, on PostgreSQL a listener turns NOTIFY into wake-ups, and the
leader election starts the singleton services (the worker-row pruner) on one worker per
backend.

Doers are pure bookkeeping, touched under one lock: the main thread admits claimed tasks
and starts them on free threads; a task thread that finishes a task tells its doer and
starts the next waiting one itself, so a busy worker's claim loop turns once per batch of
outcomes, not once per task.

The process's bookkeeping uses two database sessions (``sessions.py``), whatever its
services: the claim loop and the outcome writer take turns on one, every other service
on the other (the NOTIFY listener keeps a third, and task threads their own).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from .. import events
from ..compat import task_backends
from ..db import dialect_for, worker_connection
from ..db.completions import apply_outcome
from ..db.store import (
    WORKER_ROW_LOCK_WAIT,
    WorkerRegistration,
    WorkerStatus,
    register_worker,
    remove_worker,
)
from ..db.unpooled import guard_pooled_sessions, outside_the_pool
from ..discovery import discover_task_modules
from ..lifecycle import ClaimedTask, Lease, Released
from .config import WorkerConfig
from .dbclock import DatabaseClock
from .doers import Doer, make_doer
from .execution import TaskRunner
from .heartbeat import Heartbeat
from .leadership import LeaderElection
from .outcome import outcome_for
from .plugins import ServiceContext, plugged_services
from .reporter import Reporter
from .services import Service, Services, ServiceStartError
from .sessions import SharedSession
from .slots import Slots
from .tally import OutcomeTally
from .wakeup import MIN_POLL, NotifyListener, PollBackoff

if TYPE_CHECKING:
    from ..backend import DatabaseBackend
    from ..conf import BackendSettings

logger = logging.getLogger("django_tasks_plus.worker")

# Adaptive prefetch holds about this much work, by recent run times, beyond the threads'
# own, and never more than MAX_ADAPTIVE_PREFETCH tasks: short tasks are claimed in big
# batches (few claim round trips and commits per task), long ones a few at a time (no
# hoarding while another process idles). 1,024 rather than 256: no-op tasks then fill
# the 0.1 s (about 600 of them per process here), and a drain ran 1.11-1.13x faster.
PREFETCH_BUFFER_SECONDS = 0.1
MAX_ADAPTIVE_PREFETCH = 1024
# ... and never more tasks than hold about this much stored arguments, by recent sizes:
# a thousand fast tasks of a megabyte each would otherwise sit in one process's memory.
PREFETCH_PAYLOAD_BUDGET = 16 * 1024 * 1024
# Weight of the newest value in the moving averages that size adaptive prefetch.
PREFETCH_SMOOTHING = 0.1

START_LOCK_WAIT = 5.0
"""Seconds the worker's first write of its row waits for it: a reused worker id (a fixed
``--worker-id``, a child relaunched by the supervisor) can meet the row locked for a
moment by the leader's pruner; a session that keeps it locked fails the start."""

# Signals this close together are one request (group delivery plus supervisor forwarding).
DUPLICATE_SIGNAL_WINDOW = 0.5


class ClaimRound(NamedTuple):
    """What one claim round did: ``claimed`` tasks; ``full`` when some queue group gave
    all that was asked of it (more may be due right now; one that gave less had no more
    due rows); ``failed`` when a claim statement failed, so an empty round says nothing
    about what is due."""

    claimed: int
    full: bool
    failed: bool


@functools.cache
def installed_version() -> str:
    """The installed django-tasks-plus distribution's version, for the worker's row; empty
    when the package runs from a source tree that was never installed. Read once: the
    code running is the one imported at start, whatever is installed later."""
    try:
        return importlib.metadata.version("django-tasks-plus")
    except importlib.metadata.PackageNotFoundError:
        return ""


def prepare_to_fork(config: WorkerConfig) -> None:
    """Do once, in the supervisor, the start-up work every forked worker would repeat:
    import the task modules, read the installed version, load what the dialect's writes
    need (``Dialect.prepare_worker``), open a first database session (the driver's and
    Django's per-process state). Memory written before the fork is shared by all
    children; the same work in each child costs each its own copy (1.8 MB off two
    workers' summed PSS, docs/performance.md). A database that is down is left to the
    workers, which report it as they do today."""
    backend = cast("DatabaseBackend", task_backends[config.backend_alias])
    discover_task_modules(backend.settings)
    installed_version()
    database = backend.settings.database
    dialect_for(connections[database]).prepare_worker()
    with outside_the_pool(database), contextlib.suppress(DatabaseError):
        connection = connections[database]
        try:
            connection.ensure_connection()
        finally:
            connection.close()


def adaptive_prefetch(
    concurrency: int, floor: int, run_seconds: float | None, payload_size: float | None = None
) -> int:
    """How many tasks to hold beyond the threads, given the average run time so far (and
    the average size of the tasks' stored arguments, ``payload_size``, if known).

    About ``PREFETCH_BUFFER_SECONDS`` of work for all threads, and no more than
    ``PREFETCH_PAYLOAD_BUDGET`` of arguments, between ``floor`` and
    ``MAX_ADAPTIVE_PREFETCH``; ``floor`` until a run time is known.
    """
    if run_seconds is None:
        return floor
    wanted = concurrency * PREFETCH_BUFFER_SECONDS / max(run_seconds, 1e-6)
    if payload_size:
        wanted = min(wanted, PREFETCH_PAYLOAD_BUDGET / payload_size)
    return max(floor, min(MAX_ADAPTIVE_PREFETCH, int(wanted)))


def smoothed(average: float | None, value: float) -> float:
    """``average`` moved toward ``value`` by ``PREFETCH_SMOOTHING`` (``value`` itself when
    there is no average yet): the moving averages that size adaptive prefetch."""
    return value if average is None else average + PREFETCH_SMOOTHING * (value - average)


def payload_average(average: float | None, size: float) -> float:
    """The stored-argument size adaptive prefetch plans with, after a claim whose tasks
    averaged ``size``: a bigger size at once (big tasks arriving after small ones must not
    be claimed a thousand at a time by the old average), a smaller one slowly."""
    return size if average is None or size >= average else smoothed(average, size)


@dataclass
class QueueGroup:
    """Queues that share one doer, claimed together in one statement."""

    doer: Doer
    queues: tuple[str, ...]


def build_groups(backend_settings: BackendSettings, queues: Sequence[str]) -> list[QueueGroup]:
    """One group per distinct doer spec: queues without their own spec share the default."""
    groups: dict[str, tuple[Any, list[str]]] = {}
    for name in queues:
        spec = backend_settings.doer_spec_for(name)
        key = f"queue:{name}" if backend_settings.has_own_doer(name) else repr(spec)
        groups.setdefault(key, (spec, []))[1].append(name)
    return [QueueGroup(make_doer(spec), tuple(names)) for spec, names in groups.values()]


class Worker:
    """One worker process. ``run()`` returns the exit code."""

    def __init__(self, config: WorkerConfig, clock: Callable[[], datetime] | None = None) -> None:
        self.config = config
        self.backend = cast("DatabaseBackend", task_backends[config.backend_alias])
        # Every installed app's tasks module, so their definitions' services are known.
        discover_task_modules(self.backend.settings)
        self.database = self.backend.settings.database
        # The host's clock corrected to the database's, unless a test brings its own.
        self.database_clock = DatabaseClock(self.database) if clock is None else None
        self.clock: Callable[[], datetime] = clock or self.database_clock  # type: ignore[assignment]
        self.groups = build_groups(self.backend.settings, config.queues)
        # The latency-critical session (claims, outcomes) and the one every periodic
        # service shares: a slow duty never delays a claim or an outcome.
        self.claim_session = SharedSession(self.database, "claim loop and outcome writer")
        self.periodic_session = SharedSession(self.database, "periodic services")
        self.tally = OutcomeTally()  # this process's processed and failed attempts
        self.version = installed_version()  # for its row
        self.reporter = Reporter(
            self.database,
            persist_deadline=config.visibility_timeout,
            clock=self.clock,
            session=self.claim_session,
        )
        self.runner = TaskRunner(
            self.backend,
            clock=self.clock,
            reporter=self.reporter,
            on_written=self._on_written,
            schedule=self._schedule,
            log_each_task=config.log_each_task,
            on_settle=self._mark_settling,
            tally=self.tally,
        )
        self.stopping = threading.Event()
        self.wakeup = threading.Event()
        # Guards the doers, the turn-taking cursor and the run-time average: the main
        # thread and finishing task threads both start tasks.
        self._doers_lock = threading.Lock()
        self._run_seconds: float | None = None  # moving average, written under the lock
        self._payload_size: float | None = None  # payload_average's, the claim loop's own
        # Keyed by (id, lease token): after a lost lease the same task may be claimed
        # again, and the old attempt settling must not end the new attempt's lease.
        self._leased: dict[Lease, ClaimedTask] = {}
        self._settling: set[Lease] = set()  # outcome being written: lease ends on purpose
        self._leased_lock = threading.Lock()
        self._claimed_total = 0
        self._group_cursor = 0
        self._claim_cursor = 0
        self.signals_received = 0
        self._pool = Slots(
            config.concurrency, name_prefix="tasks-slot", on_exit=connections.close_all
        )
        self.listening = (
            config.listen
            and self.backend.settings.notify
            and dialect_for(connections[self.database]).supports_notify
        )
        self.started_at: datetime | None = None  # set by run()
        self.election: LeaderElection | None = None
        self.services = Services(self.build_services(), session=self.periodic_session)

    # -- lifecycle ----------------------------------------------------------------------

    def run(self) -> int:
        # The claim loop's bounded statements run in turns on the claim session, never
        # on one a task thread could get from a connection pool (db/unpooled.py); the
        # main thread's own connection (outside turns) is kept out of the pool too.
        guard_pooled_sessions()
        with outside_the_pool(self.database):
            try:
                return self._run()
            finally:
                self.claim_session.close()
                self.periodic_session.close()

    def _run(self) -> int:
        self._install_signal_handlers()
        starting = time.monotonic()
        try:
            with self.claim_session.turn():
                if self.database_clock is not None:
                    self.database_clock.sync()
                self.started_at = self.clock()
                self._register(self.started_at, lock_wait=START_LOCK_WAIT)
        except DatabaseError as exc:
            # Nothing was claimed yet: one line that says what to check, not a traceback.
            problem = " ".join(str(exc).split())  # the driver's message spans lines
            raise ServiceStartError(
                f"Worker {self.config.worker_id!r} cannot start: its first statement on "
                f"database {self.database!r} failed ({type(exc).__name__}: {problem}). "
                "Check that the database is running, reachable with these settings, and "
                "migrated (manage.py migrate)."
            ) from exc
        abandoned = 0
        up_since = time.monotonic()
        events.emit_worker_started(
            self.backend.alias, self.config.worker_id, self.config.queues, self.config.concurrency
        )
        try:
            # A service that cannot start raises ServiceStartError: the worker shuts down
            # (the started ones are stopped there) and the error reaches the caller.
            self.services.start()
            # Return what dead workers left behind before the first claim (matters for
            # --burst); a failure here is the heartbeat's to retry, not fatal.
            self._reap_at_start(starting)
            self._loop()
        finally:
            abandoned = self._shutdown()
            events.emit_worker_stopped(
                self.backend.alias,
                self.config.worker_id,
                claimed=self._claimed_total,
                abandoned=abandoned,
                uptime=time.monotonic() - up_since,
            )
        return 1 if abandoned else 0

    def _register(self, now: datetime, lock_wait: float = WORKER_ROW_LOCK_WAIT) -> None:
        """Write this worker's row: at start, and from the heartbeat if it was deleted
        (the same id and start time, so leases and task history still name it)."""
        register_worker(
            self.database,
            WorkerRegistration(
                worker_id=self.config.worker_id,
                backend_name=self.backend.alias,
                queues=tuple(self.config.queues),
                concurrency=self.config.concurrency,
                visibility_timeout=self.config.visibility_timeout,
                started_at=self.started_at or now,
                version=self.version,
            ),
            now,
            self._status(),
            lock_wait=lock_wait,
        )

    def _status(self) -> WorkerStatus:
        """What the heartbeat writes on the row besides the time: this process's counts
        and its leadership as the election service holds it now."""
        processed, failed = self.tally.totals()
        election = self.election
        return WorkerStatus(
            tasks_processed=processed,
            tasks_failed=failed,
            leader_since=election.since if election is not None else None,
        )

    def build_services(self) -> list[Service]:
        """The worker's services, in start order (stopped in reverse order).

        Only the engine's own are listed here; features, ``OPTIONS["SERVICES"]`` and task
        definitions plug theirs in through service factories (``plugins.py``). Per-worker
        services run on every worker; ``singleton`` ones only on the elected leader.
        """
        config = self.config
        context = ServiceContext(
            backend=self.backend,
            worker_id=config.worker_id,
            queues=config.queues,
            clock=self.clock,
            bound_seconds=config.visibility_timeout,
            outcome_writer=self.reporter,
        )
        self.heartbeat = Heartbeat(
            self.backend,
            worker_id=config.worker_id,
            register=self._register,
            leases=self._lease_snapshot,
            holding=self._held_leases,
            on_lost=self._on_leases_lost,
            clock=self.clock,
            visibility_timeout=config.visibility_timeout,
            sync_clock=self.database_clock.sync if self.database_clock is not None else None,
            status=self._status,
        )
        services: list[Service] = [
            # First, so they stop last: a final metrics flush follows the reporter's
            # last batch.
            *plugged_services(context),
            self.reporter,
            self.heartbeat,
        ]
        if self.listening:
            services.append(NotifyListener(self.database, config.queues, self.wakeup))
        if any(service.singleton for service in services):
            self.election = LeaderElection(
                self.database,
                backend_name=self.backend.alias,
                worker_id=config.worker_id,
                lease_seconds=config.visibility_timeout,
                on_change=self._on_leadership,
                clock=self.clock,
            )
            services.append(self.election)
        return services

    @property
    def is_leader(self) -> bool:
        """Whether this worker leads its backend now (runs the singleton services)."""
        return self.election is not None and self.election.is_leader

    def _on_leadership(self, leading: bool) -> None:
        """Leadership thread: start or stop the singleton services."""
        if leading:
            self.services.lead()
        else:
            self.services.follow()
        events.emit(
            events.LEADER_ELECTED if leading else events.LEADER_LOST,
            {},
            {"worker_id": self.config.worker_id, "backend": self.backend.alias},
        )

    def _reap_at_start(self, starting: float) -> None:
        """Return expired leases before the first claim (``Heartbeat.reap_at_start``); a
        failure here is the heartbeat's to retry, not fatal."""
        try:
            with self.claim_session.turn():
                self.heartbeat.reap_at_start(starting)
        except DatabaseError as exc:
            logger.warning("Returning expired leases at start failed (%s); will retry.", exc)
        except Exception:
            logger.exception("Returning expired leases at start failed; will retry.")

    def request_stop(self) -> None:
        self.stopping.set()
        self.wakeup.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        first_signal_at: list[float] = []

        def handle(signum: int, frame: FrameType | None) -> None:
            now = time.monotonic()
            if first_signal_at and now - first_signal_at[0] < DUPLICATE_SIGNAL_WINDOW:
                # The same stop request delivered twice (to the process group and again
                # by a --processes supervisor): not a second request.
                return
            first_signal_at.append(now)
            self.signals_received += 1
            if self.signals_received > 1:
                logger.warning("Second signal: exiting now; unfinished leases will expire.")
                os._exit(1)
            logger.warning(
                "Received %s: finishing running tasks (up to %.0f s), releasing the rest.",
                signal.Signals(signum).name,
                self.config.shutdown_timeout,
            )
            self.request_stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- main loop ----------------------------------------------------------------------

    def _loop(self) -> None:
        # With NOTIFY, new tasks wake us; polling only catches tasks whose run_after arrives.
        minimum = self.config.poll_interval if self.listening else MIN_POLL
        backoff = PollBackoff(self.config.poll_interval, minimum)
        while not self.stopping.is_set():
            self.wakeup.clear()
            if self._supervisor_gone():
                self.request_stop()
                return
            if not self.reporter.is_alive():
                # Nothing could record outcomes any more: stop, and let the leases expire.
                logger.critical("The outcome writer thread died; stopping this worker.")
                return
            # Read before claiming: outcomes are written (a retry makes its task READY
            # again) before their lease leaves this set, so an empty set here means the
            # claim below saw every such task.
            idle_before_claim = not self._leased
            claimed, full, failed = self._claim()
            self._dispatch()
            if self._max_tasks_done():
                logger.info("Reached --max-tasks=%s; stopping.", self.config.max_tasks)
                return
            # A claim that failed (the database went away, a statement was cancelled)
            # found nothing only because it did not look: --burst goes on after it.
            if self.config.burst and claimed == 0 and idle_before_claim and not failed:
                logger.info("Burst mode: nothing left to do; stopping.")
                return
            if claimed:
                backoff.reset()  # work is flowing: poll soon again
                # Claim again at once only if more may be due: after a claim that took
                # less than it asked for, a new task's NOTIFY (or the poll) wakes us, and
                # the claim right away would find nothing (one empty claim per task).
                if full and self._free_slots(self._capacity()) > 0:
                    continue
            self.wakeup.wait(backoff.next())

    def _supervisor_gone(self) -> bool:
        """Whether the supervisor that started this worker has died without stopping it
        (killed outright: SIGKILL, the OOM killer), leaving it to a parent that will
        neither stop nor restart it. One system call, made on every turn of the loop (at
        least once per poll interval)."""
        supervisor = self.config.supervisor_pid
        if supervisor is None or os.getppid() == supervisor:
            return False
        logger.warning(
            "The supervisor that started this worker (pid %d) is gone: finishing running "
            "tasks (up to %.0f s), releasing the rest, as on SIGTERM.",
            supervisor,
            self.config.shutdown_timeout,
        )
        return True

    def _prefetch(self) -> int:
        """Tasks to hold beyond the threads: fixed, or sized by recent run times (and
        argument sizes)."""
        if not self.config.adaptive_prefetch:
            return self.config.prefetch
        return adaptive_prefetch(
            self.config.concurrency, self.config.prefetch, self._run_seconds, self._payload_size
        )

    def _capacity(self) -> int:
        """Tasks this process may hold at once: its threads' plus the prefetch."""
        return self.config.concurrency + self._prefetch()

    def _free_slots(self, capacity: int) -> int:
        free = capacity - len(self._leased)
        if self.config.max_tasks is not None:
            free = min(free, self.config.max_tasks - self._claimed_total)
        return max(0, free)

    def _max_tasks_done(self) -> bool:
        max_tasks = self.config.max_tasks
        return max_tasks is not None and self._claimed_total >= max_tasks and not self._leased

    def _claim(self) -> ClaimRound:
        """Claim for the free slots, one statement per queue group."""
        capacity = self._capacity()
        free = self._free_slots(capacity)
        if free <= 0:
            return ClaimRound(0, False, False)
        with self._doers_lock:
            waiting = sum(group.doer.waiting for group in self.groups)
        if waiting and free < max(1, capacity // 2):
            # Work is still queued in-process: wait until a worthwhile batch is free
            # rather than paying one claim round trip per finished task.
            return ClaimRound(0, False, False)
        total = 0
        full = False
        # Every doer gets a fair share of the free slots, starting with a different doer
        # each round, so one busy queue group cannot starve the others.
        offset = self._claim_cursor % len(self.groups)
        self._claim_cursor += 1
        order = self.groups[offset:] + self.groups[:offset]
        for position, group in enumerate(order):
            share = -(-free // (len(order) - position))  # ceil: leftovers roll forward
            with self._doers_lock:
                wanted = group.doer.capacity(share)
            if wanted <= 0:
                continue
            claim_began = time.perf_counter()
            try:
                claimed = self._claim_from(group, wanted)
            except (OperationalError, InterfaceError) as exc:
                self._database_trouble(exc)
                return ClaimRound(total, full, True)
            except DatabaseError:
                # Not a lost connection: log it loudly, back off, and keep the worker alive.
                logger.exception("Claiming from queues %s failed; retrying shortly.", group.queues)
                self.stopping.wait(1.0)
                return ClaimRound(total, full, True)
            if not claimed:
                continue
            full = full or len(claimed) >= wanted
            events.emit_claimed(
                self.backend.alias,
                self.config.worker_id,
                group.queues,
                len(claimed),
                wanted,
                time.perf_counter() - claim_began,
            )
            with self._leased_lock:
                for task in claimed:
                    self._leased[task.lease] = task
            with self._doers_lock:
                group.doer.admit(claimed)
            self._claimed_total += len(claimed)
            self._note_payload_size(claimed)
            free -= len(claimed)
            total += len(claimed)
        return ClaimRound(total, full, False)

    def _note_payload_size(self, claimed: list[ClaimedTask]) -> None:
        """Fold a claim's average stored-argument size into the size that bounds
        adaptive prefetch (``PREFETCH_PAYLOAD_BUDGET``)."""
        size = sum(task.stored_size for task in claimed) / len(claimed)
        self._payload_size = payload_average(self._payload_size, size)

    def _claim_from(self, group: QueueGroup, wanted: int) -> list[ClaimedTask]:
        """One claim statement, in one turn on the claim session."""
        with self.claim_session.turn():
            connection = worker_connection(self.database, self.config.visibility_timeout)
            return dialect_for(connection).claim(
                connection,
                backend_name=self.backend.alias,
                queues=group.queues,
                limit=wanted,
                worker_id=self.config.worker_id,
                lease_token=uuid.uuid4().hex,
                visibility_timeout=self.config.visibility_timeout,
                synchronous=self.backend.settings.synchronous_claims,
            )

    def _database_trouble(self, exc: Exception) -> None:
        # The claim session's turn replaces the session if it is really gone.
        logger.warning("Database unavailable while claiming (%s); retrying shortly.", exc)
        self.stopping.wait(1.0)

    def _dispatch(self) -> None:
        """Start waiting tasks on free threads, taking turns between doers."""
        starts: list[tuple[ClaimedTask, QueueGroup]] = []
        with self._doers_lock:
            running = sum(group.doer.running for group in self.groups)
            while running < self.config.concurrency:
                start = self._next_waiting()
                if start is None:
                    break
                starts.append(start)
                running += 1
        for task, group in starts:
            self._pool.submit(partial(self._run_on_slot, task, group))

    def _next_waiting(self) -> tuple[ClaimedTask, QueueGroup] | None:
        """The next task to start, asking each doer in turn (a different one first each
        time, so one busy queue group cannot starve the others); None when every doer
        holds its tasks back or has none. Under the doers' lock."""
        for _ in range(len(self.groups)):
            group = self.groups[self._group_cursor % len(self.groups)]
            self._group_cursor += 1
            task = group.doer.next()
            if task is not None:
                return task, group
        return None

    def _run_on_slot(self, task: ClaimedTask, group: QueueGroup) -> None:
        began = time.perf_counter()
        try:
            self.runner.run(task)
        finally:
            # The thread is free again (the lease ends when the outcome is written): it
            # starts the next waiting task itself, queued behind any follow-up jobs
            # (task_finished sends), instead of waking the claim loop to do it.
            self._start_next(task, group, time.perf_counter() - began)

    def _start_next(self, task: ClaimedTask, group: QueueGroup, seconds: float) -> None:
        """Task thread: tell the doer ``task`` is done and start the next waiting task;
        wake the claim loop only when none could start (a thread is free to claim for)."""
        with self._doers_lock:
            group.doer.finished(task)
            self._run_seconds = smoothed(self._run_seconds, seconds)
            start = None if self.stopping.is_set() else self._next_waiting()
        if start is None:
            self.wakeup.set()
            return
        # RuntimeError: shut down past its deadline since the check above; the task is
        # counted with the abandoned ones, and its lease expires as theirs do.
        with contextlib.suppress(RuntimeError):
            self._pool.submit(partial(self._run_on_slot, *start))

    def _on_written(self, task: ClaimedTask) -> None:
        """Reporter thread: the attempt's outcome is written (or refused); its lease is over."""
        lease = task.lease
        with self._leased_lock:
            self._leased.pop(lease, None)
            self._settling.discard(lease)
        self.wakeup.set()

    def _schedule(self, job: Callable[[], None]) -> None:
        """Run a follow-up (a ``task_finished`` send) on a worker thread."""
        try:
            self._pool.submit(job)
        except RuntimeError:  # the pool is shutting down: run it here instead
            job()

    # -- leases -------------------------------------------------------------------------

    def _mark_settling(self, task: ClaimedTask) -> None:
        with self._leased_lock:
            self._settling.add(task.lease)

    def _lease_snapshot(self) -> list[Lease]:
        with self._leased_lock:
            return [lease for lease in self._leased if lease not in self._settling]

    def _held_leases(self) -> frozenset[Lease]:
        """Every lease this worker holds, its settling ones too: its own reaper leaves them
        alone, expired or not (it renews them, or writes their outcomes)."""
        with self._leased_lock:
            return frozenset(self._leased)

    def _on_leases_lost(self, lost: set[Lease]) -> None:
        with self._leased_lock:
            lost = (lost & self._leased.keys()) - self._settling
            tasks = [self._leased[lease] for lease in lost]
        if not lost:
            return
        events.emit_lease_lost(self.config.worker_id, tasks)
        logger.warning(
            "Lost the lease of %d task(s) (taken over after expiry): %s; their outcomes "
            "will not be written by this worker.",
            len(lost),
            ", ".join(sorted(task_id for task_id, _ in lost)[:10]),
        )

    # -- shutdown -----------------------------------------------------------------------

    def _shutdown(self) -> int:
        """Release unstarted claims, let running tasks finish; return how many were abandoned."""
        self.stopping.set()
        self.reporter.stop_soon()  # shutdown's bound: no outcome kept through a stall
        with self._doers_lock:  # no task thread starts another from here on
            unstarted = [task for group in self.groups for task in group.doer.drain()]
        for task in unstarted:
            self._release(task)
            with self._leased_lock:
                self._leased.pop(task.lease, None)
        deadline = time.monotonic() + self.config.shutdown_timeout
        while True:
            if not self._leased or time.monotonic() >= deadline:
                break
            self.wakeup.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            self.wakeup.clear()
        abandoned = len(self._leased)
        if abandoned:
            logger.error(
                "Shutdown timeout: %d task(s) still running are abandoned; their leases will "
                "expire and another worker will retry them.",
                abandoned,
            )
        # Every service closes its own connections when it stops: wait for that, so a
        # caller (a test running the worker in-process) finds no session of ours left
        # open. The reporter writes what it holds first (bounded by the visibility
        # timeout); the others stop within about a second.
        self.services.stop(timeout=self.config.visibility_timeout + 2.0)
        try:
            with self.claim_session.turn():
                remove_worker(self.database, self.config.worker_id)
        except Exception as exc:
            logger.warning("Could not remove the worker row (%s).", exc)
        # Queued jobs are task_finished sends for outcomes already written: let them run.
        self._pool.shutdown(wait=not abandoned, cancel_pending=bool(abandoned))
        connections[self.database].close()
        return abandoned

    def _release(self, task: ClaimedTask) -> None:
        """Hand an unstarted claim back. A row another session holds locked is left to
        its lease's expiry rather than waited for: shutdown has a deadline."""
        outcome = outcome_for(self.backend, task, Released(), task=None, now=self.clock())
        try:
            with self.claim_session.turn():
                apply_outcome(self.database, task, outcome, skip_locked=True)
        except Exception as exc:
            logger.warning("Could not release task %s (%s); its lease will expire.", task.id, exc)
