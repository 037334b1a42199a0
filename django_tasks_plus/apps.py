from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class TasksPlusConfig(AppConfig):
    name = "django_tasks_plus"
    verbose_name = _("Tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing compat loads the framework's signals and system checks, also on the
        # Django 5.2 backport when 'django_tasks' itself is not in INSTALLED_APPS.
        from . import compat  # noqa: F401
        from .metrics import install

        # Count the lifecycle events when a backend keeps metrics (docs/metrics.md).
        install()
