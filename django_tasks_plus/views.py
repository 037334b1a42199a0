"""Views served by ``django_tasks_plus.urls``: the Prometheus metrics endpoint.

Who may read it: a bearer token from a backend's ``OPTIONS["METRICS"]["TOKEN"]`` (that
backend's metrics only; compared in constant time), or a logged-in active staff user
with ``django_tasks_plus.view_taskrecord`` (every backend). Anyone else gets 401 with a
``WWW-Authenticate`` challenge; a logged-in user without that access gets 403.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

VIEW_PERMISSION = "django_tasks_plus.view_taskrecord"
_CHALLENGE = 'Bearer realm="django-tasks-plus metrics"'


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _unauthorized(message: str, *, invalid: bool = False) -> HttpResponse:
    response = HttpResponse(message, status=401, content_type="text/plain; charset=utf-8")
    response["WWW-Authenticate"] = _CHALLENGE + (', error="invalid_token"' if invalid else "")
    return response


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics of the backends the caller may read, in the Prometheus text format."""
    # Imported here: they load the models, and a project's URLconf (which imports this
    # module) must load even when the app is missing, so that its system check can say so.
    from .metrics.aggregate import enabled_targets
    from .metrics.prometheus import render

    targets = enabled_targets()
    token = _bearer(request)
    if token is not None:
        given = token.encode()
        allowed = [
            alias
            for alias, target in targets.items()
            if target.metrics.token is not None
            and hmac.compare_digest(given, target.metrics.token.encode())
        ]
        if not allowed:
            return _unauthorized("Invalid bearer token.\n", invalid=True)
    else:
        user = request.user
        if not user.is_authenticated:
            return _unauthorized(
                "Log in as staff with the 'view task' permission, or send "
                "'Authorization: Bearer <OPTIONS['METRICS']['TOKEN']>'.\n"
            )
        if not (user.is_active and user.is_staff and user.has_perm(VIEW_PERMISSION)):
            return HttpResponse(
                f"Reading the task metrics needs a staff account with {VIEW_PERMISSION}.\n",
                status=403,
                content_type="text/plain; charset=utf-8",
            )
        allowed = list(targets)
    return HttpResponse(render(allowed), content_type=CONTENT_TYPE_LATEST)
