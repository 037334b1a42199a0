"""``signalbatch.send_each``: a batch's signals reach every receiver exactly as
``Signal.send`` per value delivers them (order, arguments, sender filtering, weak
references, async receivers, exceptions), with the receivers resolved once."""

from __future__ import annotations

import pytest
from django.dispatch import Signal

from django_tasks_plus import enqueue_many
from django_tasks_plus.compat import task_enqueued
from django_tasks_plus.signalbatch import send_each
from tests import tasks


class Sender:
    pass


class Other:
    pass


def _deliveries(signal: Signal, deliver) -> list[tuple[str, object, object]]:  # type: ignore[no-untyped-def]
    """What the receivers connected below hear while ``deliver()`` runs."""
    heard: list[tuple[str, object, object]] = []

    def any_sender(signal: Signal, sender: object, value: object, **kwargs: object) -> None:
        heard.append(("any", sender, value))

    def this_sender(sender: object, value: object, **kwargs: object) -> None:
        heard.append(("this", sender, value))

    def other_sender(sender: object, value: object, **kwargs: object) -> None:
        heard.append(("other", sender, value))

    class Listener:
        def on(self, sender: object, value: object, **kwargs: object) -> None:
            heard.append(("method", sender, value))

    listener = Listener()
    signal.connect(any_sender)  # weak references, as Django connects by default
    signal.connect(this_sender, sender=Sender)
    signal.connect(other_sender, sender=Other)
    signal.connect(listener.on)
    deliver()
    return heard


def test_a_batch_reaches_the_receivers_as_one_send_per_value_does():
    values = ["a", "b", "c"]
    signal = Signal()
    by_send = _deliveries(signal, lambda: [signal.send(Sender, value=v) for v in values])
    batch_signal = Signal()
    by_batch = _deliveries(batch_signal, lambda: send_each(batch_signal, Sender, "value", values))
    assert by_batch == by_send
    assert [who for who, _, _ in by_batch[:3]] == ["any", "this", "method"]  # not "other"
    assert [value for _, _, value in by_batch] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3


def test_a_signal_with_an_async_receiver_is_sent_value_by_value():
    heard: list[object] = []

    async def async_receiver(sender: object, value: object, **kwargs: object) -> None:
        heard.append(("async", value))

    def sync_receiver(sender: object, value: object, **kwargs: object) -> None:
        heard.append(("sync", value))

    signal = Signal()
    signal.connect(async_receiver)
    signal.connect(sync_receiver)
    send_each(signal, Sender, "value", [1, 2])
    # As Signal.send runs them: the sync receivers, then the async ones, per value.
    assert heard == [("sync", 1), ("async", 1), ("sync", 2), ("async", 2)]


def test_a_raising_receiver_stops_the_batch_where_send_would():
    heard: list[object] = []

    def first(sender: object, value: object, **kwargs: object) -> None:
        heard.append(value)

    def refuses_two(sender: object, value: object, **kwargs: object) -> None:
        if value == 2:
            raise RuntimeError("receiver failed")

    signal = Signal()
    signal.connect(first)
    signal.connect(refuses_two)
    with pytest.raises(RuntimeError, match="receiver failed"):
        send_each(signal, Sender, "value", [1, 2, 3])
    assert heard == [1, 2]


def test_no_receiver_no_work():
    send_each(Signal(), Sender, "value", iter(()))  # nothing connected: nothing to resolve


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_announces_every_task_to_every_receiver_in_order():
    heard: list[tuple[str, str]] = []

    def first(task_result, **kwargs):  # type: ignore[no-untyped-def]
        heard.append(("first", task_result.id))

    def second(task_result, **kwargs):  # type: ignore[no-untyped-def]
        heard.append(("second", task_result.id))

    task_enqueued.connect(first, weak=False, dispatch_uid="test-batch-first")
    task_enqueued.connect(second, weak=False, dispatch_uid="test-batch-second")
    try:
        results = enqueue_many(tasks.add, [((n, n), {}) for n in range(100)])
    finally:
        task_enqueued.disconnect(dispatch_uid="test-batch-first")
        task_enqueued.disconnect(dispatch_uid="test-batch-second")
    assert heard == [(name, r.id) for r in results for name in ("first", "second")]
