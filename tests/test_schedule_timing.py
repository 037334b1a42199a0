"""Pure tests of the schedules' timing and policies (schedules/timing.py): the clock is
an argument, nothing waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_tasks_plus.schedules.errors import InvalidSchedule
from django_tasks_plus.schedules.timing import (
    Cron,
    Every,
    as_spec,
    next_after,
    occurrences,
    overlap_skips,
    plan,
    resume_at,
    zone,
)
from django_tasks_plus.schedules.words import describe

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def fires(expression: str, start: datetime, end: datetime, tz=BERLIN) -> list[datetime]:
    return list(occurrences(Cron(expression), start, end, tz, "test"))


# Europe/Berlin: CET (+01:00) until 2026-03-29 01:00 UTC, when clocks jump from 02:00 to
# 03:00 CEST (+02:00); back on 2026-10-25 at 01:00 UTC, from 03:00 CEST to 02:00 CET.
# The expected instants below are worked out from those two facts.


def test_spring_forward_a_nonexistent_wall_time_fires_once_right_after_the_gap():
    span = (utc(2026, 3, 27, 12), utc(2026, 3, 30, 12))
    # 02:00 on the 29th does not exist: it fires at 03:00 CEST = 01:00 UTC.
    assert fires("0 2 * * *", *span) == [
        utc(2026, 3, 28, 1, 0),  # 02:00 CET
        utc(2026, 3, 29, 1, 0),  # after the gap
        utc(2026, 3, 30, 0, 0),  # 02:00 CEST
    ]
    assert fires("30 2 * * *", *span) == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist either: the same first instant
        utc(2026, 3, 30, 0, 30),
    ]


def test_fall_back_a_repeated_wall_time_fires_once_at_its_first_occurrence():
    span = (utc(2026, 10, 23, 12), utc(2026, 10, 26, 12))
    # 02:00 on the 25th happens at 00:00 UTC (CEST) and again at 01:00 UTC (CET).
    assert fires("0 2 * * *", *span) == [
        utc(2026, 10, 24, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 0),  # the first 02:00 only
        utc(2026, 10, 26, 1, 0),  # 02:00 CET
    ]
    assert fires("30 2 * * *", *span) == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]


def test_starting_inside_the_repeated_hour_does_not_fire_its_first_pass_again():
    # 01:30 UTC is the second 02:30 (CET): 02:45 fired already, in the first pass (at
    # 00:45 UTC), so the next is 03:00 CET = 02:00 UTC.
    assert next_after(Cron("*/15 * * * *"), utc(2026, 10, 25, 1, 30), BERLIN, "x") == utc(
        2026, 10, 25, 2, 0
    )
    assert next_after(Cron("0 2 * * *"), utc(2026, 10, 25, 0, 0), BERLIN, "x") == utc(
        2026, 10, 26, 1, 0
    )


def test_every_is_anchored_at_the_epoch_whatever_the_start():
    spec = Every(seconds=30)
    assert next_after(spec, utc(2026, 1, 1, 10, 0, 7), UTC, "a") == utc(2026, 1, 1, 10, 0, 30)
    assert next_after(spec, utc(2026, 1, 1, 10, 0, 30), UTC, "a") == utc(2026, 1, 1, 10, 1, 0)
    ninety = Every(seconds=90)
    # 2026-01-01 00:00 UTC is 1767225600 s after the epoch, a multiple of 90 s.
    assert next_after(ninety, utc(2026, 1, 1, 0, 0, 1), UTC, "a") == utc(2026, 1, 1, 0, 1, 30)
    assert Every(minutes=1, seconds=30).total_seconds == 90


def test_a_cron_with_seconds_fires_each_matching_second():
    got = list(
        occurrences(Cron("* * * * * */20"), utc(2026, 1, 1), utc(2026, 1, 1, 0, 1), UTC, "s")
    )
    assert got == [utc(2026, 1, 1, 0, 0, 20), utc(2026, 1, 1, 0, 0, 40), utc(2026, 1, 1, 0, 1)]


def test_hashed_expressions_depend_on_the_schedule_name_and_are_stable():
    start = utc(2026, 1, 1)
    first = next_after(Cron("H * * * *"), start, UTC, "reports.nightly")
    assert first == next_after(Cron("H * * * *"), start, UTC, "reports.nightly")
    minutes = {next_after(Cron("H * * * *"), start, UTC, f"s{i}").minute for i in range(40)}
    assert len(minutes) > 10  # spread over the hour


def test_bad_definitions_are_typed_errors_naming_the_schedule():
    with pytest.raises(InvalidSchedule, match=r"'nightly'.*not a valid cron"):
        as_spec("61 * * * *", "nightly")
    with pytest.raises(InvalidSchedule, match=r"'nightly'.*at least one second"):
        as_spec(Every(seconds=0), "nightly")
    with pytest.raises(InvalidSchedule, match=r"'nightly'.*unknown time zone"):
        zone("Mars/Olympus", "nightly")
    with pytest.raises(InvalidSchedule, match="'nightly'"):
        as_spec(42, "nightly")


NOW = utc(2026, 5, 1, 12, 0, 0)
MINUTELY = Cron("* * * * *")


def test_an_on_time_occurrence_fires_under_every_policy():
    for policy in ("none", "latest", "all"):
        got = plan(MINUTELY, NOW, NOW + timedelta(seconds=1), UTC, "p", catch_up=policy)
        assert got.fire == (NOW,) and got.missed == 0
        assert got.next_at == NOW + timedelta(minutes=1)


def test_nothing_due_fires_nothing():
    got = plan(MINUTELY, NOW, NOW - timedelta(seconds=5), UTC, "p")
    assert got.fire == () and got.next_at == NOW


def test_catch_up_after_an_outage_follows_the_policy():
    # The scheduler last waited for 11:00; it is back at 12:00:10: 61 occurrences due,
    # of which 12:00 is on time and the 60 before it were missed.
    waited, now = utc(2026, 5, 1, 11, 0), NOW + timedelta(seconds=10)
    none = plan(MINUTELY, waited, now, UTC, "p", catch_up="none")
    assert none.fire == (NOW,) and none.missed == 60
    latest = plan(MINUTELY, waited, now + timedelta(seconds=40), UTC, "p", catch_up="latest")
    assert latest.fire == (NOW,) and latest.missed == 60  # 12:00 is 50 s late: the latest
    everything = plan(MINUTELY, waited, now, UTC, "p", catch_up="all")
    assert everything.fire == tuple(NOW - timedelta(minutes=m) for m in range(10, -1, -1))
    assert everything.missed == 50
    capped = plan(MINUTELY, waited, now, UTC, "p", catch_up="all", cap=3)
    assert len(capped.fire) == 4 and capped.missed == 57
    assert all(p.next_at == NOW + timedelta(minutes=1) for p in (none, everything, capped))


def test_a_very_long_outage_is_bounded_work():
    got = plan(Every(seconds=1), NOW - timedelta(days=30), NOW, UTC, "p", catch_up="none")
    assert got.fire == tuple(NOW - timedelta(seconds=s) for s in range(30, -1, -1))
    assert got.missed + len(got.fire) == 30 * 86400 + 1


def test_resume_continues_with_the_next_occurrence_the_pause_is_not_missed():
    assert resume_at(MINUTELY, NOW + timedelta(seconds=1), UTC, "p") == NOW + timedelta(minutes=1)


def test_overlap_policy_skips_only_while_the_previous_run_is_busy():
    assert overlap_skips("skip", "READY") and overlap_skips("skip", "RUNNING")
    assert not overlap_skips("skip", "SUCCESSFUL") and not overlap_skips("skip", None)
    assert not overlap_skips("allow", "RUNNING")
    with pytest.raises(InvalidSchedule):
        overlap_skips("sometimes", None)


# -- in words (schedules/words.py) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/5 * * * *", "every 5 minutes"),
        ("15 * * * *", "every hour at minute 15"),
        ("0,30 * * * *", "every hour at minute 0 and 30"),
        ("0 3 * * *", "at 03:00 every day"),
        ("30 8 * * 1-5", "at 08:30 on weekdays"),
        ("0 9 * * 0,6", "at 09:00 at weekends"),
        ("0 18 * * 1,3", "at 18:00 on Monday and Wednesday"),
        ("0 8,12,17 * * *", "at 08:00, 12:00 and 17:00 every day"),
        ("5 */2 * * *", "every 2 hours at minute 5"),
        ("*/15 9-17 * * 1-5", "*/15 9-17 * * 1-5"),
        ("0 0 1 * *", "at 00:00 on day 1 of every month"),
        ("0 6 1 1 *", "at 06:00 every year on 1 January"),
        ("0 6 1 1,7 *", "at 06:00 on day 1 of January and July"),
        ("@daily", "at 00:00 every day"),
        ("@hourly", "every hour at minute 0"),
        ("* * * * * */10", "every 10 seconds"),
        ("* * * * * *", "every second"),
        # Not a common form: shown as written, never guessed at.
        ("H 4 * * *", "H 4 * * *"),
        ("0 0 L * *", "0 0 L * *"),
        ("0 0 1 * 1", "0 0 1 * 1"),  # day of month OR Monday
        ("1-30/2 * * * *", "1-30/2 * * * *"),
        ("0 12 * JAN *", "0 12 * JAN *"),
        ("0 12 * * * 30", "0 12 * * * 30"),
    ],
)
def test_common_cron_forms_read_in_words_the_rest_as_written(expression, words):
    assert describe(Cron(expression)) == words


@pytest.mark.parametrize(
    ("every", "words"),
    [
        (Every(seconds=1), "every second"),
        (Every(seconds=30), "every 30 seconds"),
        (Every(seconds=90), "every 90 seconds"),
        (Every(minutes=5), "every 5 minutes"),
        (Every(hours=1), "every hour"),
        (Every(hours=1, minutes=30), "every 90 minutes"),
        (Every(hours=24), "every 24 hours"),
    ],
)
def test_intervals_read_in_words(every, words):
    assert describe(every) == words
