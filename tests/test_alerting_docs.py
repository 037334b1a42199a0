"""The alert rules in the README and docs/metrics.md and the Grafana dashboard name only
metrics the endpoint serves: read from a real scrape, not from a list kept by hand, so
renaming a metric without the docs fails here. The dashboard is also checked for what
Grafana's import needs (a schema version, a Prometheus data source variable that every
query uses, panels on the 24-column grid)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from django_tasks_plus.circuits import force_open
from tests import tasks

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
METRICS_PAGE = REPO / "docs" / "metrics.md"
DASHBOARD = REPO / "docs" / "grafana" / "django-tasks-plus.json"

NAME = re.compile(r"\bdjango_tasks_plus_[a-z0-9_]+")
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
# What each type of family is queried as (the parser strips a counter's ``_total``).
SERIES_OF_TYPE = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _rules(section: str) -> list[str]:
    """The ``- alert:`` rules of the yaml blocks of a section, each as its text."""
    rules = []
    for block in YAML_BLOCK.findall(section):
        rules += [part for part in re.split(r"^\s*- alert:", block, flags=re.MULTILINE)[1:]]
    return rules


def _dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def unknown_names(texts: list[str], served: set[str]) -> list[str]:
    """The metric names ``texts`` use that the endpoint does not serve."""
    return sorted({name for text in texts for name in NAME.findall(text)} - served)


@pytest.fixture
def served() -> set[str]:
    """Every series name a staff user's scrape of the real endpoint offers, after a
    task ran and a circuit opened (so that no family is empty by chance)."""
    tasks.add.enqueue(1, 2)
    force_open("api.example.com", name="http", create=True)
    user = User.objects.create_user("scraper", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_taskrecord"))
    client = Client()
    client.force_login(user)
    response = client.get("/tasks/metrics/")
    assert response.status_code == 200
    names = set()
    for family in text_string_to_metric_families(response.content.decode()):
        names.update(family.name + suffix for suffix in SERIES_OF_TYPE[family.type])
    return names


@pytest.mark.django_db(transaction=True)
def test_the_alert_rules_and_the_dashboard_name_only_served_metrics(served: set[str]):
    readme_rules = _rules(_section(README, "## Alerting"))
    page_rules = _rules(_section(METRICS_PAGE, "## Alerting"))
    assert len(readme_rules) == 3  # oldest runnable age, failure rate, open circuits
    assert len(page_rules) >= 3
    for rule in readme_rules + page_rules:
        assert "expr:" in rule and NAME.search(rule), rule
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _dashboard_queries(dashboard)
    assert len(queries) >= 10

    assert unknown_names(readme_rules + page_rules + queries, served) == []
    # The gauges an operator alerts on are among them.
    used = {name for text in readme_rules + queries for name in NAME.findall(text)}
    for name in (
        "django_tasks_plus_oldest_ready_age_seconds",
        "django_tasks_plus_attempt_failed_total",
        "django_tasks_plus_breaker_circuits",
        "django_tasks_plus_breaker_state",
        "django_tasks_plus_breaker_held_tasks",
    ):
        assert name in used


@pytest.mark.django_db(transaction=True)
def test_a_renamed_or_misspelt_metric_is_found(served: set[str]):
    rules = [
        "expr: rate(django_tasks_plus_succeeded_total[5m]) > 1",
        "expr: django_tasks_plus_breaker_open > 0",  # the gauge is breaker_state
        "expr: rate(django_tasks_plus_succeeded[5m])",  # a counter is queried with _total
    ]
    assert unknown_names(rules, served) == [
        "django_tasks_plus_breaker_open",
        "django_tasks_plus_succeeded",
    ]


def test_the_dashboard_imports_into_grafana_with_a_data_source_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["id"] is None and dashboard["uid"] and dashboard["title"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source and target["refId"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    for name in ("backend", "queue"):
        assert variables[name]["datasource"] == source
    # Every query filters by the backend variable, so the selection means something.
    for query in _dashboard_queries(dashboard)[: -len(["backend", "queue"])]:
        assert '$backend"' in query, query
