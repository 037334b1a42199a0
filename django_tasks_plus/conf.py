"""Every backend setting, read once into one frozen object, with defaults and validation.

``TASKS[alias]`` is parsed when the backend is created (the first time a task module is
imported or ``task_backends[alias]`` is used), so a typo fails at startup with a message
that names the key instead of surfacing as odd behaviour in production.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

from .compat import DEFAULT_TASK_QUEUE_NAME
from .exceptions import InvalidBackendOptions, InvalidRetryPolicy
from .retry import RetryPolicy, exponential_backoff, no_retry, validate_policy
from .worker.doers import make_doer

QUEUE_NAME_MAX_LENGTH = 100

_DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "RETRY": "default",
    "VISIBILITY_TIMEOUT": 60.0,
    "POLL_INTERVAL": 1.0,
    "CONCURRENCY": 8,
    "PREFETCH": 0,
    "SHUTDOWN_TIMEOUT": 30.0,
    "DOER": "unlimited",
    "QUEUES_CONFIG": {},
    "NOTIFY": True,
}


@dataclass(frozen=True)
class BackendSettings:
    """The validated settings of one ``TASKS`` entry."""

    alias: str
    queues: frozenset[str]
    database: str = "default"
    retry: RetryPolicy = field(default_factory=exponential_backoff)
    visibility_timeout: float = 60.0
    poll_interval: float = 1.0
    concurrency: int = 8
    prefetch: int = 0
    shutdown_timeout: float = 30.0
    doer: Any = "unlimited"
    queues_config: Mapping[str, Any] = field(default_factory=dict)
    notify: bool = True

    def doer_spec_for(self, queue: str) -> Any:
        """The doer spec governing ``queue`` (its own entry, else the default)."""
        return self.queues_config.get(queue, self.doer)


def _fail(
    alias: str, key: str, problem: str, *, subkey: str | None = None
) -> InvalidBackendOptions:
    where = f"TASKS[{alias!r}]['OPTIONS'][{key!r}]" + (f"[{subkey!r}]" if subkey else "")
    return InvalidBackendOptions(f"{where} {problem}")


def _positive_number(alias: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _fail(alias, key, f"must be a positive number of seconds, got {value!r}.")
    return float(value)


def _positive_int(alias: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(alias, key, f"must be a whole number of at least 1, got {value!r}.")
    return value


def _non_negative_int(alias: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(alias, key, f"must be a whole number of at least 0, got {value!r}.")
    return value


def _retry_policy(alias: str, value: Any) -> RetryPolicy:
    if value == "default":
        return exponential_backoff()
    if value is None:
        return no_retry
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise _fail(
                alias, "RETRY", f"names {value!r}, which cannot be imported: {exc}"
            ) from exc
    try:
        return validate_policy(value, f"TASKS[{alias!r}]['OPTIONS']['RETRY']")
    except InvalidRetryPolicy as exc:
        raise InvalidBackendOptions(str(exc)) from exc


def _doer_spec(alias: str, key: str, spec: Any, *, subkey: str | None = None) -> Any:
    try:
        make_doer(spec)
    except (ValueError, TypeError) as exc:
        raise _fail(alias, key, f"is not a valid doer: {exc}", subkey=subkey) from exc
    return spec


def _queues(alias: str, params: Mapping[str, Any]) -> frozenset[str]:
    queues = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
    if isinstance(queues, str) or not isinstance(queues, list | tuple | set | frozenset):
        raise InvalidBackendOptions(
            f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names, got {queues!r}."
        )
    if not queues:
        raise InvalidBackendOptions(f"TASKS[{alias!r}]['QUEUES'] must name at least one queue.")
    for name in queues:
        if not isinstance(name, str) or not name or len(name) > QUEUE_NAME_MAX_LENGTH:
            raise InvalidBackendOptions(
                f"TASKS[{alias!r}]['QUEUES'] has {name!r}; queue names are non-empty strings "
                f"of at most {QUEUE_NAME_MAX_LENGTH} characters."
            )
        if name == "*":
            raise InvalidBackendOptions(
                f"TASKS[{alias!r}]['QUEUES'] cannot contain '*': it means 'every queue' "
                "on the runtasks command line."
            )
    return frozenset(queues)


def parse_settings(alias: str, params: Mapping[str, Any]) -> BackendSettings:
    """Validate ``TASKS[alias]`` and return its settings; raise on the first problem."""
    queues = _queues(alias, params)
    options = params.get("OPTIONS")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise InvalidBackendOptions(f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {options!r}.")
    for key in options:
        if key not in _DEFAULTS:
            close = difflib.get_close_matches(str(key), _DEFAULTS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise InvalidBackendOptions(
                f"TASKS[{alias!r}]['OPTIONS'] has an unknown key {key!r}.{hint} "
                f"Known keys: {', '.join(sorted(_DEFAULTS))}."
            )
    merged = {**_DEFAULTS, **options}

    database = merged["DATABASE"]
    if not isinstance(database, str) or not database:
        raise _fail(alias, "DATABASE", f"must be a database alias, got {database!r}.")

    notify = merged["NOTIFY"]
    if not isinstance(notify, bool):
        raise _fail(alias, "NOTIFY", f"must be True or False, got {notify!r}.")

    queues_config = merged["QUEUES_CONFIG"]
    if not isinstance(queues_config, Mapping):
        raise _fail(
            alias, "QUEUES_CONFIG", f"must be a dict of queue name -> doer, got {queues_config!r}."
        )
    for queue, spec in queues_config.items():
        if queue not in queues:
            raise _fail(
                alias,
                "QUEUES_CONFIG",
                f"configures queue {queue!r}, which is not in QUEUES {sorted(queues)}.",
            )
        _doer_spec(alias, "QUEUES_CONFIG", spec, subkey=queue)

    return BackendSettings(
        alias=alias,
        queues=queues,
        database=database,
        retry=_retry_policy(alias, merged["RETRY"]),
        visibility_timeout=_positive_number(
            alias, "VISIBILITY_TIMEOUT", merged["VISIBILITY_TIMEOUT"]
        ),
        poll_interval=_positive_number(alias, "POLL_INTERVAL", merged["POLL_INTERVAL"]),
        concurrency=_positive_int(alias, "CONCURRENCY", merged["CONCURRENCY"]),
        prefetch=_non_negative_int(alias, "PREFETCH", merged["PREFETCH"]),
        shutdown_timeout=_positive_number(alias, "SHUTDOWN_TIMEOUT", merged["SHUTDOWN_TIMEOUT"]),
        doer=_doer_spec(alias, "DOER", merged["DOER"]),
        queues_config=dict(queues_config),
        notify=notify,
    )
