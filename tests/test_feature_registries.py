"""Registries open to features (issue 16, item 6): a feature registers the event names it
emits and the counters it wants, with label dimensions of its own, without an engine
edit or a migration; the registries are objects with an explicit reset.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_tasks_plus import events, metrics
from django_tasks_plus.metrics.aggregate import AGGREGATOR
from django_tasks_plus.metrics.catalog import ALL_TIME, feature_counters, split_stored_name
from django_tasks_plus.metrics.prometheus import render
from django_tasks_plus.models import MetricRecord

pytestmark = pytest.mark.django_db(transaction=True)

FIRED = "test_schedule.fired"


@pytest.fixture
def feature() -> Iterator[None]:
    """A test-only feature's events and counter, gone again afterwards."""
    AGGREGATOR.take()
    yield
    AGGREGATOR.take()
    feature_counters.reset()
    events.bus.reset()  # also drops the aggregator's subscriptions...
    metrics.install()  # ...which the app subscribes again


def test_an_unknown_event_name_is_refused_until_a_feature_registers_it(feature):
    seen: list[events.Event] = []
    with pytest.raises(ValueError, match="Unknown event name"):
        events.subscribe(seen.append, FIRED)
    events.register_names(FIRED)
    with events.subscribed(seen.append, FIRED):
        events.emit(FIRED, {}, {"schedule": "nightly"})
    assert [event.labels["schedule"] for event in seen] == ["nightly"]
    with pytest.raises(ValueError, match="lowercase words joined by"):
        events.register_names("Not A Name")


def test_reset_forgets_the_features_names_and_every_subscriber(feature):
    events.register_names(FIRED)
    events.subscribe(print, FIRED)
    events.bus.reset()
    assert not events.listened(FIRED)
    assert FIRED not in events.bus.names and events.TASK_STARTED in events.bus.names


def test_a_feature_counter_with_its_own_label_is_stored_and_served(feature):
    events.register_names(FIRED)
    metrics.register_counter(
        "test_schedule_fired", FIRED, help="Occurrences fired.", labels=("schedule",)
    )
    for schedule, count in (("nightly", 1), ("nightly", 2), ("hourly", 1)):
        events.emit(FIRED, {"count": count}, {"backend": "default", "schedule": schedule})
    assert metrics.flush() > 0
    rows = MetricRecord.objects.filter(backend_name="default", minute=ALL_TIME)
    stored = {row.name: row.value for row in rows}
    assert stored["test_schedule_fired{schedule=nightly}"] == 3
    assert stored["test_schedule_fired{schedule=hourly}"] == 1
    assert split_stored_name("test_schedule_fired{schedule=nightly}") == (
        "test_schedule_fired",
        {"schedule": "nightly"},
    )
    families = {
        family.name: family
        for family in text_string_to_metric_families(render(["default"]).decode())
    }
    samples = {
        sample.labels["schedule"]: sample.value
        for sample in families["django_tasks_plus_test_schedule_fired"].samples
        if sample.name.endswith("_total")
    }
    assert samples == {"nightly": 3.0, "hourly": 1.0}


def test_a_feature_counter_needs_registered_events_and_a_free_name(feature):
    with pytest.raises(ValueError, match="Unknown event name"):
        metrics.register_counter("test_schedule_fired", FIRED, help="")
    events.register_names(FIRED)
    with pytest.raises(ValueError, match="not a built-in counter's"):
        metrics.register_counter("succeeded", FIRED, help="")
