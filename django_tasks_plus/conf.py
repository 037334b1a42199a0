"""Every backend setting, read once into one frozen object, with defaults and validation.

``TASKS[alias]`` is parsed when the backend is created (the first time a task module is
imported or ``task_backends[alias]`` is used), so a typo fails at startup with a message
that names the key instead of surfacing as odd behaviour in production.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.utils.module_loading import import_string

from .compat import DEFAULT_TASK_QUEUE_NAME
from .doers import make_doer
from .exceptions import InvalidBackendOptions, InvalidRetryPolicy, TimeOutOfRange
from .extensions import load_service_factories
from .limits import QUEUE_NAME_MAX_LENGTH
from .middleware import Middleware, load_middleware
from .retry import RetryPolicy, exponential_backoff, no_retry, validate_policy
from .timebounds import as_delay

# Every OPTIONS key with its default, written only here: BackendSettings' field defaults
# and the unknown-key check read this table. "RETRY": "default" means exponential_backoff().
_DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    "RETRY": "default",
    "VISIBILITY_TIMEOUT": 60.0,
    "POLL_INTERVAL": 1.0,
    "CONCURRENCY": 8,
    "PREFETCH": None,
    "SHUTDOWN_TIMEOUT": 30.0,
    "DOER": "unlimited",
    "QUEUES_CONFIG": {},
    "NOTIFY": True,
    # PostgreSQL: a claim's commit waits for the WAL flush only if True; False saves the
    # flush (0.3-0.4 ms of a claim) and a server crash may undo a claim of its last
    # moments, so that task runs again (docs/settings.md#synchronous_claims).
    "SYNCHRONOUS_CLAIMS": False,
    "DEDUP_TTL": timedelta(hours=1),
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Django's rule by default: a queue not in QUEUES is an InvalidTask.
    "QUEUE_RESOLUTION": "strict",
    # Execution middleware factories (or dotted paths), outermost first: docs/middleware.md.
    "MIDDLEWARE": (),
    # Enqueue middleware factories (or dotted paths), outermost first: docs/middleware.md.
    "ENQUEUE_MIDDLEWARE": (),
    # Counters and histograms per queue and task path (docs/metrics.md); {} = the defaults
    # below, and a dict given sets only the keys it names.
    "METRICS": {},
    # Worker services added by the project: factories (or dotted paths) called with the
    # worker's ServiceContext (docs/worker.md#adding-a-service).
    "SERVICES": (),
    # Import every installed app's ``tasks`` module when a worker, ``manage.py check`` or
    # an operator command starts, so every task (and its breaker, services) is known.
    "AUTODISCOVER": True,
    "SCHEDULES": {},
    # How long finished tasks and other spent rows are kept before the leader's pruner
    # deletes them (docs/settings.md#retention); {} = the defaults below, and a dict given
    # sets only the keys it names.
    "RETENTION": {},
}

# Every OPTIONS["RETENTION"] key with its default, written only here (as _DEFAULTS above).
# A duration (timedelta or seconds), or None: keep for ever.
_RETENTION_DEFAULTS: dict[str, Any] = {
    # Finished tasks, by status, counted from ``finished_at``.
    "SUCCESSFUL": timedelta(days=7),
    "FAILED": timedelta(days=30),
    # Circuit breaker rows that are closed, remember no failure, hold no task and have
    # not changed for this long (a new failure writes the row again).
    "BREAKERS": timedelta(days=7),
    # Occurrences a schedule acted on; each schedule's latest one always stays.
    "SCHEDULE_OCCURRENCES": timedelta(days=30),
    # Seconds between two rounds of the pruner, and rows deleted per transaction.
    "INTERVAL": 60.0,
    "BATCH_SIZE": 1000,
}
# Statuses whose tasks are never pruned: they have not finished.
UNFINISHED_STATUSES = ("READY", "RUNNING")

# Every OPTIONS["METRICS"] key with its default, written only here (as _DEFAULTS above).
_METRICS_DEFAULTS: dict[str, Any] = {
    "ENABLED": True,
    # Seconds between two writes of a worker's counts (one upsert statement each).
    "FLUSH_INTERVAL": 10.0,
    # Per-minute rows older than this are summed into hourly rows by the leader (and the
    # minutes deleted); the all-time totals stay. Flush keys are kept as long.
    "RETENTION_DAYS": 1,
    # Hourly rows older than this are deleted by the leader (at least RETENTION_DAYS; left
    # out, it is never below RETENTION_DAYS).
    "HOURLY_RETENTION_DAYS": 90,
    # The bearer token that may read the Prometheus endpoint; None: staff sessions only.
    "TOKEN": None,
}

QUEUE_RESOLUTIONS = ("fallback", "strict")
# Keys of a QUEUES_CONFIG entry that describe the queue itself; the rest choose its doer.
QUEUE_KEYS = ("max_depth",)


@dataclass(frozen=True)
class MetricsSettings:
    """The validated ``OPTIONS["METRICS"]`` of one backend (docs/metrics.md)."""

    enabled: bool = _METRICS_DEFAULTS["ENABLED"]
    flush_interval: float = _METRICS_DEFAULTS["FLUSH_INTERVAL"]
    retention: timedelta = timedelta(days=_METRICS_DEFAULTS["RETENTION_DAYS"])
    hourly_retention: timedelta = timedelta(days=_METRICS_DEFAULTS["HOURLY_RETENTION_DAYS"])
    token: str | None = field(default=_METRICS_DEFAULTS["TOKEN"], repr=False)


@dataclass(frozen=True)
class RetentionSettings:
    """The validated ``OPTIONS["RETENTION"]`` of one backend (docs/settings.md#retention);
    a retention of None keeps those rows for ever."""

    successful: timedelta | None = _RETENTION_DEFAULTS["SUCCESSFUL"]
    failed: timedelta | None = _RETENTION_DEFAULTS["FAILED"]
    breakers: timedelta | None = _RETENTION_DEFAULTS["BREAKERS"]
    schedule_occurrences: timedelta | None = _RETENTION_DEFAULTS["SCHEDULE_OCCURRENCES"]
    interval: float = _RETENTION_DEFAULTS["INTERVAL"]
    batch_size: int = _RETENTION_DEFAULTS["BATCH_SIZE"]

    def by_status(self) -> dict[str, timedelta]:
        """The finished statuses that are pruned, with their retention."""
        kept = {"SUCCESSFUL": self.successful, "FAILED": self.failed}
        return {status: age for status, age in kept.items() if age is not None}


@dataclass(frozen=True)
class BackendSettings:
    """The validated settings of one ``TASKS`` entry.

    ``queues`` is empty when ``QUEUES`` is ``[]``: as in Django, tasks may then name any
    queue (use ``serves()`` rather than testing membership).
    """

    alias: str
    queues: frozenset[str]
    queue_order: tuple[str, ...] = ()
    database: str = _DEFAULTS["DATABASE"]
    retry: RetryPolicy = field(default_factory=exponential_backoff)  # RETRY="default"
    visibility_timeout: float = _DEFAULTS["VISIBILITY_TIMEOUT"]
    poll_interval: float = _DEFAULTS["POLL_INTERVAL"]
    concurrency: int = _DEFAULTS["CONCURRENCY"]
    prefetch: int | None = _DEFAULTS["PREFETCH"]  # None: as many as CONCURRENCY
    shutdown_timeout: float = _DEFAULTS["SHUTDOWN_TIMEOUT"]
    doer: Any = _DEFAULTS["DOER"]
    queue_doers: Mapping[str, Any] = field(default_factory=dict)  # from QUEUES_CONFIG
    max_depths: Mapping[str, int] = field(default_factory=dict)  # from QUEUES_CONFIG
    notify: bool = _DEFAULTS["NOTIFY"]
    synchronous_claims: bool = _DEFAULTS["SYNCHRONOUS_CLAIMS"]
    dedup_ttl: timedelta = _DEFAULTS["DEDUP_TTL"]
    max_payload_bytes: int | None = _DEFAULTS["MAX_PAYLOAD_BYTES"]
    queue_resolution: str = _DEFAULTS["QUEUE_RESOLUTION"]
    middleware: tuple[Middleware, ...] = _DEFAULTS["MIDDLEWARE"]  # resolved factories
    enqueue_middleware: tuple[Any, ...] = _DEFAULTS["ENQUEUE_MIDDLEWARE"]  # resolved
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    services: tuple[Any, ...] = _DEFAULTS["SERVICES"]  # resolved factories
    autodiscover: bool = _DEFAULTS["AUTODISCOVER"]
    schedules: Mapping[str, Any] = field(default_factory=dict)
    """``OPTIONS["SCHEDULES"]`` as written; the schedules feature validates the entries."""
    retention: RetentionSettings = field(default_factory=RetentionSettings)

    def serves(self, queue: str) -> bool:
        """Whether tasks may name ``queue``: it is listed, or ``QUEUES`` is empty (any)."""
        return not self.queues or queue in self.queues

    def doer_spec_for(self, queue: str) -> Any:
        """The doer spec governing ``queue`` (its own entry, else the default)."""
        return self.queue_doers.get(queue, self.doer)

    def has_own_doer(self, queue: str) -> bool:
        return queue in self.queue_doers

    @property
    def fallback_queue(self) -> str:
        """Where tasks naming an unserved queue go under QUEUE_RESOLUTION='fallback'."""
        if DEFAULT_TASK_QUEUE_NAME in self.queues or not self.queue_order:
            return DEFAULT_TASK_QUEUE_NAME
        return self.queue_order[0]


def _fail(
    alias: str, key: str, problem: str, *, subkey: str | None = None
) -> InvalidBackendOptions:
    where = f"TASKS[{alias!r}]['OPTIONS'][{key!r}]" + (f"[{subkey!r}]" if subkey else "")
    return InvalidBackendOptions(f"{where} {problem}")


def unknown_key_problem(keys: Iterable[Any], known: Iterable[str]) -> str | None:
    """What to say of the first of ``keys`` not in ``known`` (with the closest known key,
    and all of them), or None when every key is known."""
    names = list(known)
    for key in keys:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            return f"has an unknown key {key!r}.{hint} Known keys: {', '.join(sorted(names))}."
    return None


def positive_seconds_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable number of seconds, or None. Shared with ``runtasks``
    (and ``WorkerConfig.from_settings``), which check their flags with it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value < float("inf")  # also refuses NaN
    ):
        return f"must be a positive number of seconds, got {value!r}"
    return None


def positive_int_problem(value: Any) -> str | None:
    """Why ``value`` is not a whole number of at least 1, or None (shared like the above)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a whole number of at least 1, got {value!r}"
    return None


def _positive_number(alias: str, key: str, value: Any) -> float:
    problem = positive_seconds_problem(value)
    if problem:
        raise _fail(alias, key, f"{problem}.")
    return float(value)


def _positive_int(alias: str, key: str, value: Any) -> int:
    problem = positive_int_problem(value)
    if problem:
        raise _fail(alias, key, f"{problem}.")
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
    # An empty list is Django's "any queue name is valid", not a mistake.
    for name in queues:
        problem = queue_name_problem(name)
        if problem:
            raise InvalidBackendOptions(f"TASKS[{alias!r}]['QUEUES'] has {name!r}; {problem}")
    return frozenset(queues)


def queue_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be stored as a queue name, or None if it can."""
    if not isinstance(name, str) or not name or len(name) > QUEUE_NAME_MAX_LENGTH:
        return f"queue names are non-empty strings of at most {QUEUE_NAME_MAX_LENGTH} characters."
    if name == "*":
        return "'*' is not a queue name: it means 'every queue' on the runtasks command line."
    return None


def parse_settings(alias: str, params: Mapping[str, Any]) -> BackendSettings:
    """Validate ``TASKS[alias]`` and return its settings; raise on the first problem."""
    queues = _queues(alias, params)
    options = params.get("OPTIONS")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise InvalidBackendOptions(f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {options!r}.")
    if problem := unknown_key_problem(options, _DEFAULTS):
        raise InvalidBackendOptions(f"TASKS[{alias!r}]['OPTIONS'] {problem}")
    merged = {**_DEFAULTS, **options}

    database = merged["DATABASE"]
    if not isinstance(database, str) or not database:
        raise _fail(alias, "DATABASE", f"must be a database alias, got {database!r}.")

    notify = merged["NOTIFY"]
    if not isinstance(notify, bool):
        raise _fail(alias, "NOTIFY", f"must be True or False, got {notify!r}.")
    synchronous_claims = merged["SYNCHRONOUS_CLAIMS"]
    if not isinstance(synchronous_claims, bool):
        raise _fail(
            alias, "SYNCHRONOUS_CLAIMS", f"must be True or False, got {synchronous_claims!r}."
        )
    autodiscover = merged["AUTODISCOVER"]
    if not isinstance(autodiscover, bool):
        raise _fail(alias, "AUTODISCOVER", f"must be True or False, got {autodiscover!r}.")
    schedules = merged["SCHEDULES"]
    if not isinstance(schedules, Mapping) or not all(
        isinstance(name, str) and isinstance(entry, Mapping) for name, entry in schedules.items()
    ):
        raise _fail(
            alias, "SCHEDULES", f"must map schedule names to dicts of options, got {schedules!r}."
        )

    queue_doers, max_depths = _queues_config(alias, merged["QUEUES_CONFIG"], queues)

    resolution = merged["QUEUE_RESOLUTION"]
    if resolution not in QUEUE_RESOLUTIONS:
        raise _fail(
            alias,
            "QUEUE_RESOLUTION",
            f"must be one of {', '.join(map(repr, QUEUE_RESOLUTIONS))}, got {resolution!r}.",
        )

    max_payload = merged["MAX_PAYLOAD_BYTES"]
    if max_payload is not None:
        max_payload = _positive_int(alias, "MAX_PAYLOAD_BYTES", max_payload)

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
        prefetch=None
        if merged["PREFETCH"] is None
        else _non_negative_int(alias, "PREFETCH", merged["PREFETCH"]),
        shutdown_timeout=_positive_number(alias, "SHUTDOWN_TIMEOUT", merged["SHUTDOWN_TIMEOUT"]),
        doer=_doer_spec(alias, "DOER", merged["DOER"]),
        queue_doers=queue_doers,
        max_depths=max_depths,
        notify=notify,
        synchronous_claims=synchronous_claims,
        dedup_ttl=_duration(alias, "DEDUP_TTL", merged["DEDUP_TTL"]),
        max_payload_bytes=max_payload,
        queue_resolution=resolution,
        middleware=_middleware(alias, merged["MIDDLEWARE"]),
        enqueue_middleware=_middleware(
            alias, merged["ENQUEUE_MIDDLEWARE"], key="ENQUEUE_MIDDLEWARE", handles="the envelope"
        ),
        metrics=metrics_settings(alias, merged["METRICS"]),
        services=_services(alias, merged["SERVICES"]),
        autodiscover=autodiscover,
        schedules=dict(schedules),
        retention=retention_settings(alias, merged["RETENTION"]),
        queue_order=tuple(dict.fromkeys(params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME]))),
    )


def _services(alias: str, value: Any) -> tuple[Any, ...]:
    try:
        return load_service_factories(value, f"TASKS[{alias!r}]['OPTIONS']['SERVICES']")
    except ValueError as exc:
        raise InvalidBackendOptions(str(exc)) from exc


def _middleware(
    alias: str, value: Any, *, key: str = "MIDDLEWARE", handles: str = "the attempt"
) -> tuple[Middleware, ...]:
    try:
        return load_middleware(value, f"TASKS[{alias!r}]['OPTIONS'][{key!r}]", handles=handles)
    except ValueError as exc:
        raise InvalidBackendOptions(str(exc)) from exc


def metrics_settings(alias: str, value: Any) -> MetricsSettings:
    """Validate ``OPTIONS["METRICS"]``; also read on its own by ``metrics`` at startup."""
    if not isinstance(value, Mapping):
        raise _fail(alias, "METRICS", f"must be a dict, got {value!r}.")
    if problem := unknown_key_problem(value, _METRICS_DEFAULTS):
        raise _fail(alias, "METRICS", problem)
    merged = {**_METRICS_DEFAULTS, **value}
    enabled = merged["ENABLED"]
    if not isinstance(enabled, bool):
        raise _fail(alias, "METRICS", f"must be True or False, got {enabled!r}.", subkey="ENABLED")
    token = merged["TOKEN"]
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise _fail(
            alias,
            "METRICS",
            f"must be None (no token: staff sessions only) or a non-empty string, got {token!r}.",
            subkey="TOKEN",
        )
    numbers = {}
    for key in ("FLUSH_INTERVAL", "RETENTION_DAYS", "HOURLY_RETENTION_DAYS"):
        problem = positive_seconds_problem(merged[key])
        if problem:
            if key != "FLUSH_INTERVAL":
                problem = problem.replace("seconds", "days")
            raise _fail(alias, "METRICS", f"{problem}.", subkey=key)
        numbers[key] = float(merged[key])
    if "HOURLY_RETENTION_DAYS" not in value:  # the default never undercuts the minutes'
        numbers["HOURLY_RETENTION_DAYS"] = max(
            numbers["HOURLY_RETENTION_DAYS"], numbers["RETENTION_DAYS"]
        )
    elif numbers["HOURLY_RETENTION_DAYS"] < numbers["RETENTION_DAYS"]:
        raise _fail(
            alias,
            "METRICS",
            f"must be at least RETENTION_DAYS ({merged['RETENTION_DAYS']!r}): minutes older "
            f"than that are summed into hourly rows, which would be deleted at once; got "
            f"{merged['HOURLY_RETENTION_DAYS']!r}.",
            subkey="HOURLY_RETENTION_DAYS",
        )
    return MetricsSettings(
        enabled=enabled,
        flush_interval=numbers["FLUSH_INTERVAL"],
        retention=timedelta(days=numbers["RETENTION_DAYS"]),
        hourly_retention=timedelta(days=numbers["HOURLY_RETENTION_DAYS"]),
        token=token,
    )


def retention_settings(alias: str, value: Any) -> RetentionSettings:
    """Validate ``OPTIONS["RETENTION"]``."""
    if not isinstance(value, Mapping):
        raise _fail(alias, "RETENTION", f"must be a dict, got {value!r}.")
    for key in value:
        if str(key).upper() in UNFINISHED_STATUSES:
            raise _fail(
                alias,
                "RETENTION",
                f"has {key!r}: {str(key).upper()} tasks have not finished and are never "
                "pruned. Give a retention for SUCCESSFUL or FAILED tasks.",
            )
        if problem := unknown_key_problem([key], _RETENTION_DEFAULTS):
            raise _fail(alias, "RETENTION", problem)
    merged = {**_RETENTION_DEFAULTS, **value}
    ages: dict[str, timedelta | None] = {}
    for key in ("SUCCESSFUL", "FAILED", "BREAKERS", "SCHEDULE_OCCURRENCES"):
        given = merged[key]
        if given is None:
            ages[key] = None
            continue
        try:
            ages[key] = _duration(alias, "RETENTION", given)
        except InvalidBackendOptions:
            raise _fail(
                alias,
                "RETENTION",
                f"must be a duration (a timedelta or a number of seconds) or None (keep "
                f"for ever), got {given!r}.",
                subkey=key,
            ) from None
    interval = merged["INTERVAL"]
    problem = positive_seconds_problem(interval)
    if problem:
        raise _fail(alias, "RETENTION", f"{problem}.", subkey="INTERVAL")
    batch_size = merged["BATCH_SIZE"]
    problem = positive_int_problem(batch_size)
    if problem:
        raise _fail(alias, "RETENTION", f"{problem}.", subkey="BATCH_SIZE")
    return RetentionSettings(
        successful=ages["SUCCESSFUL"],
        failed=ages["FAILED"],
        breakers=ages["BREAKERS"],
        schedule_occurrences=ages["SCHEDULE_OCCURRENCES"],
        interval=float(interval),
        batch_size=batch_size,
    )


def _duration(alias: str, key: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise _fail(alias, key, f"must be a positive duration, got {value}.")
    else:
        value = _positive_number(alias, key, value)
    try:
        return as_delay(value, key)  # the one bound on times (``timebounds``)
    except TimeOutOfRange as exc:
        raise _fail(alias, key, str(exc).removeprefix(f"{key} ")) from exc


def _queues_config(
    alias: str, config: Any, queues: frozenset[str]
) -> tuple[dict[str, Any], dict[str, int]]:
    """Split QUEUES_CONFIG into each queue's doer spec and its limits."""
    if not isinstance(config, Mapping):
        raise _fail(
            alias, "QUEUES_CONFIG", f"must be a dict of queue name -> settings, got {config!r}."
        )
    doers: dict[str, Any] = {}
    max_depths: dict[str, int] = {}
    for queue, entry in config.items():
        if queues and queue not in queues:
            raise _fail(
                alias,
                "QUEUES_CONFIG",
                f"configures queue {queue!r}, which is not in QUEUES {sorted(queues)}.",
            )
        problem = queue_name_problem(queue)
        if problem:  # reachable with an empty QUEUES, which allows any name
            raise _fail(alias, "QUEUES_CONFIG", f"has {queue!r}; {problem}")
        doer_spec = entry
        if isinstance(entry, Mapping):
            doer_spec = {k: v for k, v in entry.items() if k not in QUEUE_KEYS}
            if "max_depth" in entry:
                depth = entry["max_depth"]
                if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                    raise _fail(
                        alias,
                        "QUEUES_CONFIG",
                        f"has max_depth {depth!r}; it must be a whole number of at least 1.",
                        subkey=queue,
                    )
                max_depths[queue] = depth
            if not doer_spec:
                continue  # only limits: the queue keeps the default doer
        doers[queue] = _doer_spec(alias, "QUEUES_CONFIG", doer_spec, subkey=queue)
    return doers, max_depths
