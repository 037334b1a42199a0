"""How far ahead a time the queue stores may lie: one bound, checked where times are made.

Every time or duration that comes from user code is checked here when it is created,
against ``HORIZON`` (ten years): ``run_after`` at enqueue, ``TaskDeferred``, a
middleware's ``Hold``, a retry policy's delay (and ``exponential_backoff``'s own),
a breaker's durations, a ``dedup_ttl``, a task's ``timeout``. A value further off is
almost always a unit mistake (milliseconds given as seconds, a year typo), and one near
``datetime.max`` does harm besides: adding it to "now" overflows Python's ``datetime``
on the worker's own threads, and PostgreSQL stores times that psycopg cannot read back
(year 10000, or late 9999-12-31 in a session time zone east of UTC), so ``get_result()``
and the admin fail on the row. A refused value raises ``TimeOutOfRange``.

Pure: callers pass their own clock's "now" (the worker's is the database's).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from .exceptions import TimeOutOfRange

HORIZON = timedelta(days=3650)
_HORIZON_SECONDS = HORIZON.total_seconds()


def as_delay(value: timedelta | float, field: str) -> timedelta:
    """``value`` (a ``timedelta`` or a number of seconds) as a plain ``timedelta``.

    Raises ``TimeOutOfRange`` (naming ``field``) for NaN, infinity or anything longer
    than ``HORIZON`` either way, ``TypeError`` for anything else that is not a delay.
    The sign is the caller's rule (some delays may be zero, none may be negative).
    """
    if isinstance(value, timedelta):
        # A plain copy: what is stored and added must not be a subclass with its own ideas.
        delta = timedelta(days=value.days, seconds=value.seconds, microseconds=value.microseconds)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or abs(value) > _HORIZON_SECONDS:
            raise _too_long(field, repr(value), value)
        delta = timedelta(seconds=float(value))
    else:
        raise TypeError(f"{field} must be a timedelta or a number of seconds, got {value!r}.")
    if abs(delta) > HORIZON:
        raise _too_long(field, str(delta), value)
    return delta


def not_beyond_horizon(moment: datetime, field: str, *, now: datetime) -> datetime:
    """``moment`` (an aware datetime) as a plain UTC datetime, if it lies at most
    ``HORIZON`` after ``now``; else ``TimeOutOfRange`` naming ``field``.

    Aware subtraction never overflows, so this is safe for any ``datetime`` up to
    ``datetime.max`` in any time zone; a time in the past is fine (it is due now).
    """
    plain = datetime(
        moment.year,
        moment.month,
        moment.day,
        moment.hour,
        moment.minute,
        moment.second,
        moment.microsecond,
        tzinfo=moment.tzinfo,
        fold=moment.fold,
    )
    if plain - now > HORIZON:
        raise TimeOutOfRange(
            f"{field} {plain.isoformat()} is more than {HORIZON.days} days ahead; a date "
            "that far is taken for a mistake.",
            field=field,
            value=moment,
        )
    try:
        return plain.astimezone(UTC)
    except OverflowError:  # before year 1 in UTC: no database can hold it either
        raise TimeOutOfRange(
            f"{field} {plain.isoformat()} is before the first time that can be stored.",
            field=field,
            value=moment,
        ) from None


def later(now: datetime, delay: timedelta | float, field: str) -> datetime:
    """``now + delay``, with ``delay`` checked by ``as_delay``: never an ``OverflowError``."""
    return now + as_delay(delay, field)


def _too_long(field: str, shown: str, value: object) -> TimeOutOfRange:
    return TimeOutOfRange(
        f"{field} must be at most {HORIZON.days} days (ten years), got {shown}; a delay "
        "that long is taken for a mistake.",
        field=field,
        value=value,
    )
