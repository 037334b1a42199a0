"""The charts' ranges (``metrics/ranges.py``) and the overview's reading of its query
string (``admin/overview_charts.chart_options``): pure, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_tasks_plus.admin.overview_charts import chart_options, step_words
from django_tasks_plus.metrics.ranges import (
    DEFAULT,
    RANGES,
    UnknownRange,
    Window,
    add_up,
    floor_to,
    parse_range,
    window,
)

NOW = datetime(2026, 12, 3, 7, 43, 21, 500, tzinfo=UTC)


def test_the_ranges_and_their_bars():
    assert {key: (r.span, r.step, r.bars) for key, r in RANGES.items()} == {
        "1h": (timedelta(hours=1), 60, 60),
        "6h": (timedelta(hours=6), 300, 72),
        "1d": (timedelta(days=1), 1200, 72),
        "7d": (timedelta(days=7), 7200, 84),
    }


def test_parse_range_defaults_to_the_last_hour_and_names_the_choices():
    assert parse_range(None) is parse_range("") is DEFAULT is RANGES["1h"]
    assert parse_range("7d") is RANGES["7d"]
    with pytest.raises(UnknownRange, match=r"no chart range '1y'; choose one of: 1h, 6h, 1d, 7d"):
        parse_range("1y")
    with pytest.raises(UnknownRange, match=r"'xxxxxxxxxxxxxxxxxxxx'"):  # long values cut
        parse_range("x" * 5000)


@pytest.mark.parametrize("key", list(RANGES))
def test_a_window_s_bars_start_on_multiples_of_their_width_and_end_with_now(key: str):
    chosen = RANGES[key]
    bars = window(chosen, NOW)
    assert (bars.step, bars.count) == (chosen.step, chosen.bars)
    assert bars.start == floor_to(bars.start, bars.step)
    last = bars.starts()[-1]
    assert last <= NOW < last + timedelta(seconds=bars.step)
    assert NOW - bars.start <= chosen.span


def test_floor_to_counts_slots_from_the_epoch():
    assert floor_to(NOW, 60) == datetime(2026, 12, 3, 7, 43, tzinfo=UTC)
    assert floor_to(NOW, 1200) == datetime(2026, 12, 3, 7, 40, tzinfo=UTC)
    assert floor_to(NOW, 7200) == datetime(2026, 12, 3, 6, 0, tzinfo=UTC)


def test_a_window_reaching_past_the_minutes_kept_gets_hour_wide_bars():
    # Minutes kept for 12 hours: the day's 20-minute bars become 24 hourly ones.
    bars = window(RANGES["1d"], NOW, minutes_since=NOW - timedelta(hours=12))
    assert (bars.step, bars.count) == (3600, 24)
    assert bars.start == datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    # Within the minutes kept, and bars already an hour or wider: unchanged.
    assert window(RANGES["6h"], NOW, NOW - timedelta(days=1)).step == 300
    assert window(RANGES["7d"], NOW, NOW - timedelta(days=1)).step == 7200


def test_add_up_puts_minutes_and_hours_in_the_bar_holding_their_start():
    bars = Window(datetime(2026, 12, 3, 0, 0, tzinfo=UTC), 7200, 3)
    points = [
        (datetime(2026, 12, 2, 23, 0, tzinfo=UTC), 100),  # before the window: left out
        (datetime(2026, 12, 3, 0, 0, tzinfo=UTC), 1),  # an hourly row
        (datetime(2026, 12, 3, 1, 0, tzinfo=UTC), 2),  # another, same bar
        (datetime(2026, 12, 3, 3, 59, tzinfo=UTC), 4),  # a minute
        (datetime(2026, 12, 3, 4, 0, tzinfo=UTC), 8),
        (datetime(2026, 12, 3, 6, 0, tzinfo=UTC), 100),  # after: left out
    ]
    assert add_up(points, bars) == [3, 4, 8]
    assert bars.starts()[1] == datetime(2026, 12, 3, 2, 0, tzinfo=UTC)


def test_step_words():
    assert [step_words(s) for s in (60, 300, 1200, 3600, 7200)] == [
        "minute",
        "5 minutes",
        "20 minutes",
        "hour",
        "2 hours",
    ]


def test_chart_options_keep_good_values_and_name_bad_ones():
    good = chart_options({"range": "6h", "queue": "emails", "task": "app.tasks.send"})
    assert (good.range.key, good.queue, good.task_path, good.problems) == (
        "6h",
        "emails",
        "app.tasks.send",
        (),
    )
    bad = chart_options({"range": "1y", "queue": "q" * 101, "task": "a\x00b"})
    assert (bad.range, bad.queue, bad.task_path) == (DEFAULT, "", "")
    assert len(bad.problems) == 3
    assert (
        "no chart range '1y'; choose one of: 1h, 6h, 1d, 7d. Showing the last hour."
        in (bad.problems[0])
    )
    assert "queue name" in bad.problems[1] and "at most 100 characters" in bad.problems[1]
    assert "task path" in bad.problems[2] and "control characters" in bad.problems[2]
