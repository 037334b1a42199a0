from importlib import import_module

from django.apps import AppConfig
from django.conf import settings


class ExampleConfig(AppConfig):
    name = "example"
    verbose_name = "Example tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Tasks outside installed apps run only if their module is imported at startup
        # (docs/tasks.md#where-tasks-live); the settings name the test project's.
        for module in getattr(settings, "EXTRA_TASK_MODULES", ()):
            import_module(module)
