"""The doers, where the worker and older import paths have always found them.

They are pure bookkeeping and live in ``django_tasks_plus.doers`` (``conf`` validates doer
specs with them, and settings must not import the worker); this module re-exports them so
``django_tasks_plus.worker.doers.Doer`` keeps working.
"""

from __future__ import annotations

from ..doers import *  # noqa: F403  (the re-export is the point of this module)
from ..doers import __all__ as __all__
