"""Pluggable worker services and task modules found without wiring (``worker/plugins.py``,
``discovery.py``): services from ``OPTIONS["SERVICES"]``, from a task definition's
``services=`` and from the features (the metrics flusher), each started by a real
worker; and each installed app's ``tasks`` module imported by the worker, ``manage.py
check`` and the operator commands, unless ``OPTIONS["AUTODISCOVER"]`` is off.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_tasks_plus import task
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.exceptions import InvalidBackendOptions, InvalidTaskOptions
from django_tasks_plus.worker.config import WorkerConfig
from django_tasks_plus.worker.engine import Worker
from django_tasks_plus.worker.services import ServiceStartError
from testproject import settings as project_settings
from tests.plugin_services import STARTED, not_a_service, task_service

pytestmark = pytest.mark.django_db(transaction=True)

APP_TASKS = "example.tasks"


def needs_a_service() -> None:
    """The function of a task whose definition asks for ``task_service``."""


def _tasks(**options: Any) -> dict[str, Any]:
    default = dict(project_settings.TASKS["default"])
    default["OPTIONS"] = {**default.get("OPTIONS", {}), **options}
    return {**project_settings.TASKS, "default": default}


def _run(**flags: Any) -> Worker:
    worker = Worker(WorkerConfig.from_settings("default", burst=True, concurrency=1, **flags))
    assert worker.run() == 0
    return worker


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """No service recorded, and the services task definitions asked for put back as they
    were: a definition made here would otherwise add its service to every later
    worker of the test session (``test_services`` lists a worker's services)."""
    from django_tasks_plus.compat import task_backends

    backend = task_backends["default"]
    saved = dict(backend.task_services)
    STARTED.clear()
    yield
    STARTED.clear()
    backend.task_services.clear()
    backend.task_services.update(saved)


@pytest.fixture
def app_tasks_unimported() -> Iterator[None]:
    """The example app's ``tasks`` module as if nothing had imported it yet."""
    saved = sys.modules.pop(APP_TASKS, None)
    package = sys.modules.get("example")
    attribute = getattr(package, "tasks", None)
    if package is not None and attribute is not None:
        delattr(package, "tasks")
    yield
    if saved is not None:
        sys.modules[APP_TASKS] = saved
        if package is not None:
            package.tasks = saved  # type: ignore[attr-defined]


# -- services ----------------------------------------------------------------------------


def test_a_service_named_in_the_settings_runs_on_the_worker():
    with override_settings(TASKS=_tasks(SERVICES=["tests.plugin_services.settings_service"])):
        worker = _run(worker_id="w-settings")
        names = [service.name for service in worker.services.services]
    assert "tasks-test-from-settings" in names
    assert STARTED == [("tasks-test-from-settings", "w-settings")]
    assert worker.services.running == []  # stopped with the worker


def test_a_service_a_task_definition_asks_for_runs_on_every_worker_of_its_backend():
    task(services=[task_service])(needs_a_service)  # the definition, as at import time
    _run(worker_id="w-task")
    assert STARTED == [("tasks-test-from-task", "w-task")]


def test_the_features_services_come_from_the_same_factories():
    """The metrics flusher and the pruner are plugged in, not listed by the engine; with
    metrics off the metrics factory builds nothing."""
    worker = Worker(WorkerConfig.from_settings("default", burst=True))
    names = [service.name for service in worker.services.services]
    assert {"tasks-metrics-flusher", "tasks-pruner"} <= set(names)
    with override_settings(TASKS=_tasks(METRICS={"ENABLED": False})):
        worker = Worker(WorkerConfig.from_settings("default", burst=True))
    names = [service.name for service in worker.services.services]
    assert "tasks-metrics-flusher" not in names and "tasks-pruner" in names


def test_bad_service_factories_are_refused_with_a_typed_error():
    with pytest.raises(InvalidBackendOptions, match=r"\['SERVICES'\]\[0\] names 'tests.nowhere'"):
        parse_settings("default", {"OPTIONS": {"SERVICES": ["tests.nowhere"]}})
    with pytest.raises(InvalidBackendOptions, match=r"\['SERVICES'\] must be a list"):
        parse_settings("default", {"OPTIONS": {"SERVICES": "tests.plugin_services.task_service"}})
    with pytest.raises(InvalidTaskOptions, match=r"services\[0\] is 42, not a callable"):
        task(services=[42])(needs_a_service)
    with (
        override_settings(TASKS=_tasks(SERVICES=[not_a_service])),
        pytest.raises(ServiceStartError, match="returned 'a string', which is not a worker"),
    ):
        Worker(WorkerConfig.from_settings("default"))


# -- task modules found without wiring ---------------------------------------------------


def test_the_worker_imports_each_installed_apps_tasks_module(app_tasks_unimported):
    Worker(WorkerConfig.from_settings("default", burst=True))
    assert APP_TASKS in sys.modules


def test_autodiscovery_can_be_turned_off(app_tasks_unimported):
    with override_settings(TASKS=_tasks(AUTODISCOVER=False)):
        Worker(WorkerConfig.from_settings("default", burst=True))
        assert APP_TASKS not in sys.modules
        call_command("check")
        assert APP_TASKS not in sys.modules
    with pytest.raises(InvalidBackendOptions, match="AUTODISCOVER'] must be True or False"):
        parse_settings("default", {"OPTIONS": {"AUTODISCOVER": "yes"}})


def test_manage_py_check_imports_the_task_modules(app_tasks_unimported):
    call_command("check")
    assert APP_TASKS in sys.modules


def test_an_operator_command_imports_the_task_modules(app_tasks_unimported, capsys):
    call_command("breakers")
    assert APP_TASKS in sys.modules
