"""Where the app's runtime registries live: on the installed app's ``AppConfig``.

What the process fills while it runs (the events' names and subscribers, the features'
counters, the metrics aggregator's counts) belongs to one object, the app's
``TasksPlusConfig`` (``apps.py``), not to modules: it lives as long as the app is
installed, a test that installs the app anew (``override_settings(INSTALLED_APPS=...)``)
gets a fresh one, and ``reset()`` puts it back to the app's own state. The modules that
use a registry reach it through here (``events.bus()``, ``metrics.aggregator()``,
``metrics.catalog.feature_counters()``).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

LABEL = "django_tasks_plus"


def installed_app() -> Any | None:
    """The app's config (the owner of the registries), or None when the app is not in
    ``INSTALLED_APPS`` (then nothing is subscribed and nothing is counted)."""
    if apps.ready:  # read per event: a dict lookup, not get_app_config's checks and errors
        return apps.app_configs.get(LABEL)
    try:
        return apps.get_app_config(LABEL)
    except LookupError:
        return None


def app() -> Any:
    """The app's config; a clear error when the app is not installed."""
    config = installed_app()
    if config is None:
        raise ImproperlyConfigured(
            f"django-tasks-plus keeps its registries on its app: add {LABEL!r} to INSTALLED_APPS."
        )
    return config


def reset() -> None:
    """Every registry back to the app's own state (tests): no subscriber but the app's,
    no event name or counter but the app's own features', no extension entry but the
    app's, nothing counted; the metrics aggregator subscribes again."""
    app().reset()
