"""When a schedule fires: occurrences of cron expressions and intervals, and the policies
that decide what a late scheduler does (catch-up) and what a busy schedule does (overlap).

Pure: every function takes the current time as an argument (the scheduler passes the
database's clock), so the policies are tested without waiting.

- ``Every(seconds=30)`` is anchored at the Unix epoch: it fires at :00 and :30 on every
  host and across restarts, whatever time the worker started.
- ``Cron("0 2 * * *")`` is read as wall-clock time in the schedule's time zone (five
  fields, or six with seconds last, as croniter reads them; ``H`` is hashed with the
  schedule's name). Across a DST change a wall time that does not exist (spring forward)
  fires once, at the first instant after the gap; one that occurs twice (fall back)
  fires once, at its first occurrence.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidSchedule

if TYPE_CHECKING:
    from croniter import croniter


def _croniter() -> type[croniter]:
    """croniter (and dateutil under it), imported once a cron schedule is evaluated: a
    process with no cron schedule never loads them."""
    from croniter import croniter

    return croniter


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CATCH_UP_POLICIES = ("none", "latest", "all")
OVERLAP_POLICIES = ("allow", "skip")
DEFAULT_CATCH_UP = "latest"
DEFAULT_CATCH_UP_CAP = 10
ON_TIME_WINDOW = timedelta(seconds=30)
"""How late an occurrence may be found and still be on time (it fires under every
``catch_up`` policy). A healthy leader ticks every half second, but an occurrence is also
found late, through no outage, by a new leader taking over from one that died at the
moment of firing (a follower bids for leadership every 5 s at most), by the last batch of
a tick with many schedules due, or by a worker stalled on a slow database or a long
garbage collection: firing those late is what the user wants, skipping them is not.
Thirty seconds covers these several times over. An occurrence older than this was
missed while no scheduler ran (a deploy, an outage), and its schedule's ``catch_up``
decides what becomes of it."""
ENUMERATION_LIMIT = 10_000
"""At most this many missed occurrences are listed one by one; beyond, they are counted
as one jump (an ``Every(seconds=1)`` schedule after a week's outage)."""
BUSY_STATUSES = ("READY", "RUNNING")


@dataclass(frozen=True)
class Every:
    """A fixed interval in whole seconds, anchored at the Unix epoch."""

    seconds: int = 0
    minutes: int = 0
    hours: int = 0

    @property
    def total_seconds(self) -> int:
        return self.seconds + 60 * self.minutes + 3600 * self.hours

    def describe(self) -> str:
        return f"every {self.total_seconds} s"


@dataclass(frozen=True)
class Cron:
    """A cron expression, read in the schedule's time zone."""

    expression: str

    def describe(self) -> str:
        return self.expression


Spec = Every | Cron


def validate_spec(spec: Spec, name: str) -> Spec:
    """``spec`` if usable, else ``InvalidSchedule`` naming schedule ``name``."""
    if isinstance(spec, Every):
        parts = (spec.seconds, spec.minutes, spec.hours)
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in parts):
            raise InvalidSchedule(
                f"Schedule {name!r}: Every() takes whole non-negative seconds, minutes and "
                f"hours, got {spec!r}."
            )
        if spec.total_seconds < 1:
            raise InvalidSchedule(f"Schedule {name!r}: Every() needs at least one second.")
        return spec
    if isinstance(spec, Cron):
        expression = spec.expression
        if not isinstance(expression, str) or not _croniter().is_valid(
            expression, hash_id=name.encode()
        ):
            raise InvalidSchedule(f"Schedule {name!r}: {expression!r} is not a valid cron string.")
        return spec
    raise InvalidSchedule(
        f"Schedule {name!r}: a schedule is a cron string or Every(seconds=…), got {spec!r}."
    )


def as_spec(value: object, name: str) -> Spec:
    """A declared value (a cron string, ``Every``, ``Cron``) as a validated spec."""
    if isinstance(value, str):
        return validate_spec(Cron(value.strip()), name)
    if isinstance(value, Every | Cron):
        return validate_spec(value, name)
    raise InvalidSchedule(
        f"Schedule {name!r}: a schedule is a cron string or Every(seconds=…), got {value!r}."
    )


def zone(name: str, schedule: str) -> ZoneInfo:
    """The time zone called ``name``, else ``InvalidSchedule`` naming the schedule."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidSchedule(f"Schedule {schedule!r}: unknown time zone {name!r}.") from None


# -- occurrences ----------------------------------------------------------------------------


def next_after(spec: Spec, after: datetime, tz: tzinfo, hash_id: str) -> datetime:
    """The first occurrence strictly after ``after`` (aware), as an aware UTC datetime."""
    after = after.astimezone(UTC)
    if isinstance(spec, Every):
        step = spec.total_seconds
        elapsed = after - EPOCH
        whole = elapsed.days * 86400 + elapsed.seconds
        return EPOCH + timedelta(seconds=(whole // step + 1) * step)
    wall = after.astimezone(tz).replace(tzinfo=None, microsecond=0, fold=0)
    it = _croniter()(spec.expression, wall, hash_id=hash_id.encode())
    while True:
        instant = wall_to_utc(it.get_next(datetime), tz)
        if instant > after:
            return instant


def occurrences(
    spec: Spec, after: datetime, until: datetime, tz: tzinfo, hash_id: str
) -> Iterator[datetime]:
    """Every occurrence in ``(after, until]``, in order."""
    current = after
    while True:
        current = next_after(spec, current, tz, hash_id)
        if current > until:
            return
        yield current


def wall_to_utc(wall: datetime, tz: tzinfo) -> datetime:
    """The UTC instant of naive wall time ``wall`` in ``tz``: its first occurrence when
    it occurs twice, the first instant after the gap when it does not exist."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # In a gap: fold=0 reads it with the offset before the change, fold=1 with the one
    # after; the change lies between the two readings. Find its second.
    low = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    high = first
    if low > high:
        low, high = high, low
    after_offset = high.astimezone(tz).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle.astimezone(tz).utcoffset() == after_offset:
            high = middle
        else:
            low = middle
    return high


# -- policies -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one tick does with one schedule: the occurrences to fire, how many were
    missed, and the next occurrence to wait for."""

    fire: tuple[datetime, ...]
    missed: int
    next_at: datetime


@lru_cache(maxsize=4096)
def plan(
    spec: Spec,
    next_at: datetime,
    now: datetime,
    tz: tzinfo,
    hash_id: str,
    *,
    catch_up: str = DEFAULT_CATCH_UP,
    cap: int = DEFAULT_CATCH_UP_CAP,
    grace: timedelta = ON_TIME_WINDOW,
) -> Plan:
    """The tick's decision for a schedule waiting for ``next_at`` at time ``now``.

    Occurrences due at most ``grace`` ago are on time and fire. Older ones were missed
    while no scheduler ran; ``catch_up`` says what to do with them: ``"none"`` skips
    them, ``"latest"`` fires the latest of them (when no on-time one fires), ``"all"``
    fires each, the latest ``cap`` of them.

    Cached: the schedules due in one tick share ``now`` and, as often as not, their
    expression, and croniter's walk is the costliest step of firing them. The hash id
    takes part in the result only through ``H`` (and croniter's ``R``): ``plan_for``
    leaves it out otherwise.
    """
    if catch_up not in CATCH_UP_POLICIES:
        raise InvalidSchedule(f"catch_up must be one of {CATCH_UP_POLICIES}, got {catch_up!r}.")
    if next_at > now:
        return Plan((), 0, next_at)
    due, dropped = _due(spec, next_at, now, tz, hash_id)
    on_time = [at for at in due if now - at <= grace]
    late = [at for at in due if now - at > grace]
    if catch_up == "none":
        fire = on_time
    elif catch_up == "latest":
        fire = on_time or late[-1:]
    else:
        fire = (late[-cap:] if cap > 0 else []) + on_time
    missed = len(due) - len(fire) + dropped
    return Plan(tuple(fire), missed, next_after(spec, now, tz, hash_id))


def plan_for(
    spec: Spec,
    next_at: datetime,
    now: datetime,
    tz: tzinfo,
    name: str,
    *,
    catch_up: str = DEFAULT_CATCH_UP,
    cap: int = DEFAULT_CATCH_UP_CAP,
) -> Plan:
    """``plan`` for the schedule called ``name``: schedules whose expression has no
    hashed field share one cached plan."""
    hashed = isinstance(spec, Cron) and any(c in spec.expression.upper() for c in "HR")
    return plan(spec, next_at, now, tz, name if hashed else "", catch_up=catch_up, cap=cap)


def _due(
    spec: Spec, next_at: datetime, now: datetime, tz: tzinfo, hash_id: str
) -> tuple[list[datetime], int]:
    """The due occurrences ``[next_at, now]`` in order, at most ``ENUMERATION_LIMIT`` of
    the latest, and how many older ones were left out (estimated for cron)."""
    if isinstance(spec, Every):
        step = spec.total_seconds
        behind = int((now - next_at).total_seconds()) // step  # due after next_at
        dropped = max(behind + 1 - ENUMERATION_LIMIT, 0)
        first = next_at + timedelta(seconds=dropped * step)
        return [first + timedelta(seconds=i * step) for i in range(behind + 1 - dropped)], dropped
    # Cron: walk back from now (a long outage costs at most the limit's steps).
    wall = now.astimezone(tz).replace(tzinfo=None, microsecond=0, fold=0)
    it = _croniter()(spec.expression, wall + timedelta(seconds=1), hash_id=hash_id.encode())
    found: set[datetime] = set()
    while len(found) < ENUMERATION_LIMIT:
        instant = wall_to_utc(it.get_prev(datetime), tz)
        if instant < next_at:
            return sorted(found), 0
        if instant <= now:
            found.add(instant)
    recent = sorted(found)
    return recent, _estimate_between(spec, next_at, recent[0], tz, hash_id)


def _estimate_between(spec: Spec, start: datetime, end: datetime, tz: tzinfo, hash_id: str) -> int:
    """About how many occurrences lie in ``[start, end)`` (one step's length apart)."""
    step = next_after(spec, start, tz, hash_id) - start
    return max(int((end - start) / step), 1) if step else 1


def resume_at(spec: Spec, now: datetime, tz: tzinfo, hash_id: str) -> datetime:
    """Where a resumed (or new) schedule continues: the first occurrence after ``now``;
    the time it was paused is not missed."""
    return next_after(spec, now, tz, hash_id)


def overlap_skips(policy: str, previous_status: str | None) -> bool:
    """Whether an occurrence is skipped because the schedule's previous run is busy."""
    if policy not in OVERLAP_POLICIES:
        raise InvalidSchedule(f"overlap must be one of {OVERLAP_POLICIES}, got {policy!r}.")
    return policy == "skip" and previous_status in BUSY_STATUSES
