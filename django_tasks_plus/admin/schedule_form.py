"""The form that creates and edits a runtime schedule in the admin.

It checks what ``schedules.api`` checks (a valid cron string or interval, a known time
zone and task path, known policies), so a bad entry is a form error naming the field and
nothing is written; saving goes through the API (``ScheduleRecordAdmin.save_model``), as
every other writer of the table does. Schedules from code and settings are not edited
here: their page is read-only.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from ..models import ScheduleRecord
from ..schedules import InvalidSchedule
from ..schedules.declared import RUNTIME, Definition, default_timezone, validated
from ..schedules.store import DEFINITION_FIELDS
from ..schedules.timing import CATCH_UP_POLICIES, OVERLAP_POLICIES, Cron, Every, Spec, as_spec
from .filters import configured_backends

EDITABLE_FIELDS = (
    "name",
    *(field for field in DEFINITION_FIELDS if field not in ("source", "enabled")),
    "paused",
)
"""The fields an operator sets; the rest (next occurrence, last run) is the scheduler's."""

FIXED_ON_CHANGE = ("name", "backend_name")
"""A schedule's identity: its history hangs on it."""


class ScheduleForm(forms.ModelForm):
    catch_up = forms.ChoiceField(choices=[(p, p) for p in CATCH_UP_POLICIES], initial="latest")
    overlap = forms.ChoiceField(choices=[(p, p) for p in OVERLAP_POLICIES], initial="allow")

    class Meta:
        model = ScheduleRecord
        fields = EDITABLE_FIELDS
        help_texts = {
            "cron": _("A cron expression (five fields, or six with seconds last); or:"),
            "every_seconds": _("an interval in seconds, anchored at the Unix epoch."),
            "task_path": _("The task's dotted path, e.g. myapp.tasks.send_digest."),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "backend_name" in self.fields:
            aliases = sorted(configured_backends())
            self.fields["backend_name"] = forms.ChoiceField(
                label=_("backend"), choices=[(a, a) for a in aliases]
            )
        if "timezone" in self.fields and not self.instance.pk:
            self.fields["timezone"].initial = default_timezone()
        self.spec: Spec | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        cron, every = (data.get("cron") or "").strip(), data.get("every_seconds")
        if bool(cron) == bool(every):
            raise ValidationError(
                _("Give either a cron expression or an interval in seconds (not both).")
            )
        name = data.get("name") or self.instance.name
        try:
            self.spec = as_spec(cron or Every(seconds=int(every or 0)), name)
            validated(
                Definition(
                    name=name,
                    backend=data.get("backend_name") or self.instance.backend_name,
                    task_path=data["task_path"],
                    spec=self.spec,
                    timezone=data["timezone"],
                    args=tuple(data.get("args") or ()),
                    kwargs=data.get("kwargs") or {},
                    queue=data.get("queue_name") or None,
                    priority=data["priority"],
                    catch_up=data["catch_up"],
                    catch_up_cap=data["catch_up_cap"],
                    overlap=data["overlap"],
                    source=RUNTIME,
                )
            )
        except InvalidSchedule as exc:
            raise ValidationError(str(exc)) from exc
        if not isinstance(data.get("args") or [], list):
            raise ValidationError({"args": _("A JSON list, e.g. [1, 2].")})
        return data

    def api_options(self) -> dict[str, Any]:
        """The validated fields as ``schedules.api`` keywords (create and update)."""
        data = self.cleaned_data
        return {
            "task": data["task_path"],
            "when": self.spec if isinstance(self.spec, Every | Cron) else None,
            "args": list(data.get("args") or []),
            "kwargs": dict(data.get("kwargs") or {}),
            "queue": data.get("queue_name") or None,
            "priority": data["priority"],
            "timezone_name": data["timezone"],
            "catch_up": data["catch_up"],
            "catch_up_cap": data["catch_up_cap"],
            "overlap": data["overlap"],
        }
