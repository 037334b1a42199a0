"""A paginator that does not count a million rows on every page load.

Django's paginator runs ``SELECT COUNT(*)`` over the filtered list to number the pages;
on PostgreSQL that reads every matching row (or index entry) each time. Here the
planner's estimate comes first (one ``EXPLAIN``, no rows read): when it says the list is
large, the estimate is used and shown as "about N"; when it says the list is small, the
exact count is cheap and is used. Where no estimate is available (SQLite), the count is
exact, as in Django.
"""

from __future__ import annotations

from functools import cached_property

from django.core.paginator import Paginator
from django.db.models import QuerySet

from .queries import planner_estimate

# Above this many rows (by the planner's estimate) the count is estimated, not counted.
ESTIMATE_ABOVE = 10_000


class EstimatedCountPaginator(Paginator):
    estimated = False

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        estimate = planner_estimate(object_list) if isinstance(object_list, QuerySet) else None
        if estimate is not None and estimate > ESTIMATE_ABOVE:
            self.estimated = True
            return estimate
        return super().count
