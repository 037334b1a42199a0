"""One Django signal sent once per value of a batch, its receivers resolved once.

``enqueue_many()`` owes Django's ``task_enqueued`` to every task it wrote (Django's own
backends send it per task). ``Signal.send`` works out the live receivers on every call,
under the signal's lock, because the framework's signals do not cache them: 1.2 µs of the
1.5 µs a send cost per task in a 20,000-task batch with Django's one logging receiver,
about 7 % of the batch's whole time (docs/performance.md). Here they are worked out once
and each is called exactly as ``send`` calls it: same order, same arguments, exceptions
propagating.

What differs: a receiver connected or disconnected by a receiver while the batch is being
announced takes effect from the next batch, not from the next task. A signal with async
receivers, or a Django whose ``Signal`` no longer has the method relied on, is sent the
ordinary way, task by task.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.dispatch import Signal


def send_each(signal: Signal, sender: Any, name: str, values: Iterable[Any]) -> None:
    """``signal.send(sender, **{name: value})`` for each value, in order."""
    if not signal.receivers:
        return
    receivers = _sync_receivers(signal, sender)
    if receivers is None:
        for value in values:
            signal.send(sender, **{name: value})
        return
    for value in values:
        for receiver in receivers:
            receiver(signal=signal, sender=sender, **{name: value})


def _sync_receivers(signal: Signal, sender: Any) -> list[Any] | None:
    """The live receivers for ``sender`` when all are synchronous, as ``send`` finds them
    (Django 5.0+: ``_live_receivers`` returns the sync and the async ones); None when the
    batch must be sent the ordinary way."""
    live_receivers = getattr(signal, "_live_receivers", None)
    if live_receivers is None:
        return None
    found = live_receivers(sender)
    if not (isinstance(found, tuple) and len(found) == 2):
        return None
    sync_receivers, async_receivers = found
    if async_receivers:
        return None
    return sync_receivers  # a list built for this call: no copy needed
