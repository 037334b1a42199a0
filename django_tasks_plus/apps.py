from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TasksPlusConfig(AppConfig):
    name = "django_tasks_plus"
    verbose_name = _("Tasks")
    default_auto_field = "django.db.models.BigAutoField"

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
        # Count the lifecycle events when a backend keeps metrics (docs/metrics.md).
        install()
