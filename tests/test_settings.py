"""Bad settings fail at startup with a message that names the key; system checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_tasks_plus import InvalidBackendOptions, exponential_backoff, no_retry
from django_tasks_plus.compat import task_backends
from django_tasks_plus.conf import parse_settings
from django_tasks_plus.db import UnsupportedDatabase, dialect_for

BACKEND = "django_tasks_plus.backend.DatabaseBackend"


def test_defaults():
    settings = parse_settings("default", {"QUEUES": ["default"]})
    assert settings.queues == {"default"}
    assert settings.database == "default"
    assert settings.visibility_timeout == 60.0
    assert settings.concurrency == 8
    assert settings.prefetch is None  # the worker then prefetches as many as CONCURRENCY
    assert settings.notify is True
    assert settings.retry == exponential_backoff()
    assert settings.doer_spec_for("default") == "unlimited"


def test_retry_option_forms():
    assert parse_settings("a", {"OPTIONS": {"RETRY": None}}).retry is no_retry
    dotted = parse_settings("a", {"OPTIONS": {"RETRY": "django_tasks_plus.retry.no_retry"}})
    assert dotted.retry is no_retry
    policy = exponential_backoff(max_attempts=2)
    assert parse_settings("a", {"OPTIONS": {"RETRY": policy}}).retry is policy


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"OPTIONS": {"VISIBILITY_TIMOUT": 5}},
            "unknown key 'VISIBILITY_TIMOUT'.*Did you mean 'VISIBILITY_TIMEOUT'",
        ),
        (
            {"OPTIONS": {"VISIBILITY_TIMEOUT": 0}},
            r"\['VISIBILITY_TIMEOUT'\] must be a positive number",
        ),
        ({"OPTIONS": {"POLL_INTERVAL": "1"}}, r"\['POLL_INTERVAL'\] must be a positive number"),
        (
            {"OPTIONS": {"CONCURRENCY": 0}},
            r"\['CONCURRENCY'\] must be a whole number of at least 1",
        ),
        ({"OPTIONS": {"CONCURRENCY": True}}, r"\['CONCURRENCY'\] must be a whole number"),
        ({"OPTIONS": {"PREFETCH": -1}}, r"\['PREFETCH'\] must be a whole number of at least 0"),
        ({"OPTIONS": {"NOTIFY": "yes"}}, r"\['NOTIFY'\] must be True or False"),
        ({"OPTIONS": {"DATABASE": ""}}, r"\['DATABASE'\] must be a database alias"),
        ({"OPTIONS": {"RETRY": 3}}, r"\['RETRY'\] must be a callable policy"),
        (
            {"OPTIONS": {"RETRY": "no.such.policy"}},
            r"\['RETRY'\] names 'no.such.policy', which cannot be imported",
        ),
        (
            {"OPTIONS": {"DOER": "fastest"}},
            r"\['DOER'\] is not a valid doer: unknown doer 'fastest'",
        ),
        (
            {"OPTIONS": {"QUEUES_CONFIG": {"nope": "age"}}},
            "configures queue 'nope', which is not in QUEUES",
        ),
        (
            {"OPTIONS": {"QUEUES_CONFIG": {"default": {"doer": "age", "limit": 0}}}},
            "is not a valid doer",
        ),
        ({"OPTIONS": ["not", "a", "dict"]}, r"\['OPTIONS'\] must be a dict"),
        ({"OPTIONS": []}, r"\['OPTIONS'\] must be a dict"),
        (
            {"OPTIONS": {"RETRY": "django_tasks_plus.retry.exponential_backoff"}},
            r"\['RETRY'\] must be a callable policy.*Did you mean to call a factory",
        ),
        (
            {"OPTIONS": {"QUEUES_CONFIG": {"default": "fastest"}}},
            r"^TASKS\['default'\]\['OPTIONS'\]\['QUEUES_CONFIG'\]\['default'\] is not a valid doer",
        ),
        ({"QUEUES": "default"}, r"\['QUEUES'\] must be a list of queue names"),
        ({"QUEUES": ["ok", ""]}, "queue names are non-empty strings"),
        ({"QUEUES": ["x" * 101]}, "at most 100 characters"),
        ({"QUEUES": ["*"]}, r"has '\*'; '\*' is not a queue name"),
        (
            {"QUEUES": [], "OPTIONS": {"QUEUES_CONFIG": {"x" * 101: "age"}}},
            r"\['QUEUES_CONFIG'\] has 'x+'; queue names are non-empty strings",
        ),
    ],
)
def test_bad_settings_name_the_key(params, message):
    with pytest.raises(InvalidBackendOptions, match=message):
        parse_settings("default", params)


def test_bad_options_fail_when_the_backend_is_created():
    tasks_setting = {"default": {"BACKEND": BACKEND, "OPTIONS": {"CONCURENCY": 4}}}
    with (
        override_settings(TASKS=tasks_setting),
        pytest.raises(InvalidBackendOptions, match="unknown key 'CONCURENCY'"),
    ):
        task_backends["default"]  # creating the backend is what fails


@pytest.mark.django_db
def test_checks_pass_for_the_test_project():
    messages = run_checks(include_deployment_checks=False, databases=["default"])
    assert [m for m in messages if m.id and m.id.startswith("django_tasks_plus")] == []


def test_check_app_not_installed():
    backend = task_backends["default"]
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"]):
        ids = [message.id for message in backend.check()]
    assert "django_tasks_plus.E001" in ids


def test_check_unknown_database_alias():
    tasks_setting = {
        "default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"DATABASE": "other"}}
    }
    with override_settings(TASKS=tasks_setting):
        messages = task_backends["default"].check()
    assert [m.id for m in messages] == ["django_tasks_plus.E002"]
    assert "'other', which is not in DATABASES" in messages[0].msg


def test_unsupported_database_vendor():
    with pytest.raises(UnsupportedDatabase, match="does not support the 'oracle' database"):
        dialect_for(SimpleNamespace(vendor="oracle"))
