"""The overview's chart ranges: which window a range covers, how wide its bars are, and
how per-minute and hourly points add up into those bars.

A range's bars start on multiples of their width (UTC), so the same range drawn a minute
later shifts by whole bars and a bar of an hour or more holds whole hourly rows. Where a
window reaches back past the minutes kept (``METRICS["RETENTION_DAYS"]``: older minutes
are hourly rows), its bars are at least an hour wide: an hour's total cannot be split.
Pure: no Django, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOUR = 3600
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class UnknownRange(ValueError):
    """A ``?range=`` the charts do not offer; the message names the ones they do."""


@dataclass(frozen=True, slots=True)
class ChartRange:
    """One choice of the range selector: ``key`` is its query value (``?range=6h``),
    ``span`` how far back it reaches, ``step`` its bars' width in seconds."""

    key: str
    label: str
    span: timedelta
    step: int

    @property
    def bars(self) -> int:
        return int(self.span.total_seconds()) // self.step


RANGES: dict[str, ChartRange] = {
    r.key: r
    for r in (
        ChartRange("1h", "last hour", timedelta(hours=1), 60),
        ChartRange("6h", "last 6 hours", timedelta(hours=6), 5 * 60),
        ChartRange("1d", "last day", timedelta(days=1), 20 * 60),
        ChartRange("7d", "last week", timedelta(days=7), 2 * HOUR),
    )
}
DEFAULT = RANGES["1h"]


def parse_range(value: str | None) -> ChartRange:
    """The range a query value names; empty or missing: the default (the last hour)."""
    if not value:
        return DEFAULT
    found = RANGES.get(value)
    if found is None:
        raise UnknownRange(
            f"There is no chart range {value[:20]!r}; choose one of: {', '.join(RANGES)}."
        )
    return found


@dataclass(frozen=True, slots=True)
class Window:
    """The bars of one chart: ``count`` bars of ``step`` seconds from ``start``; the last
    one holds ``now`` (it is partial)."""

    start: datetime
    step: int
    count: int

    def starts(self) -> list[datetime]:
        return [self.start + timedelta(seconds=i * self.step) for i in range(self.count)]


def floor_to(moment: datetime, step: int) -> datetime:
    """The start of the ``step``-second slot (counted from the epoch, UTC) holding
    ``moment``."""
    seconds = int((moment - _EPOCH).total_seconds())
    return _EPOCH + timedelta(seconds=seconds - seconds % step)


def window(chosen: ChartRange, now: datetime, minutes_since: datetime | None = None) -> Window:
    """The bars of ``chosen`` ending with the one holding ``now``. ``minutes_since``:
    the oldest minute still kept per minute; a window starting before it gets bars of at
    least an hour (and as many as fit the range)."""
    step = chosen.step
    count = chosen.bars
    start = floor_to(now, step) - timedelta(seconds=(count - 1) * step)
    if minutes_since is not None and start < minutes_since and step < HOUR:
        step = HOUR * -(-step // HOUR)
        count = max(1, int(chosen.span.total_seconds()) // step)
        start = floor_to(now, step) - timedelta(seconds=(count - 1) * step)
    return Window(start, step, count)


def add_up(points: Iterable[tuple[datetime, int]], bars: Window) -> list[int]:
    """Each point (a minute's or an hour's start, its count) added to the bar holding
    its start; points outside the window are left out."""
    totals = [0] * bars.count
    for at, value in points:
        index = int((at - bars.start).total_seconds() // bars.step)
        if 0 <= index < bars.count:
            totals[index] += value
    return totals


__all__ = [
    "DEFAULT",
    "RANGES",
    "ChartRange",
    "UnknownRange",
    "Window",
    "add_up",
    "floor_to",
    "parse_range",
    "window",
]
