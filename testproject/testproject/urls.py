from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    # The Prometheus endpoint at /tasks/metrics/ (docs/metrics.md).
    path("tasks/", include("django_tasks_plus.urls")),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
