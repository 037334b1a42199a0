"""The overview's SVG charts (charts.py): tick choice, scaling, empty and extreme data,
escaping. The markup is parsed as XML, so every chart is well-formed SVG."""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_tasks_plus import charts

SVG = "{http://www.w3.org/2000/svg}"


def chart(labels, *series, **extra) -> ET.Element:
    markup = charts.bar_chart(
        chart_id=extra.pop("chart_id", "c1"),
        title=extra.pop("title", "Attempts per minute"),
        description=extra.pop("description", "A test chart."),
        labels=labels,
        series=list(series),
        unit=extra.pop("unit", "attempts / minute"),
        **extra,
    )
    return ET.fromstring(markup)


def bars(root: ET.Element, kind: str) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") == f"dtp-chart-{kind}"]


def texts(root: ET.Element, cls: str) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text") if t.get("class") == cls]


@pytest.mark.parametrize(
    ("maximum", "expected"),
    [
        (0, [0, 1]),
        (-5, [0, 1]),
        (math.nan, [0, 1]),
        (math.inf, [0, 1]),
        (1, [0, 1]),
        (3, [0, 1, 2, 3]),
        (7, [0, 2, 4, 6, 8]),
        (10, [0, 2, 4, 6, 8, 10]),
        (12, [0, 5, 10, 15]),
        (99, [0, 20, 40, 60, 80, 100]),
        (1234, [0, 500, 1000, 1500]),
    ],
)
def test_ticks_are_round_and_cover_the_maximum(maximum, expected):
    assert charts.ticks(maximum, integer=True) == expected


def test_counts_never_get_fractional_ticks_but_seconds_do():
    assert charts.ticks(2, integer=True) == [0, 1, 2]
    assert charts.ticks(0.3) == pytest.approx([0, 0.1, 0.2, 0.3])
    assert charts.ticks(0.0004) == pytest.approx([0, 0.0001, 0.0002, 0.0003, 0.0004])


@given(st.floats(min_value=1e-6, max_value=1e15, allow_nan=False))
def test_ticks_start_at_zero_end_at_or_above_the_maximum_and_stay_few(maximum):
    found = charts.ticks(maximum, integer=maximum >= 1)
    assert found[0] == 0
    assert found[-1] >= maximum * (1 - 1e-9)
    assert 2 <= len(found) <= 7
    steps = {round(b - a, 12) for a, b in itertools.pairwise(found)}
    assert len({round(s / max(steps), 6) for s in steps}) == 1  # evenly spaced
    mantissa = max(steps) / 10 ** math.floor(math.log10(max(steps)))
    assert round(mantissa, 6) in (1, 2, 5)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (0.5, "0.5"),
        (0.25, "0.25"),
        (12, "12"),
        (150, "150"),
        (1500, "1.5k"),
        (20_000_000, "20M"),
        (3e9, "3G"),
        (4.5e13, "45T"),
    ],
)
def test_compact_labels(value, text):
    assert charts.compact(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.001, "1ms"), (0.0025, "2.5ms"), (0.5, "500ms"), (1, "1s"), (2.5, "2.5s"),
     (60, "1min"), (900, "15min"), (3600, "1h"), (math.inf, "+Inf")],
)  # fmt: skip
def test_duration_labels(seconds, text):
    assert charts.duration_label(seconds) == text


def test_bars_scale_to_the_top_tick_and_stack():
    root = chart(
        ["a", "b", "c"],
        charts.Series("succeeded", [10, 5, 0], "ok"),
        charts.Series("failed", [0, 5, 2], "failed"),
    )
    ok = bars(root, "ok")
    failed = bars(root, "failed")
    assert len(ok) == 2 and len(failed) == 2  # zero values draw no bar
    plot_h = charts.HEIGHT - charts.TOP - charts.BOTTOM
    # Top tick for 10 is 10: the full bar is the plot's height, half is half.
    assert float(ok[0].get("height")) == pytest.approx(plot_h, abs=0.1)
    assert float(ok[1].get("height")) == pytest.approx(plot_h / 2, abs=0.1)
    # The failed part of "b" sits on top of its succeeded part.
    assert float(failed[0].get("y")) + float(failed[0].get("height")) == pytest.approx(
        float(ok[1].get("y")), abs=0.2
    )
    assert texts(root, "dtp-chart-tick")[:6] == ["0", "2", "4", "6", "8", "10"]
    assert texts(root, "dtp-chart-unit") == ["attempts / minute"]
    assert texts(root, "dtp-chart-legend") == ["succeeded", "failed"]


def test_each_bar_has_a_tooltip_with_its_values_and_unit():
    root = chart(["14:05"], charts.Series("succeeded", [3], "ok"), charts.Series("failed", [1]))
    tips = [g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g")]
    assert tips == ["14:05: succeeded 3, failed 1 (attempts / minute)"]


def test_accessible_name_and_description():
    root = chart(["a"], charts.Series("s", [1]), chart_id="dtp-chart-hour")
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "dtp-chart-hour-title dtp-chart-hour-desc"
    assert root.find(f"{SVG}title").get("id") == "dtp-chart-hour-title"
    assert root.find(f"{SVG}title").text == "Attempts per minute"
    assert root.find(f"{SVG}desc").text == "A test chart."


def test_empty_data_says_so_with_a_unit_axis():
    root = chart(["a", "b"], charts.Series("s", [0, 0]))
    assert texts(root, "dtp-chart-empty") == ["No data in this window"]
    assert texts(root, "dtp-chart-tick")[:2] == ["0", "1"]
    assert bars(root, "primary") == []
    no_labels = chart([], charts.Series("s", []))
    assert texts(no_labels, "dtp-chart-empty") == ["No data in this window"]


def test_one_point_is_one_bar_of_bounded_width():
    root = chart(["only"], charts.Series("s", [7], "ok"))
    (bar,) = bars(root, "ok")
    assert 0 < float(bar.get("width")) <= 48
    assert texts(root, "dtp-chart-empty") == []


def test_huge_and_hostile_values():
    root = chart(
        ["a", "b", "c", "d"],
        charts.Series("s", [10**15, -3, math.nan, math.inf], "ok"),
    )
    ok = bars(root, "ok")
    assert len(ok) == 1  # negative, NaN and infinite count as 0
    assert "1000T" in texts(root, "dtp-chart-tick")
    for rect in root.iter(f"{SVG}rect"):
        for attr in ("x", "y", "width", "height"):
            assert re.fullmatch(r"-?\d+(\.\d)?", rect.get(attr)), rect.attrib


def test_labels_titles_and_units_are_escaped():
    hostile = '<script>alert("x")</script>&'
    markup = charts.bar_chart(
        chart_id='c"1',
        title=hostile,
        description=hostile,
        labels=[hostile],
        series=[charts.Series(hostile, [1], 'ok" onload="x')],
        unit=hostile,
    )
    assert "<script>" not in markup
    assert 'onload="x"' not in markup
    root = ET.fromstring(markup)  # still well-formed
    assert root.find(f"{SVG}title").text == hostile


def test_x_labels_thin_out_so_they_do_not_overlap():
    labels = [f"{h:02d}:{m:02d}" for h in range(1) for m in range(61)]
    root = chart(labels, charts.Series("s", [1] * 61))
    shown = [t for t in texts(root, "dtp-chart-tick") if ":" in t]
    assert 5 <= len(shown) <= 15
    assert shown[:3] == ["00:00", "00:05", "00:10"]
    assert charts.label_stride(["a"] * 5, 650) == 1
    assert charts.label_stride([], 650) == 1


def test_mismatched_series_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="Series 's' has 1 values for 2 labels"):
        charts.bar_chart(
            chart_id="c",
            title="t",
            description="d",
            labels=["a", "b"],
            series=[charts.Series("s", [1])],
            unit="u",
        )
