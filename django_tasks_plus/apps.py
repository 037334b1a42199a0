from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from .events import EventBus
    from .metrics.aggregate import Aggregator
    from .metrics.catalog import FeatureCounters

T = TypeVar("T")


class TasksPlusConfig(AppConfig):
    """The app, and the owner of the registries the process fills while it runs.

    - ``event_bus``: the event names and their subscribers (``events.bus()``);
    - ``feature_counters``: the counters features registered (``metrics.register_counter``);
    - ``aggregator``: what this process counted and has not flushed yet
      (``metrics.flush()``; flushed once more when the process exits).

    Each is built on first use: another app's ``ready()`` may subscribe before this one's
    has run. ``reset()`` puts them back to the app's own state (tests; see
    ``django_tasks_plus.registries``).
    """

    name = "django_tasks_plus"
    verbose_name = _("Tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        self._owned_lock = threading.Lock()

    def _owned(self, attribute: str, build: Callable[[], T]) -> T:
        try:
            return self.__dict__[attribute]
        except KeyError:
            with self._owned_lock:
                if attribute not in self.__dict__:
                    self.__dict__[attribute] = build()
                return self.__dict__[attribute]

    @property
    def event_bus(self) -> EventBus:
        bus = self.__dict__.get("_event_bus")
        if bus is not None:  # read per enqueue and per task: no import, no closure
            return cast("EventBus", bus)
        from .events import NAMES, EventBus

        return self._owned("_event_bus", lambda: EventBus(NAMES))

    @property
    def feature_counters(self) -> FeatureCounters:
        from .metrics.catalog import FeatureCounters

        return self._owned("_feature_counters", FeatureCounters)

    @property
    def aggregator(self) -> Aggregator:
        from .metrics.aggregate import Aggregator

        return self._owned("_aggregator", Aggregator)

    def reset(self) -> None:
        """Back to the app's own state (tests): every subscriber, feature event name,
        feature counter and extension entry the app did not register itself goes, what
        was counted is dropped unwritten, and the aggregator subscribes again."""
        from . import extensions
        from .metrics import install

        self.event_bus.reset()
        self.feature_counters.reset()
        extensions.reset()
        self.aggregator.reset()
        install()

    def ready(self) -> None:
        # Importing compat loads the framework's signals and system checks, also on the
        # Django 5.2 backport when 'django_tasks' itself is not in INSTALLED_APPS.
        from . import (
            compat,  # noqa: F401
            extensions,
        )
        from .checks import register_checks
        from .circuits import breaker_middleware_for
        from .metrics import install
        from .metrics.breakers import install_counters as install_breaker_counters
        from .schedules.feature import install as install_schedules
        from .worker.metrics_flusher import metrics_service_factory
        from .worker.pruner import pruner_factory

        # The app is the composition root: its own features plug into the engine here,
        # as built-in entries of the registries (extensions.reset() keeps them).
        extensions.task_middleware.register(breaker_middleware_for, builtin=True)
        extensions.service_factories.register(metrics_service_factory, builtin=True)
        extensions.service_factories.register(pruner_factory, builtin=True)
        register_checks()
        install_schedules()  # before install(): its counters are counted too
        install_breaker_counters()
        # Count the lifecycle events when a backend keeps metrics (docs/metrics.md).
        install()
        _flush_at_exit_once()  # what is left is written when the process exits


_exit_flush_registered = False


def _flush_at_exit_once() -> None:
    """One exit-time flush per process, of the app installed at exit. An app config
    replaced meanwhile (a test that installs the app anew) is not flushed: its counts
    belong to a configuration that is gone, and its database may be gone with it."""
    global _exit_flush_registered
    if not _exit_flush_registered:
        atexit.register(_flush_installed_app)
        _exit_flush_registered = True


def _flush_installed_app() -> None:
    from .registries import installed_app

    config = installed_app()
    if config is not None:
        config.aggregator.flush_at_exit()
