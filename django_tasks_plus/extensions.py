"""The app's registries: what features add to the engine, owned by objects, not modules.

A feature (a breaker, the metrics, later schedules, rate limits, groups) takes part in
the engine's work through these extension points, so the engine never names it:

- ``outcome_hooks``: functions run inside the transaction that writes a batch of attempt
  outcomes, after the fence check (``OutcomeHook``);
- ``claim_filters``: conditions a task must meet to be claimed, composed by the dialect
  into the one claim statement (``ClaimFilter``);
- ``service_factories``: worker services a feature runs beside the claim loop
  (``OPTIONS["SERVICES"]`` and ``@task(services=[...])`` add more, per backend);
- ``task_middleware``: execution middleware a feature adds to the tasks that use it
  (the breaker's, for tasks with ``breaker=``).

Each is a ``Registry``: ``register`` / ``unregister`` / ``registered`` (a ``with`` block),
read as a tuple without a lock. Entries registered with ``builtin=True`` are the app's
own (installed by ``AppConfig.ready``); ``reset()`` drops every other entry, so a test
can start from the app's state without knowing what other tests registered.

Pure: no I/O here (the database connection a hook receives is only passed through).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from django.utils.module_loading import import_string

from .lifecycle import ClaimedTask, Transition

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered set of entries of one kind; replaced whole under a lock, read without."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: tuple[T, ...] = ()
        self._builtin: tuple[T, ...] = ()
        self._lock = threading.Lock()
        self.version = 0
        """Bumped on every change: a cache built from the entries keys on it."""

    @property
    def entries(self) -> tuple[T, ...]:
        return self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def register(self, entry: T, *, builtin: bool = False) -> T:
        """Add ``entry`` (once: registering it again changes nothing); returns it, so a
        bare ``@registry.register`` decorates a function."""
        with self._lock:
            if not any(entry is known for known in self._entries):
                self._entries = (*self._entries, entry)
                self.version += 1
            if builtin and not any(entry is known for known in self._builtin):
                self._builtin = (*self._builtin, entry)
        return entry

    def unregister(self, entry: T) -> None:
        with self._lock:
            kept = tuple(known for known in self._entries if known is not entry)
            if len(kept) != len(self._entries):
                self._entries = kept
                self._builtin = tuple(known for known in self._builtin if known is not entry)
                self.version += 1

    @contextmanager
    def registered(self, entry: T) -> Iterator[T]:
        """``register`` for the duration of a ``with`` block (tests, one-off features)."""
        self.register(entry)
        try:
            yield entry
        finally:
            self.unregister(entry)

    def reset(self) -> None:
        """Back to the app's own entries: every entry not registered as built-in goes."""
        with self._lock:
            if self._entries != self._builtin:
                self._entries = self._builtin
                self.version += 1

    def __repr__(self) -> str:
        return f"<Registry of {self.kind}: {len(self._entries)} entries>"


# -- hooks inside the outcome transaction ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class WrittenOutcome:
    """One outcome that landed: the task as claimed and the transition written."""

    claimed: ClaimedTask
    transition: Transition


@dataclass(frozen=True, slots=True)
class OutcomeBatch:
    """What an outcome hook receives: the connection whose transaction is writing the
    outcomes (use ``connection.cursor()``; never commit or roll back), its database
    alias, and the outcomes that landed (those whose lease token still matched)."""

    connection: Any  # django.db.backends.base.base.BaseDatabaseWrapper
    database: str
    outcomes: tuple[WrittenOutcome, ...]

    @property
    def vendor(self) -> str:
        """``connection.vendor``: a hook that writes SQL may need to know the database."""
        return str(self.connection.vendor)


class OutcomeHook(Protocol):
    """``hook(batch)``: update the feature's own rows atomically with the outcomes.

    Runs on the worker's outcome writer (and the reaper's, for one expired lease), inside
    the transaction, after the outcome rows were written and fenced. A hook that raises
    rolls the whole batch back: the engine then handles it as a failed write (see
    docs/development.md, "Hooks inside the outcome transaction")."""

    def __call__(self, batch: OutcomeBatch, /) -> object: ...


outcome_hooks: Registry[OutcomeHook] = Registry("outcome hooks")


def run_outcome_hooks(connection: Any, database: str, outcomes: Sequence[WrittenOutcome]) -> None:
    """Call every registered hook with the batch; the caller holds the transaction."""
    if not outcomes:
        return
    batch = OutcomeBatch(connection, database, tuple(outcomes))
    for hook in outcome_hooks.entries:
        hook(batch)


# -- conditions on the claim ----------------------------------------------------------------


class UnsupportedClaimFilter(LookupError):
    """A claim filter has no SQL for the database the claim runs on."""


@dataclass(frozen=True)
class ClaimFilter:
    """A condition a READY task must also meet to be claimed.

    ``sql`` maps a database vendor (``"postgresql"``, ``"sqlite"``) to a boolean SQL
    fragment over the candidate row, which the claim names ``candidate`` (for example
    ``NOT EXISTS (SELECT 1 FROM myfeature_paused p WHERE p.queue_name =
    candidate.queue_name)``); ``params`` are its ``%s`` parameters, in order. The dialect
    ANDs every registered fragment into its one claim statement, so the claim stays
    atomic and the planner still walks the READY index: keep the fragment a correlated
    lookup on an indexed table of the feature's own, never a scan of the task table.
    """

    name: str
    sql: Mapping[str, str]
    params: Sequence[Any] = field(default=())

    def fragment(self, vendor: str) -> str:
        try:
            return self.sql[vendor]
        except KeyError:
            raise UnsupportedClaimFilter(
                f"Claim filter {self.name!r} has no SQL for {vendor!r} "
                f"(it has: {', '.join(sorted(self.sql)) or 'none'})."
            ) from None


claim_filters: Registry[ClaimFilter] = Registry("claim filters")


def claim_conditions(vendor: str, *, fenced: bool = False) -> tuple[str, list[Any]]:
    """The registered filters as SQL to append to the candidates' WHERE clause
    (``"\n  AND (…)"`` each; empty with none registered) and their parameters.

    ``fenced``: each fragment becomes a scalar sub-select, ``AND (SELECT (…))``, which
    the planner evaluates per candidate row as it walks the index instead of flattening
    it into a join; PostgreSQL's planner otherwise may estimate such a join to leave a
    row or two and trade the ordered index walk (which stops after LIMIT rows) for a
    sort of every READY task."""
    entries = claim_filters.entries
    if not entries:
        return "", []
    opening, closing = ("(SELECT (", "))") if fenced else ("(", ")")
    text = "".join(
        f"\n          AND {opening}{entry.fragment(vendor)}{closing}" for entry in entries
    )
    params: list[Any] = [value for entry in entries for value in entry.params]
    return text, params


# -- worker services and task middleware ----------------------------------------------------

ServiceFactory = Callable[[Any], Any]
"""``factory(context) -> service | iterable of services | None``, where ``context`` is a
``worker.plugins.ServiceContext`` (typed there: the worker is a higher layer)."""

service_factories: Registry[ServiceFactory] = Registry("service factories")


def load_service_factories(entries: Any, where: str) -> tuple[ServiceFactory, ...]:
    """Resolve a list of service factories (callables or their dotted paths).

    Raises ``ValueError`` whose message starts with ``where`` and names the bad entry;
    callers turn it into their own error class (``InvalidBackendOptions``,
    ``InvalidTaskOptions``)."""
    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        raise ValueError(
            f"{where} must be a list of service factories or their dotted paths, got {entries!r}."
        )
    factories = []
    for index, entry in enumerate(entries):
        factory = entry
        if isinstance(entry, str):
            try:
                factory = import_string(entry)
            except ImportError as exc:
                raise ValueError(
                    f"{where}[{index}] names {entry!r}, which cannot be imported: {exc}"
                ) from exc
        if not callable(factory):
            raise ValueError(
                f"{where}[{index}] is {factory!r}, not a callable; a service factory takes "
                "the worker's ServiceContext and returns a service, a list of them, or None."
            )
        factories.append(factory)
    return tuple(factories)


TaskMiddlewareProvider = Callable[[Any], Sequence[Any]]
"""``provider(task) -> middleware entries`` a feature adds to one task (innermost last)."""

task_middleware: Registry[TaskMiddlewareProvider] = Registry("task middleware")

REGISTRIES: tuple[Registry[Any], ...] = (
    outcome_hooks,
    claim_filters,
    service_factories,
    task_middleware,
)


def reset() -> None:
    """Every registry back to the app's own entries (tests)."""
    for registry in REGISTRIES:
        registry.reset()
