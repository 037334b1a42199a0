"""A schedule's timing in words, for people: ``"*/5 * * * *"`` is "every 5 minutes",
``"30 8 * * 1-5"`` "at 08:30 on weekdays", ``Every(seconds=90)`` "every 90 seconds".

Only the common forms are put in words: a star, one number, a step of a star (``*/5``),
a list or a range of numbers, croniter's ``@daily``-style aliases, and a sixth field of
seconds. Anything else (hashed ``H`` fields, ``L``, ``#``, steps of ranges, names) is
shown as written, never guessed at. Pure: no Django, no I/O.
"""

from __future__ import annotations

import re

from .timing import Every, Spec

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_NUMBER = re.compile(r"\d{1,2}")
_STEP = re.compile(r"\*/(\d{1,2})")
_RANGE = re.compile(r"(\d{1,2})-(\d{1,2})")


class _Unsaid(Exception):
    """A form this module does not put in words: the expression is shown as written."""


def describe(spec: Spec) -> str:
    """``spec`` in words, or the cron expression as written when it is not a common form."""
    if isinstance(spec, Every):
        return describe_every(spec.total_seconds)
    try:
        return describe_cron(spec.expression)
    except _Unsaid:
        return spec.expression


def describe_every(seconds: int) -> str:
    for size, unit in ((3600, "hour"), (60, "minute"), (1, "second")):
        if seconds % size == 0:
            count = seconds // size
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    raise AssertionError("unreachable: every whole number of seconds divides by 1")


def describe_cron(expression: str) -> str:
    """The words for a five- or six-field expression (seconds last, as croniter reads
    them); ``_Unsaid`` for a form left as written."""
    fields = ALIASES.get(expression.strip().lower(), expression).split()
    if len(fields) == 6:
        second = fields.pop()
    elif len(fields) == 5:
        second = "0"
    else:
        raise _Unsaid
    minute, hour, day, month, weekday = fields
    if second != "0":
        if fields != ["*"] * 5:
            raise _Unsaid
        return _every(second, "second", 59)
    when = _time_of_day(minute, hour)
    days = _days(day, month, weekday)
    if days == "every day" and when.startswith("every"):
        return when  # "every 5 minutes", not "every 5 minutes every day"
    return f"{when} {days}"


def _time_of_day(minute: str, hour: str) -> str:
    if hour == "*":
        if minute == "*":
            return "every minute"
        if _STEP.fullmatch(minute):
            return _every(minute, "minute", 59)
        return f"every hour at minute {_numbers(minute, 59)}"
    if not _NUMBER.fullmatch(minute) or int(minute) > 59:
        raise _Unsaid
    if _STEP.fullmatch(hour):
        return f"{_every(hour, 'hour', 23)} at minute {int(minute)}"
    hours = _values(hour, 23)
    return "at " + _join([f"{h:02d}:{int(minute):02d}" for h in hours])


def _days(day: str, month: str, weekday: str) -> str:
    if day == "*" and month == "*":
        if weekday == "*":
            return "every day"
        values = _values(weekday, 7)
        if sorted(set(values)) == [1, 2, 3, 4, 5]:
            return "on weekdays"
        if sorted({v % 7 for v in values}) == [0, 6]:
            return "at weekends"
        return "on " + _join([DAYS[v % 7] for v in values])
    if weekday != "*":
        raise _Unsaid  # cron ORs day of month and day of week: too easy to misread
    days = _values(day, 31, low=1)
    if month == "*":
        return "on day " + _join([str(d) for d in days]) + " of every month"
    months = _values(month, 12, low=1)
    if len(months) == 1:
        return "every year on " + _join([f"{d} {MONTHS[months[0] - 1]}" for d in days])
    return (
        "on day " + _join([str(d) for d in days]) + " of " + _join([MONTHS[m - 1] for m in months])
    )


def _every(field: str, unit: str, highest: int) -> str:
    if field == "*":
        return f"every {unit}"
    found = _STEP.fullmatch(field)
    if found is None or not 1 <= int(found.group(1)) <= highest:
        raise _Unsaid
    step = int(found.group(1))
    return f"every {unit}" if step == 1 else f"every {step} {unit}s"


def _numbers(field: str, highest: int) -> str:
    return _join([str(v) for v in _values(field, highest)])


def _values(field: str, highest: int, *, low: int = 0) -> list[int]:
    """The numbers a list of numbers and ranges names, in the written order."""
    values: list[int] = []
    for part in field.split(","):
        single, span = _NUMBER.fullmatch(part), _RANGE.fullmatch(part)
        if single:
            values.append(int(part))
        elif span and int(span.group(1)) <= int(span.group(2)):
            values += range(int(span.group(1)), int(span.group(2)) + 1)
        else:
            raise _Unsaid
    if not values or any(not low <= v <= highest for v in values):
        raise _Unsaid
    return values


def _join(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]
