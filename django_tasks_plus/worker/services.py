"""Worker services: the background duties a worker process runs beside its claim loop.

A service has a name, ``start()``, ``stop()`` (asks it to stop and returns at once) and
``join(timeout)``. The engine builds its list of services (``Worker.build_services()``),
starts them in order before the first claim and stops them in reverse order at shutdown.
A *singleton* service runs on one worker per backend only, the elected leader
(``leadership.py``): it starts when this worker becomes leader and stops when it stops
leading, so it must be restartable (``ThreadService`` is).

Adding a duty (a scheduler, a pruner, a metrics flusher) is one ``LoopService`` subclass
and one entry in the list.

Services do not open database sessions of their own: every ``ThreadService`` of a
worker takes turns on the worker's one periodic bookkeeping session
(``sessions.SharedSession``, handed out by ``Services``). A ``LoopService`` runs each
``tick()`` inside a turn; other code takes one with ``with self.turn():``. Inside a turn
``connections[database]`` is the shared session: keep the work short (it delays the
other services, the heartbeat among them), end every transaction inside the turn, and
on a database error raise or log, but do not close the connection (the turn replaces a
session that is really broken; closing a live one would drop the leader's lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..db.unpooled import outside_the_pool
from .sessions import SharedSession

logger = logging.getLogger("django_tasks_plus.worker")


@runtime_checkable
class Service(Protocol):
    """What the engine needs of a background duty."""

    name: str
    singleton: bool
    """True: runs on the elected leader only (started and stopped as leadership moves)."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Ask the service to stop; returns at once (``join`` waits)."""

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


class ServiceStartError(RuntimeError):
    """A worker service, or the worker's own registration, could not be started; the
    worker does not run without it."""


class ThreadService:
    """A service running ``serve()`` on a daemon thread of its own; restartable.

    ``serve()`` returns once ``self.stopping`` is set. Its database work runs in turns
    (``turn()``) on ``session``: the worker's shared periodic session, or, for a service
    run on its own, a session of its own closed when the thread ends. Outside turns the
    thread's connection is its own, outside any pool (``db/unpooled.py``), closed when
    the thread ends too, so a stopped service leaves no session open.
    """

    name = "tasks-service"
    singleton = False

    def __init__(self, database: str) -> None:
        self.database = database
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.session: SharedSession | None = None
        """Set by ``Services`` to the worker's periodic session before the start."""
        self._own_session: SharedSession | None = None

    def turn(self) -> AbstractContextManager[BaseDatabaseWrapper]:
        """Hold this service's session: ``connections[database]`` is it inside the block."""
        if self.session is None:
            self.session = self._own_session = SharedSession(self.database, self.name)
        return self.session.turn()

    def start(self) -> None:
        if self.is_alive():
            raise RuntimeError(f"{self.name} is already running")
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _main(self) -> None:
        with outside_the_pool(self.database):
            try:
                self.serve()
            finally:
                connections[self.database].close()
                own, self._own_session = self._own_session, None
                if own is not None:
                    own.close()
                    self.session = None

    def serve(self) -> None:
        raise NotImplementedError


class LoopService(ThreadService):
    """A service that calls ``tick()`` every ``interval`` seconds until stopped.

    A tick that raises is logged and the next one comes as usual: a background duty
    never dies of one bad round.
    """

    interval: float = 1.0
    first_round_at_start: bool = False
    """True: the first round runs as soon as the service starts, not one interval later."""
    tick_in_one_turn: bool = True
    """True: each ``tick()`` runs in one turn on the session. False: the tick takes its
    own turns (``with self.turn():``), e.g. one per batch of a long clean-up, so the
    other services (the heartbeat among them) get the session in between."""

    def serve(self) -> None:
        if self.first_round_at_start:
            self._round()
        while not self.stopping.wait(self.interval):
            self._round()

    def _round(self) -> None:
        try:
            if self.tick_in_one_turn:
                with self.turn():
                    self.tick()
            else:
                self.tick()
        except BaseException:
            logger.exception("%s: a round failed unexpectedly; will retry", self.name)

    def tick(self) -> None:
        raise NotImplementedError


class Services:
    """The worker's services: starts them in order, stops them in reverse order.

    Per-worker services start with ``start()``; singletons start on ``lead()`` and stop
    on ``follow()``, called by the leadership service as leadership moves. Every
    ``ThreadService`` without a session of its own takes turns on ``session``.
    """

    def __init__(self, services: Iterable[Service], session: SharedSession | None = None) -> None:
        self.services = list(services)
        if session is not None:
            for service in self.services:
                if isinstance(service, ThreadService) and service.session is None:
                    service.session = session
        self._running: list[Service] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def running(self) -> list[str]:
        """Names of the services running now, in start order."""
        with self._lock:
            return [service.name for service in self._running]

    def start(self) -> None:
        """Start every per-worker service in order; raise ``ServiceStartError`` on the
        first that fails (those already started keep running: ``stop()`` ends them)."""
        for service in self.services:
            if not service.singleton:
                self._start(service)

    def lead(self) -> None:
        """This worker became leader: start the singleton services."""
        for service in self.services:
            if service.singleton:
                try:
                    self._start(service)
                except ServiceStartError as exc:  # the others still run; this one retries
                    logger.error("%s", exc)  # on the next election

    def follow(self) -> None:
        """This worker no longer leads: stop the singleton services and wait for them."""
        with self._lock:
            singletons = [service for service in self._running if service.singleton]
        self._stop(singletons, timeout=10.0)

    def stop(self, timeout: float) -> list[str]:
        """Stop every running service (reverse start order) and wait up to ``timeout``
        seconds in all; return the names of any still running then."""
        with self._lock:
            self._closed = True
            services = list(reversed(self._running))
        return self._stop(services, timeout)

    def _start(self, service: Service) -> None:
        with self._lock:
            if self._closed or service in self._running:
                return
            try:
                service.start()
            except Exception as exc:
                raise ServiceStartError(
                    f"Worker service {service.name!r} failed to start: {type(exc).__name__}: {exc}"
                ) from exc
            self._running.append(service)
        logger.debug("Started %s.", service.name)

    def _stop(self, services: list[Service], timeout: float) -> list[str]:
        for service in services:
            service.stop()
        deadline = time.monotonic() + timeout
        stuck = []
        for service in services:
            service.join(max(0.0, deadline - time.monotonic()))
            if service.is_alive():
                stuck.append(service.name)
        with self._lock:
            self._running = [s for s in self._running if s not in services]
        if stuck:
            logger.warning("Worker service(s) still running after stop: %s", ", ".join(stuck))
        return stuck
