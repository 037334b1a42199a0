"""What a dialect provides, and the SQL plumbing every dialect shares."""

from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache, cached_property
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.utils.dateparse import parse_datetime

from ..lifecycle import ClaimedTask
from ..models import TaskRecord
from ..stored import error_list, parse_column, worker_id_list
from . import sql
from .sql import CLAIM_COLUMNS
from .values import JsonText

if TYPE_CHECKING:
    from .completions import Completion

NOTIFY_CHANNEL = "django_tasks_plus"
# Rows per INSERT statement: well under PostgreSQL's 65,535 and SQLite's 32,766 parameters.
INSERT_CHUNK = 1000


@cache
def _fields() -> dict[str, Field]:
    return {f.name: f for f in TaskRecord._meta.concrete_fields}


def table() -> str:
    return TaskRecord._meta.db_table


def column(name: str) -> str:
    return cast(str, _fields()[name].column)  # a concrete field always has one


def prep(name: str, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """``value`` as the database driver wants it for column ``name`` (Django's own rules)."""
    shortcut = _shortcuts(connection)
    if name in shortcut:
        ready = shortcut[name](value)
        if ready is not _USE_DJANGO:
            return ready
    return _fields()[name].get_db_prep_save(value, connection)


_USE_DJANGO: Any = object()
_Shortcut = Callable[[Any], Any]


def _shortcuts(connection: BaseDatabaseWrapper) -> dict[str, _Shortcut]:
    """Per column, what Django's ``get_db_prep_save`` gives for the plain values an
    enqueue writes, without its field machinery (about a tenth of a single enqueue's CPU);
    any other value returns ``_USE_DJANGO`` and takes Django's path."""
    found = _SHORTCUTS.get(connection.vendor)
    if found is None:
        found = _SHORTCUTS[connection.vendor] = _shortcuts_for(connection)
    return found


_SHORTCUTS: dict[str, dict[str, _Shortcut]] = {}


def _shortcuts_for(connection: BaseDatabaseWrapper) -> dict[str, _Shortcut]:
    from django.db import models

    def unchanged(python_type: type) -> _Shortcut:
        return lambda value: value if value is None or type(value) is python_type else _USE_DJANGO

    def aware(value: Any) -> Any:
        if value is None or (type(value) is datetime and value.tzinfo is not None):
            return value
        return _USE_DJANGO

    def typed_int(wrap: Callable[[int], Any]) -> _Shortcut:
        return lambda value: (
            wrap(value) if type(value) is int else None if value is None else _USE_DJANGO
        )

    from . import dialect_for

    plain = dialect_for(connection).driver_takes_plain_values
    shortcuts: dict[str, _Shortcut] = {}
    for name, field in _fields().items():
        if isinstance(field, models.BooleanField):
            shortcuts[name] = unchanged(bool)
        elif isinstance(field, (models.CharField, models.TextField)):
            shortcuts[name] = unchanged(str)
        elif not plain:
            continue  # elsewhere Django turns dates, UUIDs and integers into its own values
        elif isinstance(field, models.UUIDField):
            # PostgreSQL reads the text form into its uuid type: the UUID object Django
            # would build stores the same value.
            shortcuts[name] = unchanged(str)
        elif isinstance(field, models.DateTimeField):
            shortcuts[name] = aware  # Django adapts aware datetimes to themselves here
        elif isinstance(field, models.IntegerField):
            # psycopg 3 types Django's integers (Int2, Int4, Int8) by the field's kind.
            types = getattr(connection.ops, "integerfield_type_map", {})
            wrap = types.get(field.get_internal_type())
            if wrap is not None:
                shortcuts[name] = typed_int(wrap)
    return shortcuts


def insert_statements(
    rows: Sequence[Mapping[str, Any]],
    connection: BaseDatabaseWrapper,
    *,
    json_placeholder: str,
    sequence_sql: str | None,
) -> list[tuple[str, list[Any]]]:
    """Multi-row INSERTs (one per ``INSERT_CHUNK`` rows) of same-shaped rows.

    Generated rather than written out: the columns are the envelope's. ``JsonText``
    values are passed as text with ``json_placeholder`` (a cast where the database needs
    one), so JSON is encoded once, by the codec. ``sequence_sql`` is the SQL expression
    numbering a row in enqueue order, its ``{offset}`` the row's 1-based place in the
    statement (None: the column's default does). The statement's text depends only on
    that shape, so it is built once per shape and the same text reaches the driver every
    time (its own per-statement caches then apply).
    """
    names = tuple(rows[0])
    shortcuts = _shortcuts(connection)
    fields = _fields()
    literals = _literals(connection, json_placeholder)
    statements = []
    for start in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[start : start + INSERT_CHUNK]
        # One row (every single enqueue): its constants go into the text, not as parameters
        # (about half of a task's values; each costs the driver a few µs to adapt). Not
        # for several rows, whose mixes of constants would multiply the statement texts.
        inline = literals if len(chunk) == 1 else None
        params: list[Any] = []
        marks: list[str] = []
        for row in chunk:
            for name in names:  # prep() inlined: this loop is most of a single enqueue's own CPU
                value = row[name]
                if inline is not None:
                    try:
                        literal = inline.get((name, value.__class__, value))
                    except TypeError:  # an unhashable value: a parameter like any other
                        literal = None
                    if literal is not None:
                        marks.append(literal)
                        continue
                if type(value) is JsonText:
                    marks.append(json_placeholder)
                    params.append(str(value))
                    continue
                marks.append("%s")
                shortcut = shortcuts.get(name)
                if shortcut is not None:
                    ready = shortcut(value)
                    if ready is not _USE_DJANGO:
                        params.append(ready)
                        continue
                params.append(fields[name].get_db_prep_save(value, connection))
        shape = (connection.vendor, names, tuple(marks), sequence_sql)
        text = _INSERT_TEXTS.get(shape)
        if text is None:
            text = _insert_text(connection, names, marks, sequence_sql)
            if len(_INSERT_TEXTS) >= _INSERT_TEXTS_KEPT:
                _INSERT_TEXTS.clear()  # unusual shapes must not grow it without end
            _INSERT_TEXTS[shape] = text
        statements.append((text, params))
    return statements


def _literals(connection: BaseDatabaseWrapper, json_placeholder: str) -> dict[Any, str]:
    """SQL literals for the constant values of a new task's row, by (column, value type,
    value): NULL where Django stores None as NULL, booleans, the empty text and the empty
    JSON array and object. Any other value, or another type (``1`` is not ``True``), is
    a parameter."""
    key = (connection.vendor, json_placeholder)
    found = _LITERALS.get(key)
    if found is not None:
        return found
    from django.db import models

    found = {}
    for name, field in _fields().items():
        if isinstance(field, models.JSONField):
            for empty in ("[]", "{}"):
                found[(name, JsonText, empty)] = json_placeholder.replace("%s", f"'{empty}'")
            continue  # Django stores None in a JSON column as JSON null, not as NULL
        if field.null:
            found[(name, type(None), None)] = "NULL"
        if isinstance(field, models.BooleanField):
            found[(name, bool, True)] = "TRUE"
            found[(name, bool, False)] = "FALSE"
        elif isinstance(field, (models.CharField, models.TextField)):
            found[(name, str, "")] = "''"
    _LITERALS[key] = found
    return found


_LITERALS: dict[tuple[str, str], dict[Any, str]] = {}


# Statement texts by shape: a handful in practice (one per row count and JSON layout).
_INSERT_TEXTS: dict[tuple[Any, ...], str] = {}
_INSERT_TEXTS_KEPT = 256


def _insert_text(
    connection: BaseDatabaseWrapper,
    names: tuple[str, ...],
    marks: Sequence[str],
    sequence_sql: str | None,
) -> str:
    """``INSERT INTO table (columns) VALUES (…), (…)`` for one shape of rows: ``marks``
    holds each value's placeholder or literal, row after row."""
    quote = connection.ops.quote_name
    quoted = [quote(column(name)) for name in names]
    if sequence_sql is not None:
        quoted.append(quote(column("sequence")))
    width = len(names)
    tuples = []
    for index in range(len(marks) // width):
        row_marks = list(marks[index * width : (index + 1) * width])
        if sequence_sql is not None:
            row_marks.append(sequence_sql.format(offset=index + 1))
        tuples.append(f"({', '.join(row_marks)})")
    return f"INSERT INTO {quote(table())} ({', '.join(quoted)}) VALUES {', '.join(tuples)}"


def _as_datetime(value: Any) -> datetime | None:
    parsed = value if value is None or isinstance(value, datetime) else parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


# A UUID in the form ``str(uuid.UUID(...))`` gives (PostgreSQL's text form of its uuid).
_CANONICAL_ID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
).fullmatch


def _canonical_id(raw_id: Any) -> str:
    """A claimed row's id in ``str(UUID)`` form: PostgreSQL's text kept as it is, anything
    else (a ``UUID``, SQLite's 32 hex digits) parsed and printed."""
    if type(raw_id) is str and _CANONICAL_ID(raw_id):
        return raw_id
    return str(raw_id if isinstance(raw_id, uuid.UUID) else uuid.UUID(str(raw_id)))


def claimed_from_row(
    row: Sequence[Any],
    claimed_at: datetime | None = None,
    *,
    id_is_canonical: bool = False,
    shared: Callable[[Any, Any], Any] | None = None,
) -> ClaimedTask:
    """Build a ``ClaimedTask`` from a RETURNING row in ``CLAIM_COLUMNS`` order.

    JSON columns arrive as text (Django loads jsonb as text, SQLite stores text) and
    datetimes as text on SQLite; both are decoded here, once. A corrupt JSON column never
    raises here (see ``stored``): one bad row must not fail the claim of the others.
    ``id_is_canonical``: the database printed the id from a uuid column (PostgreSQL's
    ``id::text``), already in ``str(UUID)`` form, so it is not checked again per row.
    ``shared``: one claim's ``dict.setdefault``, through which the values most rows of a
    claim repeat (task path, queue, lease token, backend, claim and start time) are kept
    once: the driver builds each row's own copies, and a worker holds up to a thousand
    claimed tasks at a time.
    """
    (
        raw_id,
        task_path,
        queue_name,
        priority,
        args,
        kwargs,
        attempt,
        worker_ids,
        errors,
        enqueued_at,
        run_after,
        started_at,
        lease_token,
        backend_name,
        ordering_key,
        requested_run_after,
        held_since,
        breaker_key,
        metadata,
    ) = row  # CLAIM_COLUMNS, by position: a claim builds thousands of these a second
    if shared is not None:
        task_path = shared(task_path, task_path)
        queue_name = shared(queue_name, queue_name)
        lease_token = shared(lease_token, lease_token)
        backend_name = shared(backend_name, backend_name)
        claimed_at = shared(claimed_at, claimed_at)
        started_at = shared(started_at, started_at)  # a first attempt's is claimed_at
    # ``_make`` of the values in field order: a third of the time of keyword arguments
    # (2.7 against 0.4 µs for these 21 fields), which named tuples parse in Python.
    return ClaimedTask._make(
        (
            raw_id if id_is_canonical else _canonical_id(raw_id),  # id
            task_path,
            queue_name,
            int(priority),
            parse_column(args),
            {} if kwargs == "{}" else parse_column(kwargs),  # most calls: no decoding
            int(attempt),
            worker_id_list(worker_ids),
            error_list(errors),
            _as_datetime(enqueued_at),
            _as_datetime(run_after),
            _as_datetime(started_at),
            lease_token,
            backend_name,
            ordering_key,
            claimed_at,
            _as_datetime(requested_run_after),
            _as_datetime(held_since),
            breaker_key,
            {} if metadata == "{}" else parse_column(metadata),
            _stored_length(args) + _stored_length(kwargs),  # stored_size
        )
    )


def _stored_length(value: Any) -> int:
    """The length of a JSON column as it arrived (text), or 0 when the driver decoded it."""
    return len(value) if isinstance(value, str | bytes) else 0


class DriverState(NamedTuple):
    """A connection's transaction state as the database driver itself reports it.

    Django keeps its own record (``autocommit``, ``in_atomic_block``); an exception raised
    half-way through Django's bookkeeping leaves that record out of step with the driver,
    and the driver is the one that decides what gets committed. A named tuple: read
    twice per attempt, it is built in two thirds of a frozen dataclass's time."""

    autocommit: bool
    """Whether each statement commits on its own."""
    in_transaction: bool
    """Whether a transaction is open: what ran since it began is not committed."""
    usable: bool
    """False when the driver is closed, mid-query, or has lost track of the session."""


class Dialect(ABC):
    """Everything the queue says to one kind of database: insert, claim, outcome writes,
    lease renewal, reaping, dedup keys, and the database's clock.

    A dialect is one module in ``db/`` (registered in ``db/__init__.py``). It writes its
    own statements as named constants and fills the shared ones of ``db/sql.py`` with its
    fragments; a method defined here works unchanged where those statements are valid
    SQL for the database, and a dialect overrides it where they are not.

    Leases and due times are compared and computed with the database's clock, never the
    worker host's: a host whose clock runs fast or slow cannot then reap a live task or
    run one early, and an expiry is computed when the statement really runs, after any
    wait for a lock, not when the worker decided to send it. Dialects hold no state:
    ``dialect_for`` hands out one instance per vendor.
    """

    vendor: str
    supports_notify: bool = False
    """Whether enqueues wake workers with a notification (else workers poll)."""
    supports_advisory_locks: bool = False
    """Whether a session can hold a named lock that ends with it (leadership uses one;
    else a lease row)."""
    builds_indexes_concurrently: bool = False
    """Whether migrations build and drop indexes without blocking writes (``CREATE INDEX
    CONCURRENTLY``; ``db/migration_operations.py``)."""
    now_sql: str
    """The database's current time, as SQL: for comparisons (due, expired)."""
    skip_locked_rows_sql: str = ""
    """Appended to a sub-select to lock its rows, passing over rows another session has
    locked (where the database can; the pruner then never waits for a redrive)."""
    json_param: str = "%s"
    """The placeholder for a ``JsonText`` parameter (with a cast where one is needed)."""
    driver_takes_plain_values: bool = False
    """Whether the driver stores a UUID given as text, an aware datetime as it is and an
    integer typed by its column as Django would (psycopg 3 on PostgreSQL): an enqueue then
    skips Django's conversion of those too (``_shortcuts``)."""
    has_search_indexes: bool = False
    """Whether ``manage.py searchindex`` can build GIN indexes for JSON containment
    (``db/search_index.py``); elsewhere the admin's JSON search reads the rows."""

    def lock_not_available(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database refusing a lock another session holds (a
        ``NOWAIT`` that met one, or a lock timeout), not any other failure."""
        return False

    def json_contains(self, column: str, key: str | None, value: Any) -> tuple[str, list[Any]]:
        """SQL (and its parameters) true when the JSON in ``column`` holds ``value``: as
        an element of the array (``key`` None), else under ``key`` of the object. The
        admin's ``arg:``, ``kwarg:`` and ``meta:`` searches (``db/json_search.py``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot search JSON")

    def without_json_keys(self, column: str, keys: Sequence[str]) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for the JSON object in ``column`` with ``keys``
        removed; a value that is not an object is left as it is (a redrive clears a
        task's per-run metadata keys with it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot remove JSON keys")

    def check(self, connection: BaseDatabaseWrapper) -> list[str]:
        """Problems that stop this database from running the queue (empty if none)."""
        return []

    def wake(self, connection: BaseDatabaseWrapper, queues: Sequence[str]) -> None:
        """Tell listening workers that tasks of ``queues`` became due (on commit, where
        notifications are transactional); without notifications workers poll: nothing."""
        return None

    def gather_first_statistics(
        self, connection: BaseDatabaseWrapper, min_rows: int, seconds: float
    ) -> str:
        """Give the task table its first planner statistics if it has none and holds at
        least ``min_rows`` rows, taking at most ``seconds`` (the leader's pruner asks):
        ``"gathered"``, ``"present"`` (nothing to do), ``"too few rows"``,
        ``"refused"`` (the database user may not analyze the table), or
        ``"unsupported"`` where this dialect does not (the default)."""
        return "unsupported"

    # -- the driver's own view of a connection (attribute reads, never a query) ---------

    def driver_state(self, raw: Any) -> DriverState | None:
        """What the driver connection ``raw`` says about its transaction; None when this
        dialect cannot tell (then Django's record is all there is)."""
        return None

    def hung_up(self, raw: Any) -> bool:
        """Whether the server has (probably) closed the idle connection ``raw``, seen
        without a round trip; a True may be a false alarm, to be confirmed by a query.
        The default cannot tell: False."""
        return False

    # -- the clock -----------------------------------------------------------------------

    @abstractmethod
    def lease_expiry(self, seconds: float) -> tuple[str, list[Any]]:
        """SQL (and its parameters) for "``seconds`` from now" by the database's clock,
        evaluated when the row is written, so waiting for a lock cannot shorten a lease."""

    @abstractmethod
    def parse_time(self, value: Any) -> datetime:
        """A time the database returned for ``now_sql``, as an aware datetime."""

    def current_time(self, connection: BaseDatabaseWrapper) -> datetime:
        """The database's clock, now."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.now_sql}", [])  # [] so that %% is unescaped
            (value,) = cursor.fetchone()
        return self.parse_time(value)

    def prepare_worker(self) -> None:
        """Load what every worker process loads for its first writes, once, in the
        process that forks them: pages loaded before the fork are shared by all of them
        (``worker.engine.prepare_to_fork``). Nothing by default."""
        return None

    def bound_worker_statements(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        """Make the worker's own statements on ``connection`` give up after ``seconds``
        instead of waiting without end (a stalled table must not hang the worker's
        bookkeeping threads). Task code never runs on these connections.

        The default does nothing: a database without such settings waits as it waits."""
        return None

    def unbound_worker_statements(self, connection: BaseDatabaseWrapper) -> None:
        """Undo ``bound_worker_statements`` on ``connection``'s session, if it was bounded:
        its settings back to what the session started with (``db/unpooled.py``)."""
        return None

    @contextmanager
    def lock_wait_bounded(self, connection: BaseDatabaseWrapper, seconds: float) -> Iterator[None]:
        """Inside a transaction on ``connection``: the block's statements wait at most
        ``seconds`` for a lock, then fail with an error ``lock_not_available`` knows (a
        shorter bound the session has stays). For the locks other sessions take for
        short moments, where a session that keeps one must not stall the caller.

        The default does nothing: a database without such a setting waits as it waits."""
        yield

    # -- enqueue -------------------------------------------------------------------------

    @abstractmethod
    def insert_tasks(
        self,
        connection: BaseDatabaseWrapper,
        rows: Sequence[Mapping[str, Any]],
        *,
        notify: bool = True,
        meanwhile: Callable[[], object] | None = None,
    ) -> None:
        """Insert task rows on ``connection``, numbering them in order, waking workers.

        ``meanwhile``: client work to do once, before this returns; where the driver
        streams the rows (PostgreSQL's COPY), while the server is still taking them in.
        If it raises, the rows may already be written (a COPY it interrupts fails):
        what stays is the caller's transaction's to decide.
        """

    def insert_dedup_key(
        self,
        connection: BaseDatabaseWrapper,
        params: Sequence[Any],
        *,
        lock_wait: float | None = None,
    ) -> bool:
        """Insert a dedup key row unless one holds the key; True if this call inserted it.

        ``params`` are ``sql.INSERT_DEDUP_KEY``'s, driver-ready, the task ids as JSON text.
        Runs in the caller's transaction. ``lock_wait``: the statement first bounds the
        transaction's lock waits to that many seconds until it ends, as
        ``lock_wait_bounded`` does but in the same round trip (a caller that owns the
        transaction); where the database has no such bound, nothing."""
        with connection.cursor() as cursor:
            cursor.execute(self._insert_dedup_key_sql, params)
            return cursor.fetchone() is not None

    @cached_property
    def _insert_dedup_key_sql(self) -> str:
        return sql.INSERT_DEDUP_KEY.format(json=self.json_param)

    # -- the worker ----------------------------------------------------------------------

    @abstractmethod
    def claim(
        self,
        connection: BaseDatabaseWrapper,
        *,
        backend_name: str,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        lease_token: str,
        visibility_timeout: float,
        synchronous: bool = True,
    ) -> list[ClaimedTask]:
        """Atomically move up to ``limit`` READY, due tasks to RUNNING under a lease of
        ``visibility_timeout`` seconds; due and expiry by the database's clock. The claim's
        WHERE and ORDER BY are ``sql.claim_candidates`` with the dialect's fragments.
        ``synchronous=False`` lets a dialect commit the claim without waiting for it to be
        durable (``OPTIONS["SYNCHRONOUS_CLAIMS"]``); one that cannot ignores it."""

    def write_outcomes(
        self,
        connection: BaseDatabaseWrapper,
        completions: Sequence[Completion],
        *,
        expect_locks: bool = False,
    ) -> list[bool]:
        """Write each ``(claimed, transition)`` fenced by its lease token, inside the
        caller's transaction; return, in order, which landed.

        Where the database locks single rows, a row another session holds locked is
        skipped (not landed) after a short wait at most, or at once with
        ``expect_locks`` (the caller writes it again: ``store.leases_still_held`` tells
        such a row from a lost lease). The default writes row by row; a dialect with a
        batched form overrides it."""
        from .store import apply_transition  # store reads dialect_for: import when used

        return [apply_transition(connection.alias, task, outcome) for task, outcome in completions]

    def outcomes_in_one_statement(self, completions: Sequence[Completion]) -> bool:
        """Whether ``write_outcomes`` writes ``completions`` with one statement, which
        then needs no transaction around it. Row by row: only a single outcome."""
        return len(completions) == 1

    def renew_leases(
        self,
        connection: BaseDatabaseWrapper,
        leases: Iterable[tuple[str, str]],
        visibility_timeout: float,
    ) -> set[tuple[str, str]]:
        """Extend every ``(id, token)`` lease still held (``sql.RENEW_LEASES``) to
        ``visibility_timeout`` seconds after its row is written; return the pairs renewed.
        For a database without row locks; one with them overrides this to skip a locked
        row and count it held (PostgreSQL's)."""
        ids, tokens = lease_parts(leases)
        expiry_sql, expiry_params = self.lease_expiry(visibility_timeout)
        statement = sql.RENEW_LEASES.format(
            lease_expiry=expiry_sql,
            ids=sql.placeholders(len(ids)),
            tokens=sql.placeholders(len(tokens)),
        )
        params = [
            *expiry_params,
            *(prep("id", uuid.UUID(task_id), connection) for task_id in ids),
            *tokens,
        ]
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return {(str(uuid.UUID(str(row[0]))), row[1]) for row in cursor.fetchall()}

    def expired_tasks(
        self, connection: BaseDatabaseWrapper, backend_name: str, limit: int
    ) -> list[ClaimedTask]:
        """Running tasks of ``backend_name`` whose lease ran out (``sql.EXPIRED_TASKS``)."""
        with connection.cursor() as cursor:
            cursor.execute(self._expired_tasks_sql, [backend_name, limit])
            rows = cursor.fetchall()
        return [claimed_from_row(row) for row in rows]

    @cached_property
    def _expired_tasks_sql(self) -> str:
        return sql.EXPIRED_TASKS.format(claim_columns=", ".join(CLAIM_COLUMNS), now=self.now_sql)


def lease_parts(leases: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The distinct task ids and lease tokens of ``(id, token)`` pairs, each sorted: what
    a renewal statement matches rows by (its result is then checked pair by pair)."""
    pairs = list(leases)
    return sorted({task_id for task_id, _ in pairs}), sorted({token for _, token in pairs})


def sort_claimed(claimed: list[ClaimedTask]) -> list[ClaimedTask]:
    """RETURNING has no order: restore the claim order (priority first, highest first;
    then due time, then id). Two sorts by C key getters, the second stable (also with
    ``reverse``), in place of one sort by a Python key of a built tuple per task."""
    claimed.sort(key=_DUE_ORDER)
    claimed.sort(key=_PRIORITY, reverse=True)
    return claimed


_DUE_ORDER = attrgetter("run_after", "id")
_PRIORITY = attrgetter("priority")
