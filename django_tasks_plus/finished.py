"""Sending Django's ``task_finished`` signal, the one way every final outcome does.

Django documents that ``task_finished`` for a failed task is sent while its exception is
being handled, so receivers find it in ``sys.exc_info()``: Django 6's own log receiver
reads it there, and the ``django-tasks`` backport's calls ``logger.exception``, which
prints ``NoneType: None`` when nothing is being handled. The worker (after an attempt)
and the backend (after cancelling a READY task) both send through here, so the two
paths cannot disagree.
"""

from __future__ import annotations

from . import compat


def send_task_finished(
    sender: type, result: compat.TaskResult, exception: BaseException | None
) -> None:
    """Send ``task_finished`` for ``result``; with ``exception`` (what ended a failed
    task) raised again around the send. A receiver's error propagates to the caller."""
    if exception is None:
        compat.task_finished.send(sender=sender, task_result=result)
        return
    try:
        raise exception
    except BaseException:
        compat.task_finished.send(sender=sender, task_result=result)
