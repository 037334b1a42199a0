"""URLs of django-tasks-plus; include them in the project's, e.g.
``path("tasks/", include("django_tasks_plus.urls"))``: ``tasks/metrics/`` then serves the
Prometheus endpoint (docs/metrics.md)."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "django_tasks_plus"

urlpatterns = [
    path("metrics/", views.metrics, name="metrics"),
]
