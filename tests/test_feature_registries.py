"""Registries open to features (issue 16, item 6): a feature registers the event names it
emits and the counters it wants, with label dimensions of its own, without an engine
edit or a migration; the registries are objects with an explicit reset.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_tasks_plus import events, metrics, registries
from django_tasks_plus.metrics.catalog import ALL_TIME, feature_counters, split_stored_name
from django_tasks_plus.metrics.prometheus import render
from django_tasks_plus.models import MetricRecord

pytestmark = pytest.mark.django_db(transaction=True)

FIRED = "test_schedule.fired"


@pytest.fixture
def feature() -> Iterator[None]:
    """A test-only feature's events and counter, gone again afterwards."""
    yield
    registries.reset()


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
    events.bus().reset()
    assert not events.listened(FIRED)
    assert FIRED not in events.bus().names and events.TASK_STARTED in events.bus().names


def test_the_registries_belong_to_the_installed_app(feature):
    config = apps.get_app_config("django_tasks_plus")
    assert events.bus() is config.event_bus
    assert metrics.aggregator() is config.aggregator
    assert feature_counters() is config.feature_counters
    seen: list[events.Event] = []
    events.register_names(FIRED)
    events.subscribe(seen.append, FIRED)
    # The app installed anew (a test's override) comes with registries of its own: the
    # app's features' names, not what this process registered meanwhile.
    with override_settings(INSTALLED_APPS=list(settings.INSTALLED_APPS)):
        assert events.bus() is not config.event_bus
        assert "schedule.fired" in events.bus().names and FIRED not in events.bus().names
    # Without the app nothing is emitted and nothing can subscribe.
    without = [name for name in settings.INSTALLED_APPS if name != "django_tasks_plus"]
    with override_settings(INSTALLED_APPS=without):
        events.emit(FIRED, {}, {"n": 0})
        assert not events.listened(FIRED)
        with pytest.raises(ImproperlyConfigured, match="INSTALLED_APPS"):
            events.subscribe(seen.append, FIRED)
    events.emit(FIRED, {}, {"n": 1})  # the app's own registries are back
    assert [event.labels for event in seen] == [{"n": 1}]


def test_reset_drops_what_was_counted_and_keeps_the_app_subscribed(feature):
    counting = metrics.aggregator()
    events.emit(events.TASK_ENQUEUED, {"count": 3}, {"backend": "default", "queue": "q"})
    counting.unsettled["default"] = {"a-flush-key": {}}
    registries.reset()
    assert counting.take() == {} and counting.unsettled == {}
    events.emit(events.TASK_ENQUEUED, {"count": 2}, {"backend": "default", "queue": "q"})
    assert [values[0] for values in counting.take().values()] == [2]  # still counting


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
