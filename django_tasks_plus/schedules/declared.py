"""Schedules as declared: in code (``@task(schedule=…)`` / ``schedules=[…]``), in settings
(``OPTIONS["SCHEDULES"]``) or at runtime (the API), each read into one ``Definition``.

A ``Definition`` is what the schedule table stores; the scheduler compares the declared
ones with the stored rows to sync them. Every problem is an ``InvalidSchedule`` naming
the schedule (``manage.py check`` lists them; the API raises them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings

from ..compat import DEFAULT_TASK_PRIORITY, Task
from ..conf import BackendSettings
from ..definition import resolve_task, scheduled_tasks
from ..exceptions import TaskNotRegistered
from ..limits import SCHEDULE_NAME_MAX_LENGTH as NAME_MAX_LENGTH
from .errors import InvalidSchedule
from .timing import (
    CATCH_UP_POLICIES,
    DEFAULT_CATCH_UP,
    DEFAULT_CATCH_UP_CAP,
    OVERLAP_POLICIES,
    Cron,
    Every,
    Spec,
    as_spec,
    zone,
)

CODE, SETTINGS, RUNTIME = "code", "settings", "runtime"
SOURCES = (CODE, SETTINGS, RUNTIME)


@dataclass(frozen=True)
class Scheduled:
    """One schedule of a task with its own options, for ``@task(schedules=[…])``:
    ``Scheduled("0 3 * * *", kwargs={"full": True}, timezone="Europe/Berlin")``."""

    when: str | Every | Cron
    name: str | None = None
    args: tuple[Any, ...] | list[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    timezone: str | None = None
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_cap: int = DEFAULT_CATCH_UP_CAP
    overlap: str = "allow"
    enabled: bool = True


@dataclass(frozen=True)
class Definition:
    """A schedule's definition, validated: what the table's row holds."""

    name: str
    backend: str
    task_path: str
    spec: Spec
    timezone: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int = DEFAULT_TASK_PRIORITY
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_cap: int = DEFAULT_CATCH_UP_CAP
    overlap: str = "allow"
    enabled: bool = True
    source: str = RUNTIME

    @property
    def cron(self) -> str:
        return self.spec.expression if isinstance(self.spec, Cron) else ""

    @property
    def every_seconds(self) -> int | None:
        return self.spec.total_seconds if isinstance(self.spec, Every) else None


def default_timezone() -> str:
    return str(getattr(django_settings, "TIME_ZONE", None) or "UTC")


def validated(definition: Definition, *, resolve: bool = True) -> Definition:
    """``definition`` if every field is usable, else ``InvalidSchedule`` naming it."""
    name = definition.name
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX_LENGTH:
        raise InvalidSchedule(
            f"A schedule name is a non-empty string of at most {NAME_MAX_LENGTH} characters, "
            f"got {name!r}."
        )
    as_spec(definition.spec, name)
    zone(definition.timezone, name)
    if definition.catch_up not in CATCH_UP_POLICIES:
        raise InvalidSchedule(
            f"Schedule {name!r}: catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, "
            f"got {definition.catch_up!r}."
        )
    cap = definition.catch_up_cap
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise InvalidSchedule(f"Schedule {name!r}: catch_up_cap must be a positive integer.")
    if definition.overlap not in OVERLAP_POLICIES:
        raise InvalidSchedule(
            f"Schedule {name!r}: overlap must be one of {', '.join(OVERLAP_POLICIES)}, "
            f"got {definition.overlap!r}."
        )
    if not isinstance(definition.args, tuple | list) or not isinstance(definition.kwargs, Mapping):
        raise InvalidSchedule(f"Schedule {name!r}: args must be a list, kwargs a dict.")
    priority = definition.priority
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidSchedule(f"Schedule {name!r}: priority must be an integer.")
    if resolve:
        task_for(definition)
    return definition


def task_for(definition: Definition) -> Task:
    """The task a schedule enqueues, with its queue and priority; ``InvalidSchedule``
    when the path names no task."""
    try:
        task = resolve_task(definition.task_path)
    except TaskNotRegistered as exc:
        raise InvalidSchedule(f"Schedule {definition.name!r}: unknown task: {exc}") from exc
    # The schedule's backend: its enqueue shares the scheduler's transaction.
    options: dict[str, Any] = {"priority": definition.priority, "backend": definition.backend}
    if definition.queue:
        options["queue_name"] = definition.queue
    return task.using(**options)


def from_code(task: Any, backend: str) -> list[Definition]:
    """The schedules a task definition declares (``schedule=`` and ``schedules=[…]``)."""
    entries = ([task.schedule] if task.schedule is not None else []) + list(task.schedules)
    several = len(entries) > 1
    found = []
    for index, entry in enumerate(entries):
        options = entry if isinstance(entry, Scheduled) else Scheduled(entry)
        name = options.name or (
            f"{task.module_path}[{index}]" if several else str(task.module_path)
        )
        found.append(
            validated(
                Definition(
                    name=name,
                    backend=backend,
                    task_path=task.module_path,
                    spec=as_spec(options.when, name),
                    timezone=options.timezone or default_timezone(),
                    args=tuple(options.args),
                    kwargs=dict(options.kwargs),
                    queue=options.queue,
                    priority=task.priority if options.priority is None else options.priority,
                    catch_up=options.catch_up,
                    catch_up_cap=options.catch_up_cap,
                    overlap=options.overlap,
                    enabled=options.enabled,
                    source=CODE,
                ),
                resolve=False,
            )
        )
    return found


SETTINGS_KEYS = frozenset(
    {
        "task",
        "cron",
        "every",
        "args",
        "kwargs",
        "timezone",
        "queue",
        "priority",
        "catch_up",
        "catch_up_cap",
        "overlap",
        "enabled",
    }
)


def from_settings(name: str, entry: Mapping[str, Any], backend: str) -> Definition:
    """One ``OPTIONS["SCHEDULES"]`` entry: ``{task, cron | every (seconds), …}``."""
    unknown = set(entry) - SETTINGS_KEYS
    if unknown:
        raise InvalidSchedule(
            f"Schedule {name!r}: unknown keys {sorted(unknown)} (known: {sorted(SETTINGS_KEYS)})."
        )
    if ("cron" in entry) == ("every" in entry):
        raise InvalidSchedule(f"Schedule {name!r}: give either 'cron' or 'every' (seconds).")
    if "every" in entry:
        every = entry["every"]
        spec: Any = every if isinstance(every, Every) else Every(seconds=every)
    else:
        spec = entry["cron"]
    task_path = entry.get("task")
    if not isinstance(task_path, str):
        raise InvalidSchedule(f"Schedule {name!r}: 'task' must be the task's dotted path.")
    definition = Definition(
        name=name,
        backend=backend,
        task_path=task_path,
        spec=as_spec(spec, name),
        timezone=entry.get("timezone") or default_timezone(),
        args=tuple(entry.get("args", ())),
        kwargs=dict(entry.get("kwargs", {})),
        queue=entry.get("queue"),
        priority=entry.get("priority", DEFAULT_TASK_PRIORITY),
        catch_up=entry.get("catch_up", DEFAULT_CATCH_UP),
        catch_up_cap=entry.get("catch_up_cap", DEFAULT_CATCH_UP_CAP),
        overlap=entry.get("overlap", "allow"),
        enabled=bool(entry.get("enabled", True)),
        source=SETTINGS,
    )
    return validated(definition)


def declared(settings: BackendSettings) -> list[Definition]:
    """Every schedule of a backend declared in code and settings, validated, names unique.
    The task modules must be imported first (``discovery``)."""
    found: dict[str, Definition] = {}
    candidates: list[Definition] = []
    for task in scheduled_tasks(settings.alias):
        candidates += from_code(task, settings.alias)
    for name, entry in settings.schedules.items():
        candidates.append(from_settings(name, entry, settings.alias))
    for definition in candidates:
        first = found.get(definition.name)
        if first is not None:
            raise InvalidSchedule(
                f"Schedule {definition.name!r} is declared twice (in {first.source} and "
                f"{definition.source}); give one of them another name."
            )
        found[definition.name] = definition
    return list(found.values())


def problems(settings: BackendSettings) -> list[InvalidSchedule]:
    """Every declared schedule's problem (not only the first), for ``manage.py check``."""
    errors: list[InvalidSchedule] = []
    names: dict[str, str] = {}
    for task in scheduled_tasks(settings.alias):
        try:
            for definition in from_code(task, settings.alias):
                names.setdefault(definition.name, CODE)
        except InvalidSchedule as exc:
            errors.append(exc)
    for name, entry in settings.schedules.items():
        try:
            from_settings(name, entry, settings.alias)
        except InvalidSchedule as exc:
            errors.append(exc)
            continue
        if name in names:
            errors.append(InvalidSchedule(f"Schedule {name!r} is declared in code and settings."))
    return errors
